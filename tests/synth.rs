//! `synth` end to end: every tiny preset is written, validated against its
//! plan, loaded by llama.cpp and run; the command line fails cleanly; output
//! is deterministic in the seed.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sha2::{Digest, Sha256};

use pipeshard::engine::{Context, ContextParams, Model, ModelParams, SamplingParams};
use pipeshard::generate::{generate, GenerateRequest, StopReason};
use pipeshard::gguf::{self, GgmlType, GgufFile};
use pipeshard_devtools::synth::{self, presets, Quant, SynthError, SynthOptions};

const QUANTS: [Quant; 2] = [Quant::Q4_0, Quant::Q4_K_M];
const GEN_TOKENS: usize = 16;

fn tiny_presets() -> Vec<&'static str> {
    presets::names()
        .into_iter()
        .filter(|n| n.starts_with("tiny-"))
        .collect()
}

fn pipeshard(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pipeshard"))
        .args(args)
        .output()
        .expect("spawning pipeshard")
}

fn sha256(path: &Path) -> [u8; 32] {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    Sha256::digest(bytes).into()
}

fn write(preset: &str, quant: Quant, out: &Path, seed: u64) -> synth::SynthReport {
    let mut opts = SynthOptions::new(preset, quant, out);
    opts.seed = seed;
    opts.threads = 2;
    synth::synth(&opts, |_, _| {}).unwrap_or_else(|e| panic!("synth {preset} {quant}: {e}"))
}

type TensorList = Vec<(String, GgmlType, Vec<u64>)>;

fn sorted(mut v: TensorList) -> TensorList {
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn file_tensors(f: &GgufFile) -> TensorList {
    f.tensors()
        .iter()
        .map(|t| (t.name.clone(), t.ty, t.dims.clone()))
        .collect()
}

/// The file holds exactly the planned tensors, and its metadata describes the preset.
fn check_inspect(preset: &presets::ArchPreset, quant: Quant, path: &Path, report: &synth::SynthReport) {
    let (file, info) = gguf::inspect(path).unwrap_or_else(|e| panic!("inspect {} {quant}: {e}", preset.name));
    let planned = synth::planned_tensors(preset, quant);
    assert_eq!(
        sorted(file_tensors(&file)),
        sorted(planned.clone()),
        "{} {quant}: tensors differ from the plan",
        preset.name
    );
    let mut names: Vec<&str> = file.tensors().iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), planned.len(), "{}: duplicate tensor names", preset.name);

    assert_eq!(file.architecture(), Some(preset.arch), "{}", preset.name);
    assert_eq!(info.architecture, preset.arch);
    assert_eq!(info.n_layer, preset.n_layer, "{}", preset.name);
    assert_eq!(info.n_embd, preset.n_embd, "{}", preset.name);
    assert_eq!(info.n_vocab, Some(preset.n_vocab), "{}", preset.name);
    assert_eq!(info.n_expert, preset.n_expert, "{}", preset.name);
    assert_eq!(info.file_tensors().count(), planned.len(), "{}", preset.name);
    assert_eq!(
        file.get_u64("general.file_type"),
        Some(quant.file_type() as u64),
        "{} {quant}",
        preset.name
    );

    assert_eq!(report.model.path, path);
    assert_eq!(report.model.bytes, file.file_size(), "{} {quant}", preset.name);
    assert_eq!(
        report.model.bytes,
        std::fs::metadata(path).unwrap().len(),
        "{} {quant}: reported size is not the file size",
        preset.name
    );
    assert_eq!(report.model.n_tensors, planned.len());
    let params: u64 = planned.iter().map(|t| t.2.iter().product::<u64>()).sum();
    assert_eq!(report.model.n_params, params);
    assert!(report.mmproj.is_none());

    // The two schemes really differ: q4_k_m has K-quants, q4_0 has Q4_0 weights.
    let has = |ty: GgmlType| file.tensors().iter().any(|t| t.ty == ty);
    match quant {
        Quant::Q4_0 => assert!(has(GgmlType::Q4_0), "{}: no Q4_0 tensor at q4_0", preset.name),
        Quant::Q4_K_M => assert!(has(GgmlType::Q4_K), "{}: no Q4_K tensor at q4_k_m", preset.name),
        Quant::Q5_K_M => assert!(has(GgmlType::Q5_K), "{}: no Q5_K tensor at q5_k_m", preset.name),
        Quant::Q6_K => assert!(has(GgmlType::Q6_K), "{}: no Q6_K tensor at q6_k", preset.name),
        Quant::MXFP4 if preset.n_expert > 0 => {
            assert!(has(GgmlType::MXFP4), "{}: no MXFP4 tensor at mxfp4", preset.name)
        }
        _ => {}
    }
}

