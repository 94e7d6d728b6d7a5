//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use std::sync::Arc;

use pipeshard::engine::argmax;
use pipeshard::engine::{buffer_types, BufferType, Context, Model, ModelParams, Token};

/// The real default model (SmolLM2-135M-Instruct), fetched once.
pub fn default_model_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| pipeshard::default_model::ensure().expect("fetching the default model"))
        .clone()
}

/// The default model, loaded on the CPU.
pub fn load_default_model() -> Model {
    pipeshard::engine::init(None).expect("llama.cpp init");
    Model::load(
        &default_model_path(),
        ModelParams {
            n_gpu_layers: 0,
            ..Default::default()
        },
    )
    .expect("loading the default model")
}

/// The CPU's plain buffer type (no repacked layout).
pub fn cpu_buffer_type() -> BufferType {
    pipeshard::engine::init(None).expect("llama.cpp init");
    buffer_types()
        .into_iter()
        .find(|b| b.name() == "CPU")
        .expect("a CPU buffer type")
}

/// The default model with every layer on the CPU and every weight in the
/// CPU's plain buffer type (none repacked, so each can be read back and
/// moved), with llama.cpp's `use_mmap` and patch 0023's `movable_weights`.
pub fn load_on_plain_cpu(use_mmap: bool, movable_weights: bool) -> Model {
    let cpu = cpu_buffer_type();
    Model::load(
        &default_model_path(),
        ModelParams {
            n_gpu_layers: 0,
            use_mmap,
            movable_weights,
            repack: false,
            placement: Some(Arc::new(move |_: &str| Some(cpu))),
            ..Default::default()
        },
    )
    .expect("loading the default model")
}

/// A scratch directory unique to one test.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pipeshard-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating a scratch dir");
    dir
}

/// A tiny random-weight model written by `synth` into `dir` (2 threads, seed 0).
pub fn synth_tiny_model(dir: &std::path::Path, preset: &str, quant: pipeshard_devtools::synth::Quant) -> PathBuf {
    let path = dir.join(format!("{preset}-{quant}.gguf"));
    let mut opts = pipeshard_devtools::synth::SynthOptions::new(preset, quant, &path);
    opts.threads = 2;
    pipeshard_devtools::synth::synth(&opts, |_, _| {}).unwrap_or_else(|e| panic!("synth {preset} {quant}: {e}"));
    path
}

/// A machine profile with CPU measurements only (no link, no GPU samples),
/// as `pipeshard profile` writes on a CPU-only machine.
pub fn cpu_only_profile() -> pipeshard::profile::MachineProfile {
    use pipeshard::profile::{Device, MachineProfile, MatmulSample, ProfileKey, ProfileMode};
    let sample = |ty: &str, tokens: i64, seconds: f64| MatmulSample {
        device: Device::Cpu,
        ty: ty.into(),
        k: 1024,
        n: 1024,
        tokens,
        experts: None,
        link_busy: false,
        seconds,
    };
    MachineProfile {
        key: ProfileKey {
            cpu: "test cpu".into(),
            gpu: None,
            threads: 2,
        },
        mode: ProfileMode::Tiny,
        measured_in_s: 0.1,
        cpu_mem_bw: 1e10,
        link: None,
        host_read_bw_with_link: None,
        gpu_memory: None,
        process_context_bytes: None,
        matmul: vec![
            sample("q4_0", 1, 1e-4),
            sample("q4_0", 16, 1e-3),
            sample("f16", 1, 4e-4),
            sample("f16", 16, 2e-3),
        ],
        attention: vec![],
    }
}

/// A small CPU context for the default model: 512 tokens, 64-token ubatches, 2 threads.
pub fn small_context_params() -> pipeshard::engine::ContextParams {
    pipeshard::engine::ContextParams {
        n_ctx: 512,
        n_batch: 64,
        n_ubatch: 64,
        n_threads: Some(2),
        ..Default::default()
    }
}
pub mod server;

/// Greedy decoding of `n` tokens, one token per decode; `between(i, ctx)`
/// runs after the i-th token is chosen and before it is decoded.
pub fn greedy(
    ctx: &mut Context<'_>,
    prompt: &[Token],
    n: usize,
    mut between: impl FnMut(usize, &mut Context<'_>),
) -> Vec<Token> {
    ctx.clear();
    ctx.decode_tokens(prompt, 0, true).unwrap();
    let mut out = Vec::new();
    for i in 0..n {
        let t = argmax(ctx.logits(-1).unwrap());
        out.push(t);
        between(i, ctx);
        ctx.decode_tokens(&[t], (prompt.len() + i) as i32, true).unwrap();
    }
    out
}

/// Six greedy tokens after a short prompt on the CPU, and the model's weight
/// bytes per buffer type (what the placement tests compare with the plain
/// load's).
#[allow(dead_code)]
pub fn greedy_by_buffer(model: &Model) -> (Vec<Token>, std::collections::BTreeMap<String, u64>) {
    let prompt = model.tokenize("the quick brown fox jumps", true, false).unwrap();
    let mut ctx = Context::new(model, small_context_params()).unwrap();
    let tokens = greedy(&mut ctx, &prompt, 6, |_, _| {});
    let by_buffer = ctx
        .memory_breakdown()
        .into_iter()
        .filter(|m| m.model > 0)
        .map(|m| (m.buffer_type, m.model))
        .collect();
    (tokens, by_buffer)
}

/// Loads `path` on the CPU, read into memory rather than mapped, with each
/// weight's buffer type from `placement`: where it gives none, llama.cpp
/// chooses (its repacked layout where it has one for the weight).
#[allow(dead_code)]
pub fn load_on_cpu(path: &std::path::Path, placement: Option<pipeshard::engine::TensorPlacement>) -> Model {
    Model::load(
        path,
        ModelParams {
            n_gpu_layers: 0,
            use_mmap: false,
            placement,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
