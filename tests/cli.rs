//! The `pipeshard` binary end to end: output, timings, and clean failures.

mod common;

use std::path::Path;
use std::process::{Command, Output};

fn pipeshard(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pipeshard"))
        .args(args)
        .output()
        .expect("spawning pipeshard")
}

fn run_model(model: &Path) -> Output {
    pipeshard(&[
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "hello",
        "-n",
        "4",
        "-t",
        "2",
    ])
}

/// Exit code 1 (not a signal, not a panic's 101) with a message naming the problem.
fn assert_clean_failure(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "status {:?}, stderr:\n{stderr}", out.status);
    assert!(stderr.contains("error:"), "no error line:\n{stderr}");
    assert!(
        stderr.to_lowercase().contains(&needle.to_lowercase()),
        "expected {needle:?} in:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "panicked:\n{stderr}");
}

#[test]
fn run_streams_text_and_reports_timings() {
    let model = common::default_model_path();
    let out = pipeshard(&[
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "The capital of France is",
        "-n",
        "12",
        "-t",
        "2",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.trim().len() > 3, "no text: {stdout:?}");
    let json_line = stderr.lines().rev().find(|l| l.starts_with('{')).expect("a JSON line");
    let v: serde_json::Value = serde_json::from_str(json_line).unwrap();
    assert!(v["load_ms"].as_f64().unwrap() > 0.0);
    assert!(v["stats"]["ttft_ms"].as_f64().unwrap() > 0.0);
    assert!(v["stats"]["prompt_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(v["stats"]["generated_tokens"].as_u64().unwrap() > 0);
    // Greedy by default: the same text twice.
    let again = pipeshard(&[
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "The capital of France is",
        "-n",
        "12",
        "-t",
        "2",
        "--quiet",
    ]);
    assert_eq!(String::from_utf8_lossy(&again.stdout), stdout);
}

#[test]
fn run_with_chat_template_and_human_readable_timings() {
    let model = common::default_model_path();
    let out = pipeshard(&[
        "run",
        "-m",
        model.to_str().unwrap(),
        "--chat",
        "-p",
        "Say hi.",
        "-n",
        "16",
        "-t",
        "2",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for key in ["load:", "TTFT", "tok/s", "decode:"] {
        assert!(stderr.contains(key), "missing {key} in {stderr}");
    }
}

#[test]
fn missing_model_file_fails_cleanly() {
    assert_clean_failure(&run_model(Path::new("/nonexistent/model.gguf")), "does not exist");
}

#[test]
fn non_gguf_file_fails_cleanly() {
    let dir = common::scratch_dir("non-gguf");
    let f = dir.join("notes.gguf");
    std::fs::write(&f, b"this is plain text, not a model\n".repeat(100)).unwrap();
    assert_clean_failure(&run_model(&f), "not a usable GGUF");
}

#[test]
fn truncated_gguf_fails_cleanly() {
    let dir = common::scratch_dir("truncated");
    let real = std::fs::read(common::default_model_path()).unwrap();
    // Cut inside the metadata, and inside the tensor data.
    for (i, cut) in [64usize, 200_000, real.len() / 2, real.len() - 1]
        .into_iter()
        .enumerate()
    {
        let f = dir.join(format!("cut{i}.gguf"));
        std::fs::write(&f, &real[..cut]).unwrap();
        assert_clean_failure(&run_model(&f), "not a usable GGUF");
    }
}

fn gguf_header(n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(n_tensors.to_le_bytes());
    b.extend(n_kv.to_le_bytes());
    b
}

fn gguf_string(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s.as_bytes());
}

#[test]
fn absurd_gguf_headers_fail_cleanly() {
    let dir = common::scratch_dir("absurd");
    // Absurd counts.
    for (name, n_tensors, n_kv) in [("tensors", u64::MAX / 3, 0), ("kv", 0, 1 << 62)] {
        let f = dir.join(format!("{name}.gguf"));
        let mut b = gguf_header(n_tensors, n_kv);
        b.extend([0u8; 64]);
        std::fs::write(&f, &b).unwrap();
        assert_clean_failure(&run_model(&f), "not a usable GGUF");
    }
    // One tensor that claims 2^40 x 2^40 floats.
    let f = dir.join("huge-tensor.gguf");
    let mut b = gguf_header(1, 1);
    gguf_string(&mut b, "general.architecture");
    b.extend(8u32.to_le_bytes());
    gguf_string(&mut b, "llama");
    gguf_string(&mut b, "token_embd.weight");
    b.extend(2u32.to_le_bytes());
    b.extend((1u64 << 40).to_le_bytes());
    b.extend((1u64 << 40).to_le_bytes());
    b.extend(0u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.resize(b.len().next_multiple_of(32) + 64, 0);
    std::fs::write(&f, &b).unwrap();
    assert_clean_failure(&run_model(&f), "not a usable GGUF");
    // An absurd string length in the metadata.
    let f = dir.join("long-key.gguf");
    let mut b = gguf_header(0, 1);
    b.extend((1u64 << 60).to_le_bytes());
    b.extend(b"abc");
    std::fs::write(&f, &b).unwrap();
    assert_clean_failure(&run_model(&f), "not a usable GGUF");
}

#[test]
fn bad_arguments_fail_cleanly() {
    let model = common::default_model_path();
    let out = pipeshard(&["run", "-m", model.to_str().unwrap(), "--flash-attn", "sideways"]);
    assert_clean_failure(&out, "flash-attn");
    let out = pipeshard(&["run", "-m", model.to_str().unwrap(), "-p", "x", "--top-p", "7"]);
    assert_clean_failure(&out, "top_p");
}

#[test]
fn run_with_a_draft_model_prints_the_same_text_and_its_speculation() {
    let model = common::default_model_path();
    let m = model.to_str().unwrap();
    let args = [
        "run",
        "-m",
        m,
        "-p",
        "The capital of France is",
        "-n",
        "16",
        "-t",
        "2",
        "--json",
    ];
    let plain = pipeshard(&args);
    assert!(plain.status.success(), "{}", String::from_utf8_lossy(&plain.stderr));
    let mut with_draft = args.to_vec();
    with_draft.extend(["-md", m, "--spec-draft-n-max", "4"]);
    let spec = pipeshard(&with_draft);
    let stderr = String::from_utf8_lossy(&spec.stderr);
    assert!(spec.status.success(), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&spec.stdout),
        String::from_utf8_lossy(&plain.stdout)
    );
    let json_line = stderr.lines().rev().find(|l| l.starts_with('{')).expect("a JSON line");
    let v: serde_json::Value = serde_json::from_str(json_line).unwrap();
    let s = &v["speculation"];
    assert!(s["steps"].as_u64().unwrap() > 0, "{s}");
    assert!(s["drafted"].as_u64().unwrap() >= s["accepted"].as_u64().unwrap());
}

#[test]
fn bad_draft_arguments_fail_cleanly() {
    let model = common::default_model_path();
    let m = model.to_str().unwrap();
    let out = pipeshard(&["run", "-m", m, "-md", m, "--spec-draft-ngl", "lots"]);
    assert_clean_failure(&out, "spec-draft-ngl");
    let out = pipeshard(&["run", "-m", m, "-p", "x", "-n", "2", "-md", "/nonexistent/draft.gguf"]);
    assert_clean_failure(&out, "draft");
    // a bad option exits 1, with clap's message
    let out = pipeshard(&[
        "plan",
        "--arch",
        "llama3.1-8b",
        "--vram-budget",
        "2GiB",
        "--draft-acceptance",
        "1.5",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("probability"));
}

/// Every tool exits 1 on a bad option, as llama-server does, with clap's
/// message (or upstream's, for llama-server's own flags); help exits 0.
#[test]
fn every_tool_exits_1_on_a_bad_option() {
    let tools = [
        "run",
        "plan",
        "profile",
        "synth",
        "bench",
        "fuzz-gguf",
        "fuzz-http",
        "lossless",
    ];
    for tool in tools {
        let out = pipeshard(&[tool, "--no-such-option"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{tool}: {stderr}");
        assert!(
            stderr.contains("unexpected argument '--no-such-option'"),
            "{tool}: {stderr}"
        );
        let out = pipeshard(&[tool, "--help"]);
        assert_eq!(out.status.code(), Some(0), "{tool} --help");
    }
    let out = pipeshard(&["--no-such-option"]);
    assert_eq!(out.status.code(), Some(1));
    let out = pipeshard(&["no-such-tool"]);
    assert_eq!(out.status.code(), Some(1));
    // a bad value of pipeshard's option, and an option neither knows
    let server = env!("CARGO_BIN_EXE_pipeshard-server");
    for (pre, bad) in [
        (None, "--stream-slots=9"),
        (None, "--no-such-option"),
        (Some("serve"), "--no-such-option"),
    ] {
        let exe = if pre.is_some() {
            env!("CARGO_BIN_EXE_pipeshard")
        } else {
            server
        };
        let out = Command::new(exe)
            .args(pre)
            .args([bad, "-m", "/nonexistent.gguf"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{pre:?} {bad}: {stderr}");
        let name = bad.split('=').next().unwrap();
        assert!(stderr.contains(name), "{pre:?} {bad}: {stderr}");
    }
}

/// `--cpu-copies` is pipeshard's option in the server too: a bad value
/// gets pipeshard's (clap's) message, not llama-server's "invalid argument".
#[test]
fn server_cpu_copies_reaches_pipeshards_parser() {
    let server = env!("CARGO_BIN_EXE_pipeshard-server");
    let out = Command::new(server).args(["--cpu-copies", "maybe"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("invalid value 'maybe' for '--cpu-copies"), "{stderr}");
    // a good value passes pipeshard's parser and upstream never sees it:
    // the server goes on to check the model file
    let out = Command::new(server)
        .args(["--cpu-copies", "false", "-m", "/nonexistent.gguf", "--port", "0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("--cpu-copies"), "{stderr}");
    assert!(stderr.contains("/nonexistent.gguf"), "{stderr}");
    let out = Command::new(server).args(["--help"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("--cpu-copies"));
}

#[test]
fn plan_with_a_draft_shows_the_verification_tier_or_drops_the_draft() {
    let dir = common::scratch_dir("cli-plan-draft");
    let draft = common::synth_tiny_model(&dir, "tiny-llama3.2-1b", pipeshard_devtools::synth::Quant::Q4_0);
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpu-machine-profile.yaml");
    let plan = |extra: &[&str]| {
        let mut args = vec![
            "plan",
            "--arch",
            "llama3.1-8b",
            "--vram-budget",
            "4GiB",
            "--profile",
            fixture.to_str().unwrap(),
            "-md",
            draft.to_str().unwrap(),
        ];
        args.extend(extra);
        let out = pipeshard(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Forced on the GPU with a sure draft: a tier of draft + 1 tokens.
    let forced = plan(&[
        "--spec-draft-ngl",
        "all",
        "--spec-draft-n-max",
        "7",
        "--draft-acceptance",
        "0.9",
    ]);
    assert!(forced.contains("tiers [1, 8, "), "{forced}");
    assert!(forced.contains("speculative decoding"), "{forced}");
    // A draft that is never right does not pay: the plan leaves it out.
    let never = plan(&["--draft-acceptance", "0"]);
    assert!(!never.contains("speculative decoding"), "{never}");
}

#[test]
fn zero_sizes_fail_cleanly_in_bench_and_plan() {
    let dir = common::scratch_dir("cli-zero-sizes");
    let model = common::synth_tiny_model(&dir, "tiny-llama3.1-8b", pipeshard_devtools::synth::Quant::Q4_K_M);
    let m = model.to_str().unwrap();
    let out_dir = dir.join("bench-out");
    let bench = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            "-m",
            m,
            "-n",
            "2",
            "-r",
            "1",
            "--vram-budget",
            "1GiB",
            "-o",
            out_dir.to_str().unwrap(),
        ];
        args.extend(extra);
        pipeshard(&args)
    };
    assert_clean_failure(&bench(&["-p", "0"]), "--n-prompt");
    assert_clean_failure(&bench(&["-p", "8", "--ubatch-size", "0"]), "--ubatch-size");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpu-machine-profile.yaml");
    let plan = pipeshard(&[
        "plan",
        "-m",
        m,
        "--vram-budget",
        "1GiB",
        "--profile",
        fixture.to_str().unwrap(),
        "--ubatch-size",
        "0",
    ]);
    assert_clean_failure(&plan, "ubatch size must be positive");
    let _ = std::fs::remove_dir_all(&dir);
}
