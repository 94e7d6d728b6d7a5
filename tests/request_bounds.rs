//! Hostile requests to `pipeshard-server` on the default model (issue 17's
//! request rows): grammars that overflow upstream's stack, grow its memory
//! without bound, take exponential time, or can never match; `id_slot`
//! values that do not name a slot. Each is a 400 that names the problem
//! (patch 0009), `/health` keeps answering while they are handled, and the
//! server still generates afterwards. The media rows (FIFO, a 2 GiB file, a
//! corrupt image, no projector) need a projector and are in `tests/vlm.rs`.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::server::{free_port, Server};
use serde_json::{json, Value};

const SERVER: &str = env!("CARGO_BIN_EXE_pipeshard-server");

fn spawn(tag: &str) -> Server {
    let port = free_port();
    let m = common::default_model_path().display().to_string();
    let mut cmd = Command::new(SERVER);
    cmd.args(["-m", &m, "--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["-np", "2", "-c", "2048", "-t", "2"]);
    for (k, _) in std::env::vars() {
        if k.starts_with("LLAMA_ARG_") || k == "LLAMA_API_KEY" {
            cmd.env_remove(k);
        }
    }
    let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("request-bounds-{tag}-{port}.log"));
    let mut s = Server::start(cmd, port, log);
    s.wait_healthy(|_| {});
    s
}

/// (status, parsed body) of a POST; a request that is not answered within
/// `secs` panics, so a hang fails the test instead of stalling it.
fn post(s: &Server, path: &str, body: &Value, secs: u64) -> (u16, Value) {
    post_raw(s, path, &body.to_string(), secs)
}

fn post_raw(s: &Server, path: &str, body: &str, secs: u64) -> (u16, Value) {
    let res = ureq::post(&s.url(path))
        .timeout(Duration::from_secs(secs))
        .set("Content-Type", "application/json")
        .send_string(body);
    let (code, text) = match res {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(c, r)) => (c, r.into_string().unwrap_or_default()),
        Err(e) => panic!("POST {path} {}: no answer: {e}", shorten(body)),
    };
    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (code, v)
}

fn shorten(s: &str) -> String {
    s.chars().take(120).collect()
}

fn message(v: &Value) -> String {
    v["error"]["message"].as_str().unwrap_or_default().to_string()
}

/// The server is alive and still generates.
fn assert_up(s: &mut Server) {
    assert!(s.child.try_wait().unwrap().is_none(), "server exited");
    let r = ureq::get(&s.url("/health"))
        .timeout(Duration::from_secs(5))
        .call()
        .unwrap();
    assert_eq!(r.status(), 200);
    let (code, v) = post(
        s,
        "/completion",
        &json!({"prompt": "Hello", "n_predict": 2, "temperature": 0}),
        60,
    );
    assert_eq!(code, 200, "{v}");
}

fn completion_with_grammar(s: &Server, grammar: &str) -> (u16, Value) {
    post(
        s,
        "/completion",
        &json!({"prompt": "Hi", "n_predict": 4, "grammar": grammar}),
        60,
    )
}

fn deep_grammar(depth: usize) -> String {
    format!("root ::= {}\"a\"{}", "(".repeat(depth), ")".repeat(depth))
}

