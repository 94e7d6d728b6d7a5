//! End-to-end tests of `pipeshard-server` on the default model: the built
//! binary is started on a free loopback port and driven over HTTP with ureq
//! and with the real OpenAI Python client (`tests/python/openai_client.py`,
//! found through `PIPESHARD_TEST_PYTHONPATH`, which `./dev test` sets).

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

    /// POST an oversized body over a raw connection, reading the answer
    /// while the body is still being written: the server answers 413 after
    /// the limit and closes, and a client that only reads after writing
    /// everything sees a broken pipe instead of the answer.
    fn post_oversized(&self, path: &str, body: &str) -> (u16, String) {
        let addr = self.base.trim_start_matches("http://").to_string();
        for _ in 0..3 {
            let mut stream = TcpStream::connect(&addr).unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            let mut writer = stream.try_clone().unwrap();
            let head = format!(
                "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let body = body.to_string();
            let w = std::thread::spawn(move || {
                let _ = writer
                    .write_all(head.as_bytes())
                    .and_then(|_| writer.write_all(body.as_bytes()));
            });
            let mut resp = Vec::new();
            let mut buf = [0u8; 4096];
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 {
                    break;
                }
                resp.extend_from_slice(&buf[..n]);
            }
            let _ = w.join();
            let text = String::from_utf8_lossy(&resp).into_owned();
            if let Some(code) = text.split_whitespace().nth(1).and_then(|c| c.parse::<u16>().ok()) {
                let body = text
                    .split_once("\r\n\r\n")
                    .map(|(_, b)| b.to_string())
                    .unwrap_or_default();
                return (code, body);
            }
        }
        panic!("POST {path}: no answer to an oversized body in 3 tries");
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
        let pp = std::env::var("PIPESHARD_TEST_PYTHONPATH")
            .expect("PIPESHARD_TEST_PYTHONPATH is not set: run `./dev test`, or install the OpenAI client with `python3 -m pip install --target .tools/py \"openai>=1.40,<3\"` and export PIPESHARD_TEST_PYTHONPATH=.tools/py");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/openai_client.py");
        let mut cmd = Command::new("python3");
        cmd.arg(script).arg(&self.base).arg(mode).env("PYTHONPATH", pp);
        if let Some(k) = key {
            cmd.arg(k);
        }
        let out = cmd.output().expect("running python3");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "openai_client.py {mode} failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
    }
}

