//! End-to-end tests of `pipeshard-server` (llama.cpp's own server with
//! pipeshard's load hook) on the default model: the built binary is started
//! on a free loopback port and driven over HTTP with ureq and with the real
//! OpenAI Python client (`tests/python/openai_client.py`, found through
//! `PIPESHARD_TEST_PYTHONPATH`, which `./dev test` sets). Upstream's own
//! server tests run through `scripts/server-tests.sh`.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::server::{free_port, Server};
use serde_json::{json, Value};

const SERVER: &str = env!("CARGO_BIN_EXE_pipeshard-server");

fn log_path(tag: &str, port: u16) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("server-{tag}-{port}.log"))
}

fn spawn_cmd(bin: &str, pre: &[&str], args: &[&str], env: &[(&str, &str)], tag: &str) -> Server {
    let port = free_port();
    let m = common::default_model_path().display().to_string();
    let mut cmd = Command::new(bin);
    cmd.args(pre)
        .args(["-m", &m, "--host", "127.0.0.1", "--port", &port.to_string()])
        .args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("LLAMA_ARG_") || k == "LLAMA_API_KEY" {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    let mut s = Server::start(cmd, port, log_path(tag, port));
    let health = s.wait_healthy(|e| {
        if let ureq::Error::Status(code, r) = e {
            // While loading: upstream's 503 body.
            assert_eq!(code, 503);
            let v: Value = serde_json::from_str(&r.into_string().unwrap()).unwrap();
            assert_eq!(v["error"]["type"], "unavailable_error");
            assert_eq!(v["error"]["message"], "Loading model");
        }
    });
    assert_eq!(health, json!({"status": "ok"}));
    s
}

fn spawn(args: &[&str], tag: &str) -> Server {
    spawn_cmd(SERVER, &[], &[&["-np", "2", "-c", "2048"], args].concat(), &[], tag)
}

impl Server {
    /// (status, body) for any request; 4xx/5xx are answers, not errors.
    fn call(&self, method: &str, path: &str, body: Option<&str>, key: Option<&str>) -> (u16, String) {
        let mut req = ureq::request(method, &self.url(path)).timeout(Duration::from_secs(120));
        if let Some(k) = key {
            req = req.set("Authorization", &format!("Bearer {k}"));
        }
        let res = match body {
            Some(b) => req.set("Content-Type", "application/json").send_string(b),
            None => req.call(),
        };
        match res {
            Ok(r) => (r.status(), r.into_string().unwrap()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
            Err(e) => panic!("{method} {path}: {e}"),
        }
    }

    fn get(&self, path: &str) -> Value {
        let (code, body) = self.call("GET", path, None, None);
        assert_eq!(code, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
    }

    fn post(&self, path: &str, body: &Value) -> Value {
        let (code, text) = self.call("POST", path, Some(&body.to_string()), None);
        assert_eq!(code, 200, "POST {path}: {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("POST {path}: {e}: {text}"))
    }

    /// The `data:` payloads of an SSE response.
    fn stream(&self, path: &str, body: &Value) -> Vec<String> {
        let r = ureq::post(&self.url(path))
            .timeout(Duration::from_secs(120))
            .set("Content-Type", "application/json")
            .send_string(&body.to_string())
            .unwrap();
        assert_eq!(r.header("content-type"), Some("text/event-stream"));
        BufReader::new(r.into_reader())
            .lines()
            .map(Result::unwrap)
            .filter_map(|l| l.strip_prefix("data: ").map(String::from))
            .collect()
    }

    fn assert_up(&self) {
        assert_eq!(self.get("/health"), json!({"status": "ok"}));
        let v = self.post(
            "/completion",
            &json!({"prompt": "Hello", "n_predict": 2, "temperature": 0}),
        );
        assert_eq!(v["stop"], true);
    }

    fn python(&self, mode: &str, key: Option<&str>) -> Value {
        self.python_client("openai_client.py", mode, key)
    }

    /// Run `tests/python/SCRIPT BASE MODE [KEY]` and parse what it prints.
    fn python_client(&self, script: &str, mode: &str, key: Option<&str>) -> Value {
        let pp = std::env::var("PIPESHARD_TEST_PYTHONPATH")
            .expect("PIPESHARD_TEST_PYTHONPATH is not set: run `./dev test`, or install the clients with `python3 -m pip install --target .tools/py \"openai>=1.40,<3\" \"anthropic>=0.40\"` and export PIPESHARD_TEST_PYTHONPATH=.tools/py");
        let script = format!("{}/tests/python/{script}", env!("CARGO_MANIFEST_DIR"));
        let mut cmd = Command::new("python3");
        cmd.arg(&script).arg(&self.base).arg(mode).env("PYTHONPATH", pp);
        if let Some(k) = key {
            cmd.arg(k);
        }
        let out = cmd.output().expect("running python3");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{script} {mode} failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
    }
}

/// A pipeshard-server run that must fail before serving: (exit code, stderr+stdout).
fn fails(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = Command::new(SERVER);
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("LLAMA_ARG_") || k.starts_with("PIPESHARD_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn upstream_endpoints() {
    let s = spawn(&["--metrics"], "endpoints");
    let models = s.get("/v1/models");
    assert_eq!(models["object"], "list");
    assert!(
        models["data"][0]["id"].as_str().unwrap().contains("SmolLM2"),
        "{models}"
    );

    let props = s.get("/props");
    assert_eq!(props["total_slots"], 2);
    // Upstream reports each slot's share of the context.
    assert_eq!(props["default_generation_settings"]["n_ctx"], 1024);
    assert!(props["chat_template"].as_str().unwrap().contains("im_start"));
    // Without pipeshard's options, nothing of pipeshard's shows.
    assert!(props.get("pipeshard").is_none(), "{props}");

    let c = s.post(
        "/completion",
        &json!({"prompt": "The capital of France is", "n_predict": 8, "temperature": 0}),
    );
    assert!(c["content"].as_str().unwrap().contains("Paris"), "{c}");
    assert_eq!(c["stop"], true);
    assert!(c["tokens_predicted"].as_u64().unwrap() <= 8);
    for k in [
        "prompt_n",
        "prompt_ms",
        "predicted_n",
        "predicted_ms",
        "predicted_per_second",
        "cache_n",
    ] {
        assert!(c["timings"].get(k).is_some(), "timings lacks {k}: {c}");
    }
    // The same prompt again reuses the cached prefix.
    let again = s.post(
        "/completion",
        &json!({"prompt": "The capital of France is", "n_predict": 8, "temperature": 0}),
    );
    assert_eq!(again["content"], c["content"]);
    assert!(again["timings"]["cache_n"].as_u64().unwrap() > 0, "{again}");

    // Streaming gives the text the plain answer gives.
    let body =
        json!({"prompt": "Once upon a time", "n_predict": 24, "temperature": 0.9, "seed": 7, "cache_prompt": false});
    let full = s.post("/completion", &body);
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let frames = s.stream("/completion", &sb);
    assert!(frames.len() >= 2, "{frames:?}");
    let mut text = String::new();
    for f in &frames {
        let v: Value = serde_json::from_str(f).unwrap();
        text.push_str(v["content"].as_str().unwrap_or_default());
    }
    assert_eq!(text, full["content"].as_str().unwrap());

    let toks = s.post("/tokenize", &json!({"content": "Hello world"}))["tokens"].clone();
    assert!(toks.as_array().unwrap().len() >= 2);
    assert_eq!(
        s.post("/detokenize", &json!({"tokens": toks}))["content"],
        "Hello world"
    );
    let tmpl = s.post(
        "/apply-template",
        &json!({"messages": [{"role": "user", "content": "Hi there"}]}),
    );
    let p = tmpl["prompt"].as_str().unwrap();
    assert!(p.contains("<|im_start|>user\nHi there<|im_end|>"), "{p}");

    let slots = s.get("/slots");
    assert_eq!(slots.as_array().unwrap().len(), 2);

    let (code, metrics) = s.call("GET", "/metrics", None, None);
    assert_eq!(code, 200);
    for name in [
        "llamacpp:prompt_tokens_total",
        "llamacpp:tokens_predicted_total",
        "llamacpp:requests_processing",
    ] {
        assert!(metrics.contains(name), "no {name}:\n{metrics}");
    }
}

#[test]
fn openai_python_client_chat_and_stream() {
    let s = spawn(&[], "pychat");
    let chat = s.python("chat", None);
    assert!(chat["usage"]["completion_tokens"].as_u64().unwrap() > 0);
    let st = s.python("stream", None);
    assert!(st["chunks"].as_u64().unwrap() >= 3, "{st}");
    let js = s.python("json_schema", None);
    assert!(js["json"]["name"].is_string(), "{js}");
}

#[test]
fn openai_and_anthropic_sdks_with_tool_calls() {
    // A template with tool calls (upstream's copy of Qwen2.5's); the clients
    // show the model three calls before asking for one.
    let template = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/vendor/llama.cpp/models/templates/Qwen-Qwen2.5-7B-Instruct.jinja"
    );
    let s = spawn(&["--chat-template-file", template, "-c", "4096"], "sdks");
    let oai = s.python("tools", None);
    assert_eq!(oai["tool"], "get_weather", "{oai}");
    assert!(oai["arguments"]["city"].is_string(), "{oai}");
    for mode in ["messages", "stream", "count_tokens"] {
        let v = s.python_client("anthropic_client.py", mode, None);
        assert!(v["anthropic_version"].is_string(), "{v}");
    }
    let tools = s.python_client("anthropic_client.py", "tools", None);
    assert_eq!(tools["tool"], "get_weather", "{tools}");
    assert!(tools["input"]["city"].is_string(), "{tools}");
}

/// Debian's chromium (`apt-get install chromium`), or `$CHROMIUM`.
fn chromium() -> String {
    if let Ok(c) = std::env::var("CHROMIUM") {
        return c;
    }
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|name| {
            let out = Command::new("sh")
                .args(["-c", &format!("command -v {name}")])
                .output()
                .ok()?;
            let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
            (out.status.success() && !path.is_empty()).then_some(path)
        })
        .expect(
            "no Chromium for the web UI test: `apt-get install chromium` (./dev test does it as root), or set CHROMIUM",
        )
}

#[test]
fn web_ui_in_headless_chromium() {
    // Upstream's web UI, built from tools/ui at build time, at /: it loads in
    // a real browser, a message sent with Enter streams its answer in.
    let s = spawn(&[], "webui");
    let ui = s.python_client("webui_chromium.py", &chromium(), None);
    assert_eq!(ui["title"], "llama-ui", "{ui}");
    assert_eq!(ui["stream"], true, "{ui}");
    assert!(ui["chunks"].as_u64().unwrap() >= 2, "{ui}");
    assert!(!ui["answer"].as_str().unwrap().trim().is_empty(), "{ui}");
}

#[test]
fn embeddings_only_with_flag() {
    let plain = spawn(&[], "noembd");
    let (code, body) = plain.call("POST", "/v1/embeddings", Some(r#"{"input":"hi"}"#), None);
    assert_eq!(code, 501, "{body}");
    drop(plain);

    let s = spawn(&["--embeddings", "--pooling", "mean"], "embd");
    let py = s.python("embeddings", None);
    assert_eq!(py["dim"], 576);
}

#[test]
fn parallel_requests_all_finish() {
    let s = spawn(&[], "parallel");
    let prompts = [
        "The sea is",
        "My favourite food is",
        "In 1492,",
        "Rust is a language that",
    ];
    let results: Vec<Value> = std::thread::scope(|sc| {
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| {
                let s = &s;
                sc.spawn(move || {
                    s.post(
                        "/completion",
                        &json!({"prompt": p, "n_predict": 24, "temperature": 0, "ignore_eos": true}),
                    )
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (p, r) in prompts.iter().zip(&results) {
        assert_eq!(r["tokens_predicted"], 24, "{p}: {r}");
    }
    let mut ids: Vec<u64> = results.iter().map(|r| r["id_slot"].as_u64().unwrap()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids, vec![0, 1], "{results:?}");
}

#[test]
fn client_disconnect_frees_the_slot() {
    let s = spawn(&[], "disconnect");
    let addr = s.base.trim_start_matches("http://").to_string();
    let body = json!({"prompt": "Count forever:", "n_predict": 100000, "ignore_eos": true, "stream": true}).to_string();
    let mut conn = TcpStream::connect(&addr).unwrap();
    write!(
        conn,
        "POST /completion HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut buf = [0u8; 2048];
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("data: ") {
        let n = conn.read(&mut buf).unwrap();
        assert!(n > 0, "connection closed early");
        got.extend_from_slice(&buf[..n]);
    }
    drop(conn);
    let t0 = Instant::now();
    loop {
        let slots = s.get("/slots");
        if slots.as_array().unwrap().iter().all(|x| x["is_processing"] == false) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "slot still busy after disconnect: {slots}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    s.assert_up();
}

#[test]
fn bad_requests_get_upstream_errors() {
    let s = spawn(&[], "bad");
    let cases: Vec<(&str, &str, String, u16)> = vec![
        ("POST", "/completion", "{\"prompt\": \"x\"".into(), 400),
        ("POST", "/completion", r#"{"n_predict": 4}"#.into(), 400),
        (
            "POST",
            "/completion",
            r#"{"prompt": "x", "grammar": "root ::= nope"}"#.into(),
            400,
        ),
        (
            "POST",
            "/completion",
            format!(r#"{{"prompt": "{}"}}"#, "hello ".repeat(1500)),
            400,
        ),
        ("POST", "/v1/chat/completions", r#"{"messages": "hi"}"#.into(), 400),
        ("POST", "/v1/embeddings", r#"{"input": "x"}"#.into(), 501),
    ];
    for (method, path, body, want) in cases {
        let (code, text) = s.call(method, path, (!body.is_empty()).then_some(body.as_str()), None);
        assert_eq!(code, want, "{method} {path} {}: {text}", &body[..body.len().min(80)]);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text}"));
        assert_eq!(v["error"]["code"], want, "{text}");
        assert!(
            v["error"]["message"].is_string() && v["error"]["type"].is_string(),
            "{text}"
        );
    }
    let (_, text) = s.call(
        "POST",
        "/completion",
        Some(&format!(r#"{{"prompt": "{}"}}"#, "hello ".repeat(1500))),
        None,
    );
    assert!(text.contains("exceed_context_size_error"), "{text}");
    s.assert_up();
}

#[test]
fn api_key_gives_401_without_it() {
    let s = spawn(&["--api-key", "sekrit"], "apikey");
    let body = r#"{"prompt": "Hi", "n_predict": 2}"#;
    let (code, text) = s.call("POST", "/completion", Some(body), None);
    assert_eq!(code, 401, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["type"], "authentication_error");
    assert_eq!(s.call("POST", "/completion", Some(body), Some("wrong")).0, 401);
    assert_eq!(s.call("POST", "/completion", Some(body), Some("sekrit")).0, 200);
    assert_eq!(s.call("GET", "/health", None, None).0, 200);
    assert_eq!(s.python("unauthorized", Some("wrong"))["status"], 401);
}

#[test]
fn pipeshard_serve_takes_llama_server_flags_and_env_vars() {
    // LLAMA_ARG_* variables and upstream's short flags, through `pipeshard serve`.
    let s = spawn_cmd(
        env!("CARGO_BIN_EXE_pipeshard"),
        &["serve"],
        &[
            "-ngl",
            "0",
            "-fa",
            "off",
            "-ctk",
            "f16",
            "-ub",
            "256",
            "-b",
            "512",
            "-a",
            "smol",
            "--jinja",
            "--no-slots",
        ],
        &[
            ("LLAMA_ARG_N_PARALLEL", "3"),
            ("LLAMA_ARG_CTX_SIZE", "1536"),
            ("LLAMA_ARG_ENDPOINT_METRICS", "1"),
        ],
        "flags",
    );
    let props = s.get("/props");
    assert_eq!(props["total_slots"], 3);
    assert_eq!(s.get("/v1/models")["data"][0]["id"], "smol");
    assert_eq!(s.call("GET", "/metrics", None, None).0, 200);
    assert_eq!(s.call("GET", "/slots", None, None).0, 501);
    s.assert_up();
}

#[test]
fn bad_options_fail_with_a_clear_message() {
    let m = common::default_model_path().display().to_string();
    // pipeshard's own options: exit code 1 and what is wrong, before anything loads.
    for (args, env, want) in [
        (vec!["--vram-budget", "lots"], vec![], "--vram-budget"),
        (vec!["--vram-budget"], vec![], "--vram-budget"),
        (vec!["--stream-slots", "9"], vec![], "--stream-slots"),
        (vec![], vec![("PIPESHARD_STREAM_SLOTS", "many")], "--stream-slots"),
        (vec!["--hybrid-experts=-1"], vec![], "--hybrid-experts"),
        (
            vec!["--plan", "/no/such/plan.yaml"],
            vec![],
            "/no/such/plan.yaml: no such file",
        ),
    ] {
        let mut all = vec!["-m", m.as_str(), "--port", "0"];
        all.extend(&args);
        let (code, text) = fails(&all, &env);
        assert_eq!(code, 1, "{args:?}: {text}");
        assert!(text.contains(want), "{args:?}: {text}");
    }
    // Upstream's own options get upstream's parser and its message.
    let (code, text) = fails(&["--definitely-not-a-flag"], &[]);
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("--definitely-not-a-flag"), "{text}");
    // --help lists upstream's flags and pipeshard's.
    let out = Command::new(SERVER).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--ctx-size") && help.contains("--vram-budget"), "{help}");
}

#[test]
fn the_load_hook_sees_the_model_and_a_bad_plan_fails_the_load() {
    // A saved plan that keeps weights in VRAM cannot be applied without a
    // GPU backend: the hook fails the load, and the server exits 1 with why.
    let dir = common::scratch_dir("server-plan");
    let plan = dir.join("plan.yaml");
    let out = Command::new(env!("CARGO_BIN_EXE_pipeshard"))
        .args([
            "plan",
            "-m",
            &common::default_model_path().display().to_string(),
            "--vram-budget",
            "1GiB",
            "--format",
            "yaml",
            "--profile",
        ])
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/gpu-machine-profile.yaml"
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::write(&plan, &out.stdout).unwrap();
    let m = common::default_model_path().display().to_string();
    let (code, text) = fails(&["-m", &m, "--port", "0", "--plan", &plan.display().to_string()], &[]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("no GPU backend is loaded"), "{text}");

    // A budget without a GPU: the hook plans nothing and says so; the
    // server is upstream's.
    let s = spawn(&["--vram-budget", "1GiB", "--metrics"], "budget-cpu");
    s.assert_up();
    let log = std::fs::read_to_string(&s.log).unwrap();
    assert!(
        log.contains("no GPU backend is loaded, so everything runs on the CPU"),
        "{log}"
    );
    // pipeshard's metrics beside upstream's: the budget, and a counter of
    // the weight bytes streamed to a GPU (none here, after real work).
    let done = s.post("/completion", &json!({"prompt": "Hello", "n_predict": 4}));
    assert!(done["content"].is_string(), "{done}");
    let (code, metrics) = s.call("GET", "/metrics", None, None);
    assert_eq!(code, 200);
    assert!(metrics.contains("llamacpp:prompt_tokens_total"), "{metrics}");
    assert!(
        metrics.contains(&format!("pipeshard_vram_budget_bytes {}", 1u64 << 30)),
        "{metrics}"
    );
    assert!(
        metrics.contains("# TYPE pipeshard_bytes_streamed_total counter\npipeshard_bytes_streamed_total 0\n"),
        "{metrics}"
    );
}