#[test]
fn hostile_grammars_are_400s_that_name_the_problem() {
    let mut s = spawn("grammar");
    // (grammar, what the message must say)
    let chain: String =
        (0..2000).map(|i| format!("r{i} ::= r{}\n", i + 1)).collect::<String>() + "r2000 ::= \"a\"\nroot ::= r0\n";
    let doubling: String = (0..40)
        .map(|i| format!("r{i} ::= r{0} | r{0} \"b\"\n", i + 1))
        .collect::<String>()
        + "r40 ::= \"a\"\nroot ::= r0\n";
    let cases: Vec<(String, &str)> = vec![
        // ~10 KB, 5,000 groups deep (the issue's row), and 200,000 deep,
        // where upstream's parser overflows the main thread's stack
        (deep_grammar(5000), "nested deeper than 256"),
        (deep_grammar(200_000), "nested deeper than 256"),
        // grammars that can never match: accepted, then a 500 from the sampler
        (r#"root ::= "\u0000""#.to_string(), "null character"),
        ("root ::= <[999999999]>".to_string(), "not in the vocabulary"),
        (
            r"root ::= [\U0010FFFF-\U00000000]".to_string(),
            "invalid character range",
        ),
        (r"root ::= [\U7FFFFFFF]".to_string(), "code point out of range"),
        // min > max: rules generated without end, memory without bound
        (r#"root ::= "a"{5,2}"#.to_string(), "exceeds the maximum"),
        // 2,000 elements repeated 1,000 times
        (
            format!("root ::= \"{}\"{{1000}}", "a".repeat(2000)),
            "grammar is too large",
        ),
        // 2,000 rules, each starting with the next
        (chain, "nest deeper than 1024"),
        // leftmost alternatives that double at every level: 2^40 parse
        // stacks (and 2^40 paths for the left-recursion check before it
        // remembered the rules it had cleared)
        (doubling, "too ambiguous"),
    ];
    for (g, want) in &cases {
        let t0 = Instant::now();
        let (code, v) = completion_with_grammar(&s, g);
        assert_eq!(code, 400, "{}: {v}", shorten(g));
        assert!(message(&v).contains(want), "{}: {v}", shorten(g));
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{}: {:?}",
            shorten(g),
            t0.elapsed()
        );
    }
    // The OpenAI route validates the same way.
    let (code, v) = post(
        &s,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "grammar": deep_grammar(5000)}),
        60,
    );
    assert_eq!(code, 400, "{v}");
    assert!(message(&v).contains("nested deeper"), "{v}");

    // A grammar that parses but allows no token (a NUL is never generated):
    // the request ends with an error, the server goes on.
    let (code, v) = completion_with_grammar(&s, r"root ::= [\x00]");
    assert_eq!(code, 400, "{v}");
    assert!(message(&v).contains("allows no token"), "{v}");

    // A JSON schema nested deeper than the converter allows; at 20,000
    // levels upstream's recursive conversion overflows the stack.
    for depth in [300, 20_000] {
        let body = format!(
            r#"{{"prompt": "Hi", "n_predict": 2, "json_schema": {}{{"type": "string"}}{}}}"#,
            r#"{"type": "array", "items": "#.repeat(depth),
            "}".repeat(depth)
        );
        let (code, v) = post_raw(&s, "/completion", &body, 60);
        assert_eq!(code, 400, "{v}");
        assert!(message(&v).contains("nested deeper than 256"), "{v}");
    }

    // A valid grammar still constrains the output.
    let (code, v) = completion_with_grammar(&s, r#"root ::= "yes" | "no""#);
    assert_eq!(code, 200, "{v}");
    let content = v["content"].as_str().unwrap();
    assert!(content == "yes" || content == "no", "{v}");
    assert_up(&mut s);
}

#[test]
fn health_answers_while_hostile_grammars_are_handled() {
    let mut s = spawn("health");
    let done = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let url = s.url("/completion");
            let done = done.clone();
            std::thread::spawn(move || {
                // ~2 MB of nesting per request, over and over.
                let body = json!({"prompt": "Hi", "n_predict": 2, "grammar": deep_grammar(1_000_000)}).to_string();
                let mut n = 0;
                while !done.load(Ordering::Relaxed) {
                    let res = ureq::post(&url)
                        .timeout(Duration::from_secs(60))
                        .set("Content-Type", "application/json")
                        .send_string(&body);
                    match res {
                        Err(ureq::Error::Status(400, _)) => n += 1,
                        other => panic!("deep grammar: {other:?}"),
                    }
                }
                n
            })
        })
        .collect();
    let t0 = Instant::now();
    let mut worst = Duration::ZERO;
    while t0.elapsed() < Duration::from_secs(5) {
        let t = Instant::now();
        let r = ureq::get(&s.url("/health")).timeout(Duration::from_secs(2)).call();
        assert!(matches!(&r, Ok(r) if r.status() == 200), "{r:?}");
        worst = worst.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(50));
    }
    done.store(true, Ordering::Relaxed);
    let handled: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    eprintln!("{handled} deep grammars refused; slowest /health {worst:?}");
    assert!(handled >= 4, "{handled}");
    assert_up(&mut s);
}

