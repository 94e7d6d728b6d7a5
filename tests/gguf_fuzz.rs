//! Model files that disagree with llama.cpp's limits or with themselves fail
//! cleanly (exit code 1, a message naming the key), and a bounded slice of
//! the GGUF fuzzer finds no crash or hang.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pipeshard::fuzz::mutate::RawGguf;
use pipeshard::fuzz::FuzzReport;
use pipeshard::gguf::{self, GgmlType, GgufArray, GgufFile, GgufValue, GgufWriter};
use pipeshard::synth::{presets, tokenizer, Quant};

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

/// Exit code 1 (not a signal, not a panic) with an error naming `needles`.
fn assert_clean_failure(out: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "status {:?}, stderr:\n{stderr}", out.status);
    let line = stderr
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("no error line:\n{stderr}"));
    for n in needles {
        assert!(line.contains(n), "expected {n:?} in the error:\n{line}");
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

// One test per row of the table: each of these made llama.cpp
// abort (exit 134) after passing pipeshard's checks.

#[test]
fn block_count_65536_fails_cleanly() {
    let dir = common::scratch_dir("hp-block-count");
    let raw = seed(&dir, "tiny-llama3.2-1b");
    let f = write_case(&dir, "blocks", &raw, |r| {
        r.set("llama.block_count", GgufValue::U32(65536))
    });
    assert_clean_failure(
        &run_one_token(&f),
        &["'llama.block_count' is 65536", "LLAMA_MAX_LAYERS"],
    );
}

#[test]
fn expert_count_2_fails_cleanly() {
    let dir = common::scratch_dir("hp-experts-2");
    // a MoE model with 16 experts, 4 used per token, claiming 2
    let raw = seed(&dir, "tiny-qwen3-30b-a3b");
    let f = write_case(&dir, "moe", &raw, |r| r.set("qwen3moe.expert_count", GgufValue::U32(2)));
    assert_clean_failure(
        &run_one_token(&f),
        &["'qwen3moe.expert_used_count' is 4", "at most expert_count (2)"],
    );
    // a dense model claiming 2 experts, none used
    let raw = seed(&dir, "tiny-llama3.2-1b");
    let f = write_case(&dir, "dense", &raw, |r| r.set("llama.expert_count", GgufValue::U32(2)));
    assert_clean_failure(
        &run_one_token(&f),
        &["'llama.expert_used_count' is 0", "with 2 experts must use at least one"],
    );
}

#[test]
fn expert_count_2_pow_32_minus_1_fails_cleanly() {
    let dir = common::scratch_dir("hp-experts-max");
    let raw = seed(&dir, "tiny-qwen3-30b-a3b");
    let f = write_case(&dir, "moe", &raw, |r| {
        r.set("qwen3moe.expert_count", GgufValue::U32(u32::MAX))
    });
    assert_clean_failure(
        &run_one_token(&f),
        &["'qwen3moe.expert_count' is 4294967295", "LLAMA_MAX_EXPERTS"],
    );
}

#[test]
fn head_size_unlike_rope_dimension_count_fails_cleanly() {
    let dir = common::scratch_dir("hp-rope");
    // qwen3's graph asserts head size == n_rot; llama.cpp's loader does not check it
    let raw = seed(&dir, "tiny-qwen3-0.6b");
    let f = write_case(&dir, "rot", &raw, |r| {
        r.set("qwen3.rope.dimension_count", GgufValue::U32(32))
    });
    assert_clean_failure(
        &run_one_token(&f),
        &["'qwen3.rope.dimension_count' is 32", "head size (64"],
    );
    // and K heads of another size than the tensors hold
    let f = write_case(&dir, "keylen", &raw, |r| {
        r.set("qwen3.attention.key_length", GgufValue::U32(32));
        r.set("qwen3.attention.value_length", GgufValue::U32(32));
        r.set("qwen3.rope.dimension_count", GgufValue::U32(32));
    });
    assert_clean_failure(&run_one_token(&f), &["'qwen3.attention.head_count'", "attn_q.weight"]);
}

#[test]
fn duplicate_vocabulary_strings_fail_cleanly() {
    let dir = common::scratch_dir("hp-vocab-dup");
    let raw = seed(&dir, "tiny-llama3.2-1b");
    let f = write_case(&dir, "dup", &raw, |r| {
        let Some(GgufValue::Array(GgufArray::String(t))) = r.get("tokenizer.ggml.tokens").cloned() else {
            panic!("no tokens");
        };
        let mut t = t;
        t[300] = t[200].clone();
        r.set("tokenizer.ggml.tokens", GgufValue::Array(GgufArray::String(t)));
    });
    assert_clean_failure(
        &run_one_token(&f),
        &["'tokenizer.ggml.tokens'", "twice, at token 200 and token 300"],
    );
}

// Crashes the fuzzer found after those (signal 6 before the fixes).

#[test]
fn fuzzer_findings_fail_cleanly() {
    let dir = common::scratch_dir("hp-fuzz-findings");
    let raw = seed(&dir, "tiny-qwen3-0.6b");
    // no vocabulary: llama.cpp has no tokenizer, and tokenizing aborted
    let f = write_case(&dir, "none", &raw, |r| {
        r.set("tokenizer.ggml.model", GgufValue::String("none".into()))
    });
    assert_clean_failure(&run_one_token(&f), &["has no vocabulary"]);
    // a SentencePiece vocabulary without byte tokens: byte_to_token threw
    let f = write_case(&dir, "spm", &raw, |r| {
        r.set("tokenizer.ggml.model", GgufValue::String("llama".into()))
    });
    assert_clean_failure(&run_one_token(&f), &["'tokenizer.ggml.tokens'", "no byte token <0x00>"]);
    // a NaN norm epsilon: ggml's rms_norm asserts eps >= 0
    let f = write_case(&dir, "eps", &raw, |r| {
        r.set("qwen3.attention.layer_norm_rms_epsilon", GgufValue::F32(f32::NAN))
    });
    assert_clean_failure(&run_one_token(&f), &["'qwen3.attention.layer_norm_rms_epsilon' is NaN"]);
    // a quantized norm: the CPU backend's binary ops abort
    let f = write_case(&dir, "norm-type", &raw, |r| {
        let t = r.tensors.iter_mut().find(|t| t.name == b"output_norm.weight").unwrap();
        // 256 f32 (1 KiB) hold 256 q8_0 values (272 bytes)
        t.ty = GgmlType::Q8_0.id();
    });
    assert_clean_failure(
        &run_one_token(&f),
        &["tensor 'output_norm.weight' is a one-dimensional q8_0 tensor"],
    );
}

#[test]
fn special_token_the_tokenizer_adds_but_lacks_fails_cleanly() {
    let dir = common::scratch_dir("hp-bos");
    // a Unigram tokenizer adding a BOS whose id is out of range: llama.cpp
    // disables the id at load, then asserted it when tokenizing
    let raw = seed(&dir, "tiny-llama3.2-1b");
    let f = write_case(&dir, "bos", &raw, |r| {
        r.set("tokenizer.ggml.model", GgufValue::String("t5".into()));
        r.set("tokenizer.ggml.add_bos_token", GgufValue::Bool(true));
        r.set("tokenizer.ggml.bos_token_id", GgufValue::U32(1024));
    });
    assert_clean_failure(
        &run_one_token(&f),
        &[
            "adds a BOS token",
            "'tokenizer.ggml.bos_token_id' is missing or out of range",
        ],
    );
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

/// A bounded slice of the fuzzer (fixed seed): every case through the full
/// load path, no signal, no hang, no unclean failure; and the mutations
/// reach llama.cpp (some cases load, some it rejects).
#[test]
fn fuzz_slice_has_no_crashes_or_hangs() {
    let dir = common::scratch_dir("fuzz-slice");
    // the default model is fetched (once) like the other tests do
    let _ = common::default_model_path();
    let out = pipeshard(&[
        "fuzz-gguf",
        "--seed",
        "20261123",
        "--cases",
        "800",
        "--jobs",
        "2",
        "--timeout-s",
        "60",
        "--work-dir",
        dir.to_str().unwrap(),
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: FuzzReport = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}; stderr:\n{stderr}"));
    let c = &report.counts;
    assert_eq!(c.cases, 800, "{stderr}");
    assert_eq!(
        (c.signals, c.hangs, c.other_failures),
        (0, 0, 0),
        "failures: {:#?}\n{stderr}",
        report.failures
    );
    assert!(out.status.success(), "{stderr}");
    assert!(
        c.loaded > 20 && c.rejected_by_llama > 20 && c.rejected_by_pipeshard > 200,
        "{c:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
