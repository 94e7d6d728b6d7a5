//! Model files that disagree with llama.cpp's limits or with themselves fail
//! cleanly (exit code 1, a message naming the key), and a bounded slice of
//! the GGUF fuzzer finds no crash or hang.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use pipeshard::gguf::{self, GgmlType, GgufArray, GgufFile, GgufValue, GgufWriter};
use pipeshard_devtools::fuzz::mutate::RawGguf;
use pipeshard_devtools::fuzz::FuzzReport;
use pipeshard_devtools::synth::{presets, tokenizer, Quant};

fn pipeshard(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pipeshard"))
        .args(args)
        .output()
        .expect("spawning pipeshard")
}

/// `pipeshard run` on `model` for one token, as the fuzzer loads its cases.
fn run_one_token(model: &Path) -> Output {
    pipeshard(&[
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "Hello",
        "-n",
        "1",
        "-c",
        "128",
        "-t",
        "2",
        "--quiet",
    ])
}

/// Exit code 1 (not a signal, not a panic) with an error, naming
/// `needles` (in pipeshard's error line, or in llama.cpp's reason logged
/// before it).
fn assert_clean_failure(out: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "status {:?}, stderr:\n{stderr}", out.status);
    assert!(
        stderr.lines().any(|l| l.starts_with("error:")),
        "no error line:\n{stderr}"
    );
    for n in needles {
        assert!(stderr.contains(n), "expected {n:?} in the error:\n{stderr}");
    }
    assert!(!stderr.contains("panicked"), "panicked:\n{stderr}");
}

/// A tiny synth preset (q4_0), written once per test into `dir`.
fn seed(dir: &Path, preset: &str) -> RawGguf {
    let path = common::synth_tiny_model(dir, preset, Quant::Q4_0);
    RawGguf::open(&path).unwrap()
}

/// Writes `raw` after `edit` as `dir/name.gguf`.
fn write_case(dir: &Path, name: &str, raw: &RawGguf, edit: impl FnOnce(&mut RawGguf)) -> PathBuf {
    let mut raw = raw.clone();
    edit(&mut raw);
    let path = dir.join(format!("{name}.gguf"));
    let mut bytes = raw.header_bytes();
    bytes.extend_from_slice(&raw.data);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// A model file that made llama.cpp abort (exit 134) after passing
/// pipeshard's checks, and what the clean error names.
struct Abort {
    file: PathBuf,
    needles: &'static [&'static str],
}

fn abort(
    dir: &Path,
    raw: &RawGguf,
    name: &str,
    needles: &'static [&'static str],
    edit: impl FnOnce(&mut RawGguf),
) -> Abort {
    Abort {
        file: write_case(dir, name, raw, edit),
        needles,
    }
}