#[test]
fn native_endpoints() {
    let s = spawn(&["--metrics", "--vram-budget", "1GiB"], "native");
    let models = s.get("/v1/models");
    assert_eq!(models["object"], "list");
    assert!(models["data"][0]["id"].as_str().unwrap().ends_with(".gguf"));
    assert_eq!(s.get("/models")["data"], models["data"]);

    let props = s.get("/props");
    assert_eq!(props["total_slots"], 2);
    assert_eq!(props["default_generation_settings"]["n_ctx"], 1024);
    assert!(props["chat_template"].as_str().unwrap().contains("im_start"));

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
    // Stop strings cut the text and are reported.
    let st = s.post(
        "/completion",
        &json!({"prompt": "The capital of France is", "n_predict": 16, "temperature": 0, "stop": ["."]}),
    );
    assert_eq!(st["stop_type"], "word");
    assert!(!st["content"].as_str().unwrap().contains('.'), "{st}");

    let toks = s.post("/tokenize", &json!({"content": "Hello world"}))["tokens"].clone();
    assert!(toks.as_array().unwrap().len() >= 2);
    let back = s.post("/detokenize", &json!({"tokens": toks}));
    assert_eq!(back["content"], "Hello world");
    let pieces = s.post("/tokenize", &json!({"content": "Hello world", "with_pieces": true}));
    assert_eq!(pieces["tokens"][0]["piece"], "Hello");
    let tmpl = s.post(
        "/apply-template",
        &json!({"messages": [{"role": "user", "content": "Hi there"}]}),
    );
    let p = tmpl["prompt"].as_str().unwrap();
    assert!(
        p.contains("<|im_start|>user\nHi there<|im_end|>") && p.ends_with("<|im_start|>assistant\n"),
        "{p}"
    );

    let slots = s.get("/slots");
    assert_eq!(slots.as_array().unwrap().len(), 2);
    assert!(slots.as_array().unwrap().iter().all(|x| x["is_processing"] == false));

    let (code, metrics) = s.call("GET", "/metrics", None, None);
    assert_eq!(code, 200);
    for name in [
        "llamacpp:prompt_tokens_total",
        "llamacpp:tokens_predicted_total",
        "llamacpp:requests_processing",
        "llamacpp:n_decode_total",
        "pipeshard_vram_used_bytes",
        "pipeshard_plan_tier",
        "pipeshard_bytes_streamed_total",
    ] {
        assert!(
            metrics.contains(&format!("\n{name} ")) || metrics.starts_with(&format!("{name} ")),
            "no {name}:\n{metrics}"
        );
    }
    assert!(
        metrics.contains("\npipeshard_vram_budget_bytes 1073741824\n"),
        "{metrics}"
    );
    let predicted: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("llamacpp:tokens_predicted_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(predicted >= 16.0, "{metrics}");
}

#[test]
fn native_stream_matches_non_stream() {
    let s = spawn(&[], "nstream");
    let body =
        json!({"prompt": "Once upon a time", "n_predict": 24, "temperature": 0.9, "seed": 7, "cache_prompt": false});
    let full = s.post("/completion", &body);
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let frames = s.stream("/completion", &sb);
    assert!(frames.len() >= 2, "{frames:?}");
    let mut text = String::new();
    let mut last = Value::Null;
    for f in &frames {
        let v: Value = serde_json::from_str(f).unwrap();
        text.push_str(v["content"].as_str().unwrap());
        last = v;
    }
    assert_eq!(last["stop"], true);
    assert!(last["timings"]["predicted_n"].as_u64().unwrap() > 0);
    assert_eq!(text, full["content"].as_str().unwrap());
}

#[test]
fn openai_stream_equals_non_stream_for_same_seed() {
    let s = spawn(&[], "ostream");
    let body = json!({
        "messages": [{"role": "user", "content": "Tell me a story about a cat."}],
        "max_tokens": 32, "temperature": 1.0, "seed": 1234, "cache_prompt": false,
    });
    let full = s.post("/v1/chat/completions", &body);
    let want = full["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    sb["stream_options"] = json!({"include_usage": true});
    let frames = s.stream("/v1/chat/completions", &sb);
    assert_eq!(frames.last().map(String::as_str), Some("[DONE]"));
    let mut text = String::new();
    let mut usage = Value::Null;
    for f in &frames[..frames.len() - 1] {
        let v: Value = serde_json::from_str(f).unwrap();
        if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
            text.push_str(c);
        }
        if !v["usage"].is_null() {
            usage = v["usage"].clone();
        }
    }
    assert_eq!(text, want);
    assert_eq!(usage, full["usage"]);
    // A different seed gives a different text (the seed is honoured).
    let mut other = body.clone();
    other["seed"] = json!(99);
    let diff = s.post("/v1/chat/completions", &other);
    assert_ne!(diff["choices"][0]["message"]["content"].as_str().unwrap(), want);
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
fn embeddings_only_with_flag() {
    let plain = spawn(&[], "noembd");
    let (code, body) = plain.call("POST", "/v1/embeddings", Some(r#"{"input":"hi"}"#), None);
    assert_eq!(code, 501, "{body}");
    drop(plain);

    let s = spawn(&["--embeddings"], "embd");
    let py = s.python("embeddings", None);
    assert_eq!(py["dim"], 576);
    let native = s.post("/embedding", &json!({"content": "hello world"}));
    let v = native[0]["embedding"][0].as_array().unwrap();
    assert_eq!(v.len(), 576);
    // Chat still works next to embeddings.
    s.assert_up();
}

#[test]
fn parallel_requests_all_finish() {
    // One KV stream per slot: a sequence's cells are laid out as when it
    // runs alone. In the unified cache they interleave with the other
    // slots', which regroups the CPU's vectorised softmax sums, so a close
    // greedy choice could differ from the solo run's by rounding alone.
    let s = spawn(&["--no-kv-unified"], "parallel");
    let prompts = [
        "The sea is",
        "My favourite food is",
        "In 1492,",
        "Rust is a language that",
        "The moon",
    ];
    let t0 = Instant::now();
    let results: Vec<Value> = std::thread::scope(|sc| {
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| {
                let s = &s;
                sc.spawn(move || {
                    s.post(
                        "/completion",
                        &json!({"prompt": p, "n_predict": 40, "temperature": 0, "ignore_eos": true}),
                    )
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (p, r) in prompts.iter().zip(&results) {
        assert_eq!(r["tokens_predicted"], 40, "{p}: {r}");
        assert!(!r["content"].as_str().unwrap().is_empty());
    }
    // Both slots were used.
    let mut ids: Vec<u64> = results.iter().map(|r| r["id_slot"].as_u64().unwrap()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids, vec![0, 1], "{results:?}");
    // Each alone equals the batched result (greedy).
    let solo = s.post(
        "/completion",
        &json!({"prompt": prompts[0], "n_predict": 40, "temperature": 0, "ignore_eos": true, "cache_prompt": false}),
    );
    assert_eq!(solo["content"], results[0]["content"]);
    eprintln!("5 parallel requests in {:?}", t0.elapsed());
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
    let busy = s.get("/slots");
    assert!(
        busy.as_array().unwrap().iter().any(|x| x["is_processing"] == true),
        "{busy}"
    );
    drop(conn);
    // The slot is released long before the 1024-token slot context fills up.
    let t0 = Instant::now();
    loop {
        let slots = s.get("/slots");
        if slots.as_array().unwrap().iter().all(|x| x["is_processing"] == false) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "slot still busy after disconnect: {slots}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    s.assert_up();
}

#[test]
fn bad_requests_get_4xx_and_the_server_stays_up() {
    let s = spawn(&["--max-body-size", "1MiB"], "bad");
    let cases: Vec<(&str, &str, String, u16)> = vec![
        ("POST", "/completion", "{\"prompt\": \"x\"".into(), 400),
        ("POST", "/completion", "not json".into(), 400),
        ("POST", "/completion", "[1,2]".into(), 400),
        ("POST", "/completion", r#"{"prompt": 5}"#.into(), 400),
        ("POST", "/completion", r#"{"prompt": "x", "temperature": "hot"}"#.into(), 400),
        ("POST", "/completion", r#"{"prompt": "x", "n_predict": "many"}"#.into(), 400),
        ("POST", "/completion", r#"{"prompt": "x", "stop": 3}"#.into(), 400),
        ("POST", "/completion", r#"{"prompt": "x", "grammar": "root ::= nope"}"#.into(), 400),
        ("POST", "/completion", r#"{"prompt": [999999999]}"#.into(), 400),
        ("POST", "/completion", format!(r#"{{"prompt": "{}"}}"#, "hello ".repeat(1500)), 400),
        ("POST", "/v1/chat/completions", r#"{"messages": "hi"}"#.into(), 400),
        ("POST", "/v1/chat/completions", r#"{"messages": [{"role": "user", "content": "x"}], "n": 2}"#.into(), 400),
        (
            "POST",
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}]}"#.into(),
            400,
        ),
        ("POST", "/v1/chat/completions", r#"{"messages": [{"role":"user","content":"x"}], "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}}"#.into(), 400),
        ("POST", "/detokenize", r#"{"tokens": ["a"]}"#.into(), 400),
        ("POST", "/completion", format!(r#"{{"prompt": "{}"}}"#, "a".repeat(2 << 20)), 413),
        ("GET", "/no/such/endpoint", String::new(), 404),
    ];
    for (method, path, body, want) in cases {
        let (code, text) = if want == 413 {
            s.post_oversized(path, &body)
        } else {
            s.call(method, path, (!body.is_empty()).then_some(body.as_str()), None)
        };
        assert_eq!(code, want, "{method} {path} {}: {text}", &body[..body.len().min(80)]);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text}"));
        assert_eq!(v["error"]["code"], want, "{text}");
        assert!(
            v["error"]["message"].is_string() && v["error"]["type"].is_string(),
            "{text}"
        );
    }
    let (code, text) = s.call(
        "POST",
        "/completion",
        Some(&format!(r#"{{"prompt": "{}"}}"#, "hello ".repeat(1500))),
        None,
    );
    assert!(text.contains("exceed_context_size_error"), "{code} {text}");
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
    assert_eq!(s.call("GET", "/slots", None, None).0, 401);
    assert_eq!(s.call("POST", "/completion", Some(body), Some("sekrit")).0, 200);
    assert_eq!(s.call("GET", "/health", None, None).0, 200);
    assert_eq!(s.call("GET", "/v1/models", None, None).0, 200);
    assert_eq!(s.python("unauthorized", Some("wrong"))["status"], 401);
}

#[test]
fn llama_server_flags_and_env_vars() {
    // Environment (LLAMA_ARG_*) plus multi-letter short flags, through `pipeshard serve`.
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
            "-ctv",
            "f16",
            "-ub",
            "256",
            "-b",
            "512",
            "-to",
            "30",
            "--cont-batching",
            "--numa",
            "distribute",
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
    assert_eq!(props["default_generation_settings"]["n_ctx"], 512);
    assert_eq!(s.get("/v1/models")["data"][0]["id"], "smol");
    assert_eq!(s.call("GET", "/metrics", None, None).0, 200);
    assert_eq!(s.call("GET", "/slots", None, None).0, 501);
    // --jinja renders the GGUF's own template, which adds its default system prompt.
    let p = s.post(
        "/apply-template",
        &json!({"messages": [{"role": "user", "content": "Hi"}]}),
    );
    assert!(p["prompt"].as_str().unwrap().starts_with("<|im_start|>system\n"), "{p}");
    s.assert_up();
    let log = std::fs::read_to_string(&s.log).unwrap();
    assert!(
        log.contains("--numa is not implemented by pipeshard-server and is ignored"),
        "{log}"
    );

    // Flags that would change results are refused before anything loads.
    let out = Command::new(SERVER)
        .args(["-m", "x.gguf", "--lora", "a.gguf"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--lora is not supported"),
        "{out:?}"
    );
    let out = Command::new(SERVER).args(["--definitely-not-a-flag"]).output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("invalid argument"),
        "{out:?}"
    );
}