fn all_finite(logits: &[f32]) -> bool {
    logits.iter().all(|x| x.is_finite())
}

/// llama.cpp loads the model on the CPU, its logits are finite, greedy
/// decoding is deterministic and the tokenizer round-trips ASCII.
fn check_runs(preset: &presets::ArchPreset, quant: Quant, path: &Path) {
    let what = format!("{} {quant}", preset.name);
    let model = Model::load(
        path,
        ModelParams {
            n_gpu_layers: 0,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("{what}: llama.cpp cannot load it: {e}"));
    assert_eq!(model.n_layer(), preset.n_layer as i32, "{what}");
    assert_eq!(model.n_embd(), preset.n_embd as i32, "{what}");
    assert_eq!(model.n_vocab(), preset.n_vocab as i32, "{what}");

    // Tokenizer round trip (no specials added or parsed).
    for text in ["Hello, world! 123", "The quick brown fox jumps over the lazy dog."] {
        let toks = model.tokenize(text, false, false).unwrap();
        assert!(!toks.is_empty(), "{what}: no tokens for {text:?}");
        assert!(
            toks.iter().all(|&t| t >= 0 && t < model.n_vocab()),
            "{what}: token out of range in {toks:?}"
        );
        assert_eq!(
            model.detokenize(&toks, false, false).unwrap(),
            text,
            "{what}: tokenizer round trip"
        );
    }

    let mut ctx = Context::new(
        &model,
        ContextParams {
            n_ctx: 256,
            n_batch: 256,
            n_ubatch: 256,
            n_threads: Some(2),
            n_threads_batch: Some(2),
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("{what}: context: {e}"));

    let prompt = model.tokenize("Once upon a time there was", true, false).unwrap();
    ctx.decode_tokens(&prompt, 0, true).unwrap();
    let logits = ctx.logits(-1).unwrap();
    assert_eq!(logits.len(), preset.n_vocab as usize);
    assert!(all_finite(logits), "{what}: non-finite logits after the prompt");
    assert!(
        logits.iter().any(|&x| x != logits[0]),
        "{what}: all logits are equal (the weights are not random)"
    );

    let req = GenerateRequest::new(prompt.clone(), GEN_TOKENS, SamplingParams::greedy());
    let mut streamed = String::new();
    let out = generate(&mut ctx, &req, |piece| {
        streamed.push_str(piece);
        true
    })
    .unwrap_or_else(|e| panic!("{what}: generate: {e}"));
    assert!(
        all_finite(ctx.logits(-1).unwrap()),
        "{what}: non-finite logits after generation"
    );
    assert_eq!(
        out.tokens.len(),
        GEN_TOKENS,
        "{what}: stopped early ({:?})",
        out.stats.stop
    );
    assert_eq!(out.stats.stop, StopReason::Length, "{what}");
    assert_eq!(out.stats.generated_tokens, GEN_TOKENS);
    assert_eq!(out.stats.prompt_tokens, prompt.len());
    assert!(out.stats.ttft_ms > 0.0 && out.stats.ttft_ms.is_finite(), "{what}");
    assert!(out.stats.decode_tokens_per_s > 0.0, "{what}");
    assert_eq!(streamed, out.text, "{what}: streamed text differs from the result");

    // Greedy decoding is deterministic.
    let again = generate(&mut ctx, &req, |_| true).unwrap();
    assert_eq!(again.tokens, out.tokens, "{what}: greedy decoding is not deterministic");
}

/// Every tiny preset at q4_0 and q4_k_m: written, inspected, loaded and run.
#[test]
fn every_tiny_preset_writes_loads_and_generates() {
    let names = tiny_presets();
    assert!(names.len() >= 6, "expected the tiny presets, got {names:?}");
    let dir = common::scratch_dir("synth-all");
    for name in names {
        let preset = presets::by_name(name).unwrap();
        for quant in QUANTS {
            let path = dir.join(format!("{name}-{quant}.gguf"));
            let report = write(name, quant, &path, 7);
            assert!(path.is_file(), "{name} {quant}: no file");
            assert!(
                !dir.join(format!("{name}-{quant}.gguf.partial")).exists(),
                "{name} {quant}: temporary file left behind"
            );
            assert_eq!(report.preset, name);
            assert_eq!(report.quant, quant);
            check_inspect(&preset, quant, &path, &report);
            check_runs(&preset, quant, &path);
            std::fs::remove_file(&path).unwrap();
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The vision preset also writes its mmproj, a valid F16 CLIP GGUF.
/// The schemes beside q4_0 and q4_k_m, each on a tiny preset it changes:
/// written, inspected, loaded and run greedily. MXFP4 quantizes routed
/// experts only (gpt-oss's scheme), so it runs on a MoE preset.
#[test]
fn q5_k_m_q6_k_and_mxfp4_write_load_and_generate() {
    let dir = common::scratch_dir("synth-new-schemes");
    for (name, quant) in [
        ("tiny-llama3.1-8b", Quant::Q5_K_M),
        ("tiny-qwen3-8b", Quant::Q6_K),
        ("tiny-qwen3-30b-a3b", Quant::MXFP4),
    ] {
        let preset = presets::by_name(name).unwrap();
        let path = dir.join(format!("{name}-{quant}.gguf"));
        let report = write(name, quant, &path, 7);
        check_inspect(&preset, quant, &path, &report);
        check_runs(&preset, quant, &path);
    }
}

#[test]
fn vision_preset_writes_a_valid_mmproj() {
    let dir = common::scratch_dir("synth-mmproj");
    let preset = presets::by_name("tiny-qwen2.5-vl-7b").unwrap();
    let vision = preset.vision.expect("tiny-qwen2.5-vl-7b has a vision tower");
    let model_path = dir.join("vl.gguf");
    let mmproj_path = dir.join("mmproj.gguf");
    let mut opts = SynthOptions::new(preset.name, Quant::Q4_0, &model_path);
    opts.mmproj_output = Some(mmproj_path.clone());
    opts.threads = 2;
    let report = synth::synth(&opts, |_, _| {}).unwrap();

    // The language model is unaffected by the mmproj.
    let (file, _) = gguf::inspect(&model_path).unwrap();
    assert_eq!(
        sorted(file_tensors(&file)),
        sorted(synth::planned_tensors(&preset, Quant::Q4_0))
    );

    let mm = report.mmproj.as_ref().expect("an mmproj report");
    assert_eq!(mm.path, mmproj_path);
    let f = GgufFile::open(&mmproj_path).unwrap_or_else(|e| panic!("mmproj: {e}"));
    assert_eq!(mm.bytes, f.file_size());
    assert_eq!(mm.bytes, std::fs::metadata(&mmproj_path).unwrap().len());
    assert_eq!(f.architecture(), Some("clip"));
    let expected: Vec<(String, Vec<u64>)> = {
        let mut v: Vec<_> = vision.tensors().into_iter().map(|t| (t.name, t.dims)).collect();
        v.sort();
        v
    };
    let mut got: Vec<(String, Vec<u64>)> = f.tensors().iter().map(|t| (t.name.clone(), t.dims.clone())).collect();
    got.sort();
    assert_eq!(got, expected, "mmproj tensors differ from the vision preset");
    assert_eq!(mm.n_tensors, expected.len());
    for t in f.tensors() {
        let want = if t.dims.len() < 2 { GgmlType::F32 } else { GgmlType::F16 };
        assert_eq!(t.ty, want, "mmproj tensor {} is {:?}", t.name, t.ty);
    }
    // The projector's output width is the language model's hidden size.
    assert_eq!(vision.projection_dim, preset.n_embd);

    // gguf::inspect parses it too, or rejects it as "not a language model"
    // without a GGUF-level error.
    if let Err(e) = gguf::inspect(&mmproj_path) {
        assert!(
            matches!(e, gguf::InspectError::Model(_)),
            "mmproj fails GGUF validation: {e}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mmproj_for_a_text_preset_is_refused() {
    let dir = common::scratch_dir("synth-no-vision");
    let mut opts = SynthOptions::new("tiny-llama3.1-8b", Quant::Q4_0, dir.join("m.gguf"));
    opts.mmproj_output = Some(dir.join("mmproj.gguf"));
    let err = synth::synth(&opts, |_, _| {}).unwrap_err();
    assert!(matches!(err, SynthError::NoVisionTower(_)), "{err}");
    assert!(err.to_string().contains("tiny-llama3.1-8b"), "{err}");
    let err = synth::synth(
        &SynthOptions::new("no-such-model", Quant::Q4_0, dir.join("x.gguf")),
        |_, _| {},
    )
    .unwrap_err();
    assert!(matches!(err, SynthError::UnknownPreset(_)), "{err}");
    assert!(!dir.join("x.gguf").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn same_seed_same_bytes_different_seed_different_bytes() {
    let dir = common::scratch_dir("synth-seed");
    let name = "tiny-qwen3-30b-a3b";
    let a = dir.join("a.gguf");
    let b = dir.join("b.gguf");
    let c = dir.join("c.gguf");
    write(name, Quant::Q4_K_M, &a, 42);
    // A different thread count must not change the bytes either.
    let mut opts = SynthOptions::new(name, Quant::Q4_K_M, &b);
    opts.seed = 42;
    opts.threads = 1;
    synth::synth(&opts, |_, _| {}).unwrap();
    write(name, Quant::Q4_K_M, &c, 43);
    let (ha, hb, hc) = (sha256(&a), sha256(&b), sha256(&c));
    assert_eq!(ha, hb, "same seed, different bytes");
    assert_ne!(ha, hc, "different seeds, same bytes");
    // Same layout, different data.
    assert_eq!(
        std::fs::metadata(&a).unwrap().len(),
        std::fs::metadata(&c).unwrap().len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn progress_reaches_the_total() {
    let dir = common::scratch_dir("synth-progress");
    let last = std::sync::Mutex::new((0u64, 0u64));
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let mut opts = SynthOptions::new("tiny-llama3.1-8b", Quant::Q4_0, dir.join("m.gguf"));
    opts.threads = 2;
    synth::synth(&opts, |done, total| {
        let mut l = last.lock().unwrap();
        assert!(done >= l.0, "progress went backwards: {done} < {}", l.0);
        assert!(done <= total, "done {done} > total {total}");
        *l = (done, total);
        calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    })
    .unwrap();
    let (done, total) = *last.lock().unwrap();
    assert!(calls.into_inner() > 0);
    assert!(total > 0);
    assert_eq!(done, total);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Exit code 1 (not a signal, not a panic's 101) with a message naming the problem.
fn assert_clean_failure(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "status {:?}, stderr:\n{stderr}", out.status);
    assert!(stderr.contains("error:"), "no error line:\n{stderr}");
    assert!(!stderr.contains("panicked"), "panicked:\n{stderr}");
    stderr
}

#[test]
fn cli_writes_a_model() {
    let dir = common::scratch_dir("synth-cli");
    let out_path: PathBuf = dir.join("cli.gguf");
    let out = pipeshard(&[
        "synth",
        "--arch",
        "tiny-qwen3-8b",
        "--quant",
        "q4_k_m",
        "--seed",
        "3",
        "-t",
        "2",
        "-o",
        out_path.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "status {:?}:\n{stderr}", out.status);
    assert!(stderr.contains("wrote"), "{stderr}");
    let (file, _) = gguf::inspect(&out_path).unwrap();
    let preset = presets::by_name("tiny-qwen3-8b").unwrap();
    assert_eq!(
        sorted(file_tensors(&file)),
        sorted(synth::planned_tensors(&preset, Quant::Q4_K_M))
    );
    // The binary and the library write the same bytes for the same seed.
    let lib_path = dir.join("lib.gguf");
    write("tiny-qwen3-8b", Quant::Q4_K_M, &lib_path, 3);
    assert_eq!(sha256(&out_path), sha256(&lib_path));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cli_unknown_preset_lists_the_valid_names() {
    let dir = common::scratch_dir("synth-cli-bad-arch");
    let target = dir.join("x.gguf");
    let out = pipeshard(&["synth", "--arch", "tiny-gpt5", "-o", target.to_str().unwrap()]);
    let stderr = assert_clean_failure(&out);
    assert!(stderr.contains("tiny-gpt5"), "does not name the bad preset:\n{stderr}");
    for name in presets::names() {
        assert!(stderr.contains(name), "valid preset {name} not listed:\n{stderr}");
    }
    assert!(!target.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cli_bad_quant_names_the_valid_schemes() {
    let dir = common::scratch_dir("synth-cli-bad-quant");
    let target = dir.join("x.gguf");
    let out = pipeshard(&[
        "synth",
        "--arch",
        "tiny-llama3.1-8b",
        "--quant",
        "q3_k_xl",
        "-o",
        target.to_str().unwrap(),
    ]);
    let stderr = assert_clean_failure(&out);
    assert!(stderr.contains("q3_k_xl"), "does not name the bad scheme:\n{stderr}");
    for q in Quant::ALL {
        assert!(stderr.contains(q.name()), "valid scheme {q} not listed:\n{stderr}");
    }
    assert!(!target.exists());
    let _ = std::fs::remove_dir_all(&dir);
}