/// Every file that made llama.cpp abort: the rows of the GGUF-hardening
/// issue's table, the fuzzer's findings after them, and the server's
/// findings (`expert_used_count` above `expert_count`, a per-layer
/// `expert_used_count`). Each was signal 6 in `run` or in the server.
fn earlier_aborts(dir: &Path) -> Vec<Abort> {
    let llama = seed(dir, "tiny-llama3.2-1b");
    let qwen3 = seed(dir, "tiny-qwen3-0.6b");
    let moe = seed(dir, "tiny-qwen3-30b-a3b");
    let n_layer = match moe.get("qwen3moe.block_count") {
        Some(GgufValue::U32(n)) => *n as usize,
        other => panic!("qwen3moe.block_count: {other:?}"),
    };
    let u32_key = |r: &mut RawGguf, k: &str, v: u32| r.set(k, GgufValue::U32(v));
    vec![
        abort(
            dir,
            &llama,
            "blocks",
            &["'llama.block_count' is 65536", "LLAMA_MAX_LAYERS"],
            |r| u32_key(r, "llama.block_count", 65536),
        ),
        // a MoE model with 16 experts, 4 used per token, claiming 2
        abort(
            dir,
            &moe,
            "moe-2",
            &["'qwen3moe.expert_used_count' is 4", "at most expert_count (2)"],
            |r| u32_key(r, "qwen3moe.expert_count", 2),
        ),
        // a dense model claiming 2 experts, none used
        abort(
            dir,
            &llama,
            "dense-2",
            &["'llama.expert_used_count' is 0", "with 2 experts must use at least one"],
            |r| u32_key(r, "llama.expert_count", 2),
        ),
        abort(
            dir,
            &moe,
            "moe-max",
            &["'qwen3moe.expert_count' is 4294967295", "LLAMA_MAX_EXPERTS"],
            |r| u32_key(r, "qwen3moe.expert_count", u32::MAX),
        ),
        abort(
            dir,
            &moe,
            "used-17",
            &["'qwen3moe.expert_used_count' is 17", "at most expert_count (16)"],
            |r| u32_key(r, "qwen3moe.expert_used_count", 17),
        ),
        // build_moe_ffn viewed past the experts the graph computed (layer 0's count)
        abort(
            dir,
            &moe,
            "used-per-layer",
            &[
                "'qwen3moe.expert_used_count' is [1, 1, 4, 4",
                "layer 0's count (1) in layer 2",
            ],
            |r| {
                let mut v = vec![4u32; n_layer];
                v[..2].fill(1);
                r.set("qwen3moe.expert_used_count", GgufValue::Array(GgufArray::U32(v)))
            },
        ),
        // qwen3's graph asserts head size == n_rot; llama.cpp's loader does not check it
        abort(
            dir,
            &qwen3,
            "rot",
            &["'qwen3.rope.dimension_count' is 32", "head size (64"],
            |r| u32_key(r, "qwen3.rope.dimension_count", 32),
        ),
        // K heads of another size than the tensors hold
        abort(
            dir,
            &qwen3,
            "keylen",
            &["'qwen3.attention.head_count'", "attn_q.weight"],
            |r| {
                u32_key(r, "qwen3.attention.key_length", 32);
                u32_key(r, "qwen3.attention.value_length", 32);
                u32_key(r, "qwen3.rope.dimension_count", 32);
            },
        ),
        abort(
            dir,
            &llama,
            "dup",
            &["'tokenizer.ggml.tokens'", "twice, at token 200 and token 300"],
            |r| {
                let Some(GgufValue::Array(GgufArray::String(t))) = r.get("tokenizer.ggml.tokens").cloned() else {
                    panic!("no tokens");
                };
                let mut t = t;
                t[300] = t[200].clone();
                r.set("tokenizer.ggml.tokens", GgufValue::Array(GgufArray::String(t)));
            },
        ),
        abort(
            dir,
            &qwen3,
            "scaling",
            &["'qwen3.rope.scaling.type'", "llama.cpp knows none"],
            |r| r.set("qwen3.rope.scaling.type", GgufValue::String("sideways".into())),
        ),
        // no vocabulary: llama.cpp has no tokenizer, and tokenizing aborted
        abort(dir, &qwen3, "none", &["has no vocabulary"], |r| {
            r.set("tokenizer.ggml.model", GgufValue::String("none".into()))
        }),
        // a SentencePiece vocabulary without byte tokens: byte_to_token threw
        abort(
            dir,
            &qwen3,
            "spm",
            &["'tokenizer.ggml.tokens'", "no byte token <0x00>"],
            |r| r.set("tokenizer.ggml.model", GgufValue::String("llama".into())),
        ),
        // a NaN norm epsilon: ggml's rms_norm asserts eps >= 0
        abort(
            dir,
            &qwen3,
            "eps",
            &["'qwen3.attention.layer_norm_rms_epsilon' is NaN"],
            |r| r.set("qwen3.attention.layer_norm_rms_epsilon", GgufValue::F32(f32::NAN)),
        ),
        // a quantized norm: the CPU backend's binary ops abort
        abort(
            dir,
            &qwen3,
            "norm-type",
            &["tensor 'output_norm.weight' is a one-dimensional q8_0 tensor"],
            |r| {
                let t = r.tensors.iter_mut().find(|t| t.name == b"output_norm.weight").unwrap();
                // 256 f32 (1 KiB) hold 256 q8_0 values (272 bytes)
                t.ty = GgmlType::Q8_0.id();
            },
        ),
        // a Unigram tokenizer adding a BOS whose id is out of range: llama.cpp
        // disabled the id at load, then asserted it when tokenizing (patch 0046)
        abort(
            dir,
            &llama,
            "bos",
            &["the tokenizer adds a BOS token, but 'tokenizer.ggml.bos_token_id' is missing or out of range"],
            |r| {
                r.set("tokenizer.ggml.model", GgufValue::String("t5".into()));
                r.set("tokenizer.ggml.add_bos_token", GgufValue::Bool(true));
                u32_key(r, "tokenizer.ggml.bos_token_id", 1024);
            },
        ),
    ]
}

