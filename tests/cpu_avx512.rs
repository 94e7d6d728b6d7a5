//! The GEMVs for repacked weights on AVX-512 VNNI (patches 0042: Q4_0, 0051:
//! Q6_K, 0052: Q8_0, 0054: Q4_K), which the default CPU backend module (built
//! for an explicit AVX2 level) leaves out. On a CPU with AVX-512 F/BW/VL/VNNI these
//! tests build a CPU module for those features from the same patched tree
//! (cached in the target directory), load it instead of the default one, and
//! decode a model split by rows (patch 0017), the CPU's rows once from the
//! plain weights and once from repacked copies (patch 0039), whose
//! single-token steps go through the new kernel. Where the building machine's
//! CPU lacks those features the tests are ignored, with the reason (build.rs
//! sets the cfg).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use pipeshard::engine::{argmax, buffer_types, Context, ContextParams, Model, ModelParams, RowSplitPolicy, Token};
use pipeshard_devtools::synth::Quant;

/// Whether this CPU runs the kernel: AVX-512 F, BW, VL and VNNI.
fn has_avx512_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// libggml-cpu.so for AVX-512 VNNI from the patched tree that build.rs
/// prepared, built once per source stamp (cmake from `CMAKE`, as `./dev`
/// sets it, else from PATH); the tests that run at once wait for one build.
fn avx512_cpu_module() -> PathBuf {
    static MODULE: OnceLock<PathBuf> = OnceLock::new();
    MODULE.get_or_init(build_avx512_cpu_module).clone()
}

fn build_avx512_cpu_module() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("vendor/llama.cpp");
    let stamp = std::fs::read_to_string(src.join(".pipeshard-stamp")).expect("build.rs's patched tree (build first)");
    let build = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cpu-avx512-{}", stamp.trim()));
    let module = build.join("bin/libggml-cpu.so");
    if module.is_file() {
        return module;
    }
    let cmake = std::env::var("CMAKE").unwrap_or_else(|_| "cmake".into());
    let run = |args: &[&str]| {
        let out = Command::new(&cmake)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running {cmake}: {e}"));
        assert!(
            out.status.success(),
            "{cmake} {args:?} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let (s, b) = (src.to_string_lossy(), build.to_string_lossy());
    run(&[
        "-S",
        &s,
        "-B",
        &b,
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=ON",
        "-DGGML_BACKEND_DL=ON",
        "-DGGML_NATIVE=OFF",
        "-DGGML_AVX=ON",
        "-DGGML_AVX2=ON",
        "-DGGML_FMA=ON",
        "-DGGML_F16C=ON",
        "-DGGML_BMI2=ON",
        "-DGGML_AVX512=ON",
        "-DGGML_AVX512_VNNI=ON",
        "-DGGML_CCACHE=OFF",
        "-DLLAMA_BUILD_COMMON=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_TOOLS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_SERVER=OFF",
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_OPENSSL=OFF",
    ]);
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get()).to_string();
    run(&["--build", &b, "--target", "ggml-cpu", "-j", &jobs]);
    assert!(module.is_file(), "{} was not built", module.display());
    module
}

#[test]
#[cfg_attr(
    not(pipeshard_host_avx512_vnni),
    ignore = "this CPU lacks AVX-512 F/BW/VL/VNNI, so patch 0042's kernel cannot run here"
)]
fn avx512_vnni_repacked_q4_0_decodes_as_the_plain_weights() {
    repacked_decodes_as_the_plain_weights(Quant::Q4_0);
}

#[test]
#[cfg_attr(
    not(pipeshard_host_avx512_vnni),
    ignore = "this CPU lacks AVX-512 F/BW/VL/VNNI, so patch 0051's kernel cannot run here"
)]
fn avx512_vnni_repacked_q6_k_decodes_as_the_plain_weights() {
    repacked_decodes_as_the_plain_weights(Quant::Q6_K);
}

#[test]
#[cfg_attr(
    not(pipeshard_host_avx512_vnni),
    ignore = "this CPU lacks AVX-512 F/BW/VL/VNNI, so patch 0052's kernel cannot run here"
)]
fn avx512_vnni_repacked_q8_0_decodes_as_the_plain_weights() {
    repacked_decodes_as_the_plain_weights(Quant::Q8_0);
}

