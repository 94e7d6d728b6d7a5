//! Upstream's sampler at temperature 0 through `pipeshard-server` on the
//! default model: patch 0029's greedy fast path against the sampler chain it
//! stands in for. A request at temperature 0 takes the fast path. The same
//! request with DRY switched on but unable to act (its allowed repeat length
//! is longer than the window it looks at) runs the whole chain, as every
//! request did before the patch. The two must give the same tokens, and the
//! same probabilities where the request asks for them (`n_probs`, before and
//! after sampling), with the logit biases (`ignore_eos`, `logit_bias`) and
//! other sampler orders.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::server::{free_port, Server};
use serde_json::{json, Value};

const SERVER: &str = env!("CARGO_BIN_EXE_pipeshard-server");

fn spawn() -> Server {
    let port = free_port();
    let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("greedy-sampling-{port}.log"));
    let m = common::default_model_path().display().to_string();
    let mut cmd = Command::new(SERVER);
    cmd.args(["-m", &m, "--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["-np", "2", "-c", "2048", "-t", "2"]);
    for (k, _) in std::env::vars() {
        if k.starts_with("LLAMA_ARG_") || k.starts_with("PIPESHARD_") {
            cmd.env_remove(k);
        }
    }
    let mut s = Server::start(cmd, port, log);
    s.wait_healthy(|_| {});
    s
}

fn complete(s: &Server, body: &Value) -> Value {
    let r = ureq::post(&s.url("/completion"))
        .timeout(Duration::from_secs(120))
        .set("Content-Type", "application/json")
        .send_string(&body.to_string());
    match r {
        Ok(r) => serde_json::from_str(&r.into_string().unwrap()).unwrap(),
        Err(ureq::Error::Status(code, r)) => {
            panic!("{body}: HTTP {code}: {}", r.into_string().unwrap_or_default())
        }
        Err(e) => panic!("{body}: {e}"),
    }
}

/// `body` with DRY on but never acting (first in the chain where the
/// request names its samplers; upstream's default chain has it): the request
/// then runs the whole chain, not the fast path.
fn whole_chain(body: &Value) -> Value {
    let mut b = body.clone();
    let o = b.as_object_mut().unwrap();
    if let Some(Value::Array(samplers)) = o.get_mut("samplers") {
        samplers.insert(0, json!("dry"));
    }
    o.insert("dry_multiplier".into(), json!(0.8));
    o.insert("dry_penalty_last_n".into(), json!(64));
    o.insert("dry_allowed_length".into(), json!(1000));
    b
}

/// What must not differ between the two paths.
fn outcome(r: &Value) -> Value {
    json!({
        "content": r["content"],
        "tokens": r["tokens"],
        "tokens_predicted": r["tokens_predicted"],
        "stop_type": r["stop_type"],
        "probs": r.get("completion_probabilities").cloned().unwrap_or(Value::Null),
    })
}

/// The request's outcome on the fast path, checked against the whole chain's.
fn same_on_both_paths(s: &Server, body: Value) -> Value {
    let fast = complete(s, &body);
    let chain = complete(s, &whole_chain(&body));
    assert_eq!(outcome(&fast), outcome(&chain), "{body}");
    assert!(
        fast["tokens"].as_array().is_some_and(|t| !t.is_empty()),
        "{body}: {fast}"
    );
    fast
}

#[test]
fn greedy_tokens_and_probabilities_are_the_chains() {
    let s = spawn();
    let prompts = [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time, in a small village,",
        "1, 2, 3, 4,",
    ];
    for p in prompts {
        let base =
            json!({"prompt": p, "n_predict": 24, "temperature": 0, "return_tokens": true, "cache_prompt": false});
        let plain = same_on_both_paths(&s, base.clone());

        // The end-of-generation tokens biased to -inf.
        let mut b = base.clone();
        b["ignore_eos"] = json!(true);
        same_on_both_paths(&s, b);

        // A user's bias: the plain answer's first token banned, another one raised.
        let first = plain["tokens"][0].as_i64().unwrap();
        let mut b = base.clone();
        b["logit_bias"] = json!([[first, false], [first + 1, 2.5], [first + 1, -0.5]]);
        let banned = same_on_both_paths(&s, b);
        assert_ne!(banned["tokens"][0], plain["tokens"][0], "{p}: {banned}");

        // Probabilities before and after sampling.
        for post in [false, true] {
            let mut b = base.clone();
            b["n_probs"] = json!(5);
            b["post_sampling_probs"] = json!(post);
            let r = same_on_both_paths(&s, b);
            let probs = r["completion_probabilities"].as_array().unwrap();
            assert_eq!(probs.len(), 24, "{p}: {r}");
            let key = if post { "top_probs" } else { "top_logprobs" };
            assert!(!probs[0][key].as_array().unwrap().is_empty(), "{p}: {r}");
            // Token for token, the sampled one is the one the plain request got.
            let ids: Vec<&Value> = probs.iter().map(|t| &t["id"]).collect();
            let plain_ids: Vec<&Value> = plain["tokens"].as_array().unwrap().iter().collect();
            assert_eq!(ids, plain_ids, "{p}: {r}");
        }

        // Other sampler orders: temperature alone (no sort), and top-k after it.
        for samplers in [json!(["temperature"]), json!(["temperature", "top_k", "min_p"])] {
            let mut b = base.clone();
            b["samplers"] = samplers;
            let r = same_on_both_paths(&s, b);
            assert_eq!(r["tokens"], plain["tokens"], "{p}: {r}");
        }
    }
}