/// Runs `cmd` to its exit, killing it after `limit` (a server that
/// loaded would serve for ever); its exit status and stderr.
fn exit_within(mut cmd: Command, limit: Duration) -> (std::process::ExitStatus, String) {
    let log = tempfile_path();
    cmd.stdout(Stdio::null()).stderr(std::fs::File::create(&log).unwrap());
    let mut child = cmd.spawn().expect("spawning the server");
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let s = child.wait().unwrap();
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("still running after {limit:?} ({s:?}); stderr:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    (status, text)
}

fn tempfile_path() -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("pipeshard-gguf-fuzz-{}-{n}.log", std::process::id()))
}

#[test]
fn earlier_aborts_fail_cleanly_in_run() {
    let dir = common::scratch_dir("hp-aborts-run");
    for a in earlier_aborts(&dir) {
        assert_clean_failure(&run_one_token(&a.file), a.needles);
    }
}

/// `pipeshard-server` start-up (without a budget, with one, and as
/// `pipeshard serve`) on each file: exit 1 with the same message, before
/// llama.cpp reads the file.
#[test]
fn earlier_aborts_fail_cleanly_in_the_server() {
    let dir = common::scratch_dir("hp-aborts-server");
    for a in earlier_aborts(&dir) {
        let m = a.file.to_str().unwrap();
        for (exe, pre, budget) in [
            (env!("CARGO_BIN_EXE_pipeshard-server"), None, None),
            (env!("CARGO_BIN_EXE_pipeshard-server"), None, Some("1GiB")),
            (env!("CARGO_BIN_EXE_pipeshard"), Some("serve"), None),
        ] {
            let port = common::server::free_port().to_string();
            let mut cmd = Command::new(exe);
            cmd.args(pre).args(["-m", m, "--port", &port, "-c", "128", "-t", "2"]);
            if let Some(b) = budget {
                cmd.args(["--vram-budget", b]);
            }
            let what = format!("{exe} {pre:?} budget {budget:?} on {m}");
            let (status, log) = exit_within(cmd, Duration::from_secs(60));
            assert_eq!(status.code(), Some(1), "{what}: status {status:?}, stderr:\n{log}");
            for n in a.needles {
                assert!(log.contains(n), "{what}: expected {n:?} in:\n{log}");
            }
            assert!(!log.contains("panicked"), "{what}: panicked:\n{log}");
        }
    }
    // the draft model and the projector are checked too, before the target loads
    let good = common::synth_tiny_model(&dir, "tiny-llama3.2-1b", Quant::Q4_0);
    let bad = &earlier_aborts(&dir)[0];
    for flag in ["-md", "--mmproj"] {
        let port = common::server::free_port().to_string();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pipeshard-server"));
        cmd.args([
            "-m",
            good.to_str().unwrap(),
            flag,
            bad.file.to_str().unwrap(),
            "--port",
            &port,
        ]);
        let (status, log) = exit_within(cmd, Duration::from_secs(60));
        assert_eq!(status.code(), Some(1), "{flag}: {status:?}, stderr:\n{log}");
        for n in bad.needles {
            assert!(log.contains(n), "{flag}: expected {n:?} in:\n{log}");
        }
    }
}