#[test]
fn invalid_id_slot_is_a_400() {
    let mut s = spawn("id-slot");
    for bad in [json!(2), json!(1000), json!(-2), json!("0"), json!(0.5), json!([0])] {
        let body = json!({"prompt": "Hi", "n_predict": 2, "id_slot": bad});
        let (code, v) = post(&s, "/completion", &body, 30);
        assert_eq!(code, 400, "id_slot {bad}: {v}");
        assert!(message(&v).contains("id_slot"), "{v}");
        let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "id_slot": bad});
        let (code, v) = post(&s, "/v1/chat/completions", &body, 30);
        assert_eq!(code, 400, "id_slot {bad}: {v}");
    }
    for good in [json!(-1), json!(0), json!(1), Value::Null] {
        let body = json!({"prompt": "Hi", "n_predict": 2, "id_slot": good});
        let (code, v) = post(&s, "/completion", &body, 60);
        assert_eq!(code, 200, "id_slot {good}: {v}");
    }
    assert_up(&mut s);
}

/// `/detokenize` with an id outside the vocabulary is the client's error, a
/// 400 (upstream: 500 from a caught `vector::_M_range_check`; found by the
/// HTTP fuzzer, seed 10001 case 3201); valid ids still detokenize.
#[test]
fn detokenize_refuses_ids_outside_the_vocabulary() {
    let mut s = spawn("detokenize");
    for bad in [2147483647i64, 49152, -1] {
        let (code, v) = post(&s, "/detokenize", &json!({"tokens": [1, bad]}), 30);
        assert_eq!(code, 400, "token {bad}: {v}");
        assert!(message(&v).contains("out of the vocabulary"), "{v}");
    }
    let (code, v) = post(&s, "/tokenize", &json!({"content": "Hello world"}), 30);
    assert_eq!(code, 200, "{v}");
    let (code, v) = post(&s, "/detokenize", &json!({"tokens": v["tokens"]}), 30);
    assert_eq!((code, v["content"].as_str()), (200, Some("Hello world")), "{v}");
    assert_up(&mut s);
}

/// Malformed chat fields are the client's errors, 400s that say what is
/// wrong (upstream: 500 "server_error"; found by the HTTP fuzzer, seed
/// 10001; patch 0022), and a valid chat still answers.
#[test]
fn malformed_chat_fields_are_400s() {
    let mut s = spawn("chat-fields");
    let user = json!([{"role": "user", "content": "Hi"}]);
    let cases = [
        (
            "/v1/chat/completions",
            json!({"messages": user, "max_tokens": 2, "reasoning_format": "bogus"}),
            "reasoning format",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user, "max_tokens": 2, "tools": {"type": "function"}}),
            "tools",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": [{"type": "text"}]}], "max_tokens": 2}),
            "messages",
        ),
        (
            "/v1/messages",
            json!({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "text"}]}]}),
            "messages",
        ),
        ("/v1/messages", json!({"model": "m", "max_tokens": 2}), "messages"),
    ];
    for (path, body, says) in cases {
        let (code, v) = post(&s, path, &body, 30);
        assert_eq!(code, 400, "{path} {body}: {v}");
        assert!(message(&v).to_lowercase().contains(says), "{path} {body}: {v}");
    }
    let (code, v) = post(
        &s,
        "/v1/chat/completions",
        &json!({"messages": user, "max_tokens": 2}),
        60,
    );
    assert_eq!(code, 200, "{v}");
    assert_up(&mut s);
}