#[test]
#[cfg_attr(
    not(pipeshard_host_avx512_vnni),
    ignore = "this CPU lacks AVX-512 F/BW/VL/VNNI, so patch 0054's kernel cannot run here"
)]
fn avx512_vnni_repacked_q4_k_m_decodes_as_the_plain_weights() {
    // Q4_K feed-forward weights, Q6_K in some layers' down projection
    repacked_decodes_as_the_plain_weights(Quant::Q4_K_M);
}

/// Decode a tiny model of `quant` with the CPU's rows from the plain weights
/// and from repacked copies, and compare the logits.
fn repacked_decodes_as_the_plain_weights(quant: Quant) {
    assert!(
        has_avx512_vnni(),
        "this CPU lacks AVX-512 F/BW/VL/VNNI, so the kernels cannot run here"
    );
    // Only the new module in the directory that init searches first.
    let dir = common::scratch_dir(&format!("cpu-avx512-{quant}"));
    std::fs::copy(avx512_cpu_module(), dir.join("libggml-cpu.so")).unwrap();
    pipeshard::engine::init(Some(&dir)).unwrap();
    let features = pipeshard::engine::cpu_features();
    assert!(
        features.iter().any(|(k, v)| k == "AVX512_VNNI" && v == "1"),
        "the AVX-512 module was not the one loaded: {features:?}"
    );

    let path = common::synth_tiny_model(&dir, "tiny-llama3.1-8b", quant);
    let cpu = buffer_types().into_iter().find(|b| b.name() == "CPU").unwrap();
    let load = |copies: bool| {
        Model::load(
            &path,
            ModelParams {
                n_gpu_layers: 0,
                placement: Some(Arc::new(move |_: &str| Some(cpu))),
                repack: false,
                cpu_weight_copies: copies,
                ..Default::default()
            },
        )
        .unwrap()
    };
    // The CPU's part of each feed-forward weight is its first rows; with
    // copies it reads them from CPU_REPACK (interleaved 8x8).
    let policy: RowSplitPolicy = Arc::new(|_name: &str, rows: u64, _n_tokens: u32| rows / 32 * 11 / 32 * 32);
    let params = ContextParams {
        row_split: Some(policy),
        ..common::small_context_params()
    };
    // The logits of 8 single-token steps after a prompt, each step's input
    // the plain run's greedy token, so both runs see the same tokens.
    let steps = |model: &Model, tokens: Option<&[Token]>| {
        let prompt = model.tokenize(&"the quick brown fox ".repeat(8), true, false).unwrap();
        let mut ctx = Context::new(model, params.clone()).unwrap();
        ctx.decode_tokens(&prompt, 0, true).unwrap();
        let mut next = argmax(ctx.logits(-1).unwrap());
        let (mut chosen, mut logits) = (Vec::new(), Vec::new());
        for i in 0..8 {
            let tok = tokens.map_or(next, |t| t[i]);
            ctx.decode_tokens(&[tok], (prompt.len() + i) as i32, true).unwrap();
            let l = ctx.logits(-1).unwrap().to_vec();
            next = argmax(&l);
            chosen.push(tok);
            logits.push(l);
        }
        (chosen, logits)
    };
    let (tokens, plain) = steps(&load(false), None);
    let (_, copied) = steps(&load(true), Some(&tokens));
    let (mut diff, mut top) = (0f32, 0f32);
    for (a, b) in plain.iter().zip(&copied) {
        for (x, y) in a.iter().zip(b) {
            diff = diff.max((x - y).abs());
            top = top.max(x.abs());
        }
    }
    // The same dot products over the same Q8_0 activations, summed in
    // another order: rounding, not other rows. A wrong nibble, lane or
    // scale gives differences of the order of the logits themselves.
    eprintln!("max |logit diff| {diff} over 8 decode steps, logits up to {top}");
    assert!(diff > 0.0, "bit for bit the plain weights': the copies were not used");
    assert!(
        diff <= 0.02 * top,
        "max |logit diff| {diff} over 8 decode steps, logits up to {top}"
    );
}