/// Every preset, full-size ones included, passes the checks: the rules are
/// not stricter than the real models they stand for (checked on the
/// header, with the data section only declared).
#[test]
fn every_preset_passes_the_hyperparameter_checks() {
    for preset in presets::all() {
        let vocab = tokenizer::build(&preset.tokenizer).unwrap();
        let mut w = GgufWriter::new();
        for (k, v) in preset.metadata().into_iter().chain(vocab.metadata()) {
            w.add_kv(k, v).unwrap();
        }
        for t in preset.tensors() {
            let ty = if t.dims.len() == 1 {
                GgmlType::F32
            } else {
                GgmlType::F16
            };
            w.add_tensor(t.name, ty, &t.dims).unwrap();
        }
        let size = w.file_size();
        let mut header = Vec::new();
        drop(w.start(&mut header).unwrap());
        let f = GgufFile::from_reader(std::io::Cursor::new(&header), size, preset.name).unwrap();
        gguf::validate(&f).unwrap_or_else(|e| panic!("{}: {e}", preset.name));
    }
    // and the default model
    let f = GgufFile::open(common::default_model_path()).unwrap();
    gguf::validate(&f).unwrap();
}

/// Run `fuzz-gguf` with `args` in a scratch dir named `name`: all `cases`
/// counted, no signal, no hang, no unclean failure, a clean exit. Returns
/// the counts for the caller's own checks.
fn fuzz_slice(name: &str, args: &[&str], cases: u64) -> pipeshard_devtools::fuzz::FuzzCounts {
    let dir = common::scratch_dir(name);
    let cases_arg = cases.to_string();
    let mut all = vec!["fuzz-gguf"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--cases", &cases_arg, "--work-dir", dir.to_str().unwrap(), "--json"]);
    let out = pipeshard(&all);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: FuzzReport = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}; stderr:\n{stderr}"));
    let c = report.counts;
    assert_eq!(c.cases, cases, "{stderr}");
    assert_eq!(
        (c.signals, c.hangs, c.other_failures),
        (0, 0, 0),
        "failures: {:#?}\n{stderr}",
        report.failures
    );
    assert!(out.status.success(), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
    c
}

/// A bounded slice of the fuzzer (fixed seed): every case through the full
/// load path, no signal, no hang, no unclean failure; and the mutations
/// reach llama.cpp (some cases load, some it rejects).
#[test]
fn fuzz_slice_has_no_crashes_or_hangs() {
    // the default model is fetched (once) like the other tests do
    let _ = common::default_model_path();
    let c = fuzz_slice(
        "fuzz-slice",
        &["--seed", "20261123", "--jobs", "2", "--timeout-s", "60"],
        800,
    );
    assert!(
        c.loaded > 20 && c.rejected_by_llama > 20 && c.rejected_by_pipeshard > 200,
        "{c:?}"
    );
}

/// A bounded slice of the fuzzer through the server's start-up
/// (`fuzz-gguf --server`): no signal, no hang, and some cases load.
#[test]
fn server_fuzz_slice_has_no_crashes_or_hangs() {
    let c = fuzz_slice(
        "fuzz-slice-server",
        &[
            "--server",
            "--seed",
            "20261128",
            "--jobs",
            "2",
            "--no-default-model",
            "--timeout-s",
            "60",
        ],
        120,
    );
    assert!(c.loaded > 5 && c.rejected_by_pipeshard > 30, "{c:?}");
}
