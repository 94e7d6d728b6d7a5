//! The models people run in 2026, on the CPU: gpt-oss (sinks, biases, a
//! sliding window in every other layer), Qwen3.6 (`qwen35moe`: recurrent
//! Gated-DeltaNet layers, a gated shared expert), Gemma 3 (five window
//! layers to one global), Gemma 4's MoE (window layers, global layers of
//! other head sizes, a dense FFN beside the routed experts), GLM-4.5-Air
//! (dense lead layer, selection bias, shared expert) and DeepSeek-V2-Lite
//! (MLA, shared experts). For every
//! tiny preset: each tensor's role and the cache each layer keeps, the
//! plan's decision for each role under a budget with the GPU profile
//! fixture, each role on one of two CPU buffer types with the greedy tokens
//! of the plain load, `plan` and `run` under a budget, and a server request.

mod common;

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use pipeshard::engine::{
    buffer_types, BufferType, Context, Model, ModelParams, Offload, OffloadQuery, OpKind, TensorPlacement,
};
use pipeshard::gguf::{GgmlType, ModelInfo, ModelTensor, TensorRole};
use pipeshard::plan::{self, PlanRequest};
use pipeshard::profile::MachineProfile;
use pipeshard_devtools::synth::{self, Family, Quant};

const TINY: [&str; 7] = [
    "tiny-gpt-oss-20b",
    "tiny-gpt-oss-120b",
    "tiny-qwen3.6-35b-a3b",
    "tiny-gemma-3-27b",
    "tiny-gemma-4-26b-a4b",
    "tiny-glm-4.5-air",
    "tiny-deepseek-v2-lite",
];

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpu-machine-profile.yaml")
}

fn profile() -> MachineProfile {
    MachineProfile::load(&fixture()).expect("the fixture profile")
}

fn info(preset: &str) -> ModelInfo {
    synth::model_info(preset, Quant::Q8_0).unwrap_or_else(|e| panic!("{preset}: {e}"))
}

fn roles_of(m: &ModelInfo, role: TensorRole) -> Vec<&ModelTensor> {
    m.tensors.iter().filter(|t| t.role == role).collect()
}

/// Roles whose tensors are matmul weights the planner places; everything
/// else (norms, biases, sinks, recurrent parameters) stays with its layer.
fn is_matmul_role(r: TensorRole) -> bool {
    use TensorRole::*;
    matches!(
        r,
        Output
            | AttnQ
            | AttnK
            | AttnV
            | AttnQkv
            | AttnOutput
            | AttnGate
            | AttnQA
            | AttnQB
            | AttnKvA
            | AttnKvB
            | AttnKB
            | AttnVB
            | FfnGate
            | FfnUp
            | FfnDown
            | MoeRouter
            | MoeGateExps
            | MoeUpExps
            | MoeDownExps
            | MoeGateUpExps
            | SharedExpertGate
            | SharedExpertUp
            | SharedExpertDown
            | SsmBeta
            | SsmAlpha
            | SsmBetaAlpha
            | SsmOut
    )
}

#[test]
fn every_tensor_has_a_role_and_each_layer_keeps_the_cache_of_its_kind() {
    for preset in TINY.iter().copied().chain(TINY.iter().map(|t| &t[5..])) {
        let m = info(preset);
        let unknown: Vec<&str> = m.unknown_tensors().map(|t| t.name.as_str()).collect();
        assert!(unknown.is_empty(), "{preset}: no role for {unknown:?}");
        let p = synth::by_name(preset).unwrap();
        let req = |n_ctx| PlanRequest::new(GIB, n_ctx);
        let (short, long) = (req(4096), req(8192));
        let per_tok = |l| m.kv_bytes_per_token(l, GgmlType::F16, GgmlType::F16).unwrap();
        for l in 0..m.n_layer {
            let (a, b) = (
                plan::layer_cache_bytes(&m, &short, l, 512),
                plan::layer_cache_bytes(&m, &long, l, 512),
            );
            if m.is_recurrent(l) {
                // a fixed state per sequence, whatever the context
                assert_eq!(per_tok(l), 0, "{preset} layer {l}");
                assert_eq!(a, m.recurrent_state_bytes, "{preset} layer {l}");
                assert_eq!(a, b, "{preset} layer {l}: the state grows with the context");
            } else if m.is_swa(l) {
                // the window and a ubatch (padded to 256), not the context
                let w = m.sliding_window.unwrap();
                assert_eq!(a, per_tok(l) * (w + 512).div_ceil(256) * 256, "{preset} layer {l}");
                assert_eq!(a, b, "{preset} layer {l}: a window layer grows with the context");
            } else {
                assert_eq!(a, per_tok(l) * 4096, "{preset} layer {l}");
                assert_eq!(b, 2 * a, "{preset} layer {l}");
            }
        }
        let swa: Vec<bool> = (0..m.n_layer).map(|l| m.is_swa(l)).collect();
        let recurrent: Vec<bool> = (0..m.n_layer).map(|l| m.is_recurrent(l)).collect();
        match p.family {
            Family::GptOss { sliding_window } => {
                // load_swa_pattern(ml, 2): even layers slide
                assert_eq!(m.sliding_window, Some(u64::from(sliding_window)));
                assert!(
                    swa.iter().enumerate().all(|(l, &s)| s == (l % 2 == 0)),
                    "{preset}: {swa:?}"
                );
                let sinks = roles_of(&m, TensorRole::AttnSinks);
                assert_eq!(sinks.len(), m.n_layer as usize, "{preset}");
                assert!(sinks.iter().all(|t| t.dims == vec![p.n_head] && t.ty == GgmlType::F32));
                // the expert biases are biases, not stacks of experts
                let exps: Vec<_> = m.tensors.iter().filter(|t| t.role.is_routed_expert()).collect();
                assert!(exps.iter().any(|t| t.is_bias()), "{preset}");
                assert!(exps.iter().all(|t| t.holds_routed_experts() != t.is_bias()), "{preset}");
            }
            Family::Gemma3 { .. } => {
                let expected: Vec<bool> = (0..m.n_layer).map(|l| l % 6 != 5).collect();
                assert_eq!(swa, expected, "{preset}");
                assert_eq!(roles_of(&m, TensorRole::FfnPostNorm).len(), m.n_layer as usize);
            }
            Family::Gemma4(g) => {
                let expected: Vec<bool> = (0..m.n_layer).map(|l| g.is_swa(l)).collect();
                assert_eq!(swa, expected, "{preset}");
                for l in 0..m.n_layer {
                    // wider heads, fewer KV heads in the global layers,
                    // whose V is their K (no V projection)
                    let (hd, kv) = match g.is_swa(l) {
                        true => (p.head_dim, p.n_head_kv),
                        false => (g.head_dim_global, g.n_head_kv_global),
                    };
                    assert_eq!(per_tok(l), 2 * 2 * hd * kv, "{preset} layer {l}");
                    let has_v = m.layer_tensors(l).any(|t| t.role == TensorRole::AttnV);
                    assert_eq!(has_v, g.is_swa(l), "{preset} layer {l}");
                }
                // every layer: a dense FFN beside the routed experts, whose
                // gate and up are one stack, each with its norms
                let every_layer = [
                    TensorRole::FfnUp,
                    TensorRole::MoeGateUpExps,
                    TensorRole::MoePreNorm,
                    TensorRole::FfnDensePostNorm,
                    TensorRole::MoePostNorm,
                    TensorRole::LayerOutScale,
                ];
                for role in every_layer {
                    assert_eq!(roles_of(&m, role).len(), m.n_layer as usize, "{preset}: {role:?}");
                }
                assert!(roles_of(&m, TensorRole::MoeGateUpExps)
                    .iter()
                    .all(|t| t.holds_routed_experts()));
                // the router's input scale and the per-expert output scale
                let scales = roles_of(&m, TensorRole::WeightScale);
                assert_eq!(scales.len(), 2 * m.n_layer as usize, "{preset}");
                assert!(scales.iter().all(|t| t.dims.len() == 1 && !t.holds_routed_experts()));
                assert_eq!(roles_of(&m, TensorRole::RopeFreqs).len(), 1, "{preset}");
                assert_eq!(m.n_expert_shared, 0, "{preset}");
            }
            Family::Qwen35Moe(g) => {
                let expected: Vec<bool> = (0..m.n_layer).map(|l| g.is_recurrent(l)).collect();
                assert_eq!(recurrent, expected, "{preset}");
                // n_embd_r + n_embd_s of llama-hparams.cpp, F32
                let (key, value) = (g.head_dim * g.n_k_heads, g.head_dim * g.n_v_heads);
                let r = (g.conv_kernel - 1) * (value + 2 * key);
                let s = g.head_dim * value;
                assert_eq!(m.recurrent_state_bytes, 4 * (r + s), "{preset}");
                assert_eq!(m.n_expert_shared, 1, "{preset}");
                assert!(!roles_of(&m, TensorRole::SsmConv).is_empty());
            }
            Family::Glm4Moe { n_dense_lead, .. } => {
                let bias = roles_of(&m, TensorRole::MoeSelectionBias);
                assert_eq!(bias.len(), (m.n_layer - n_dense_lead) as usize, "{preset}");
                assert_eq!(m.n_expert_shared, 1, "{preset}");
            }
            Family::Deepseek2(mla) => {
                assert!(m.mla, "{preset}");
                // the compressed latent and the rotary K, no V rows
                assert_eq!(per_tok(0), 2 * (mla.kv_lora_rank + mla.qk_rope), "{preset}");
                assert_eq!(m.n_expert_shared, mla.n_expert_shared, "{preset}");
                assert_eq!(roles_of(&m, TensorRole::AttnKB).len(), m.n_layer as usize);
            }
            Family::Plain => unreachable!("{preset}"),
        }
        if !matches!(p.family, Family::Qwen35Moe(_)) {
            assert!(recurrent.iter().all(|&r| !r), "{preset}");
        }
    }
}

/// A plan of `m` at `budget` with a context of 4096 tokens.
fn plan_at(m: &ModelInfo, budget: u64) -> plan::Plan {
    let req = PlanRequest::new(budget, 4096);
    plan::make_plan(m, &profile(), &req).unwrap_or_else(|e| panic!("{:?}: {e}", m.name))
}

/// The plan's decision for each role: matmul weights are placed (resident
/// or host weights), everything else stays with its layer; the KV cache is
/// the architecture's, layer by layer; the plan fits its budget.
fn check_plan_roles(preset: &str, m: &ModelInfo, p: &plan::Plan) {
    assert!(p.vram.total <= p.vram.budget, "{preset}: {:?}", p.vram);
    let planned: BTreeSet<&str> = p.tensors.iter().map(|t| t.name.as_str()).collect();
    for t in &m.tensors {
        let placed = planned.contains(t.name.as_str());
        let expect = is_matmul_role(t.role) && !t.is_bias() && t.dims.len() >= 2;
        assert_eq!(placed, expect, "{preset}: {} ({:?})", t.name, t.role);
    }
    let req = PlanRequest::new(p.vram.budget, 4096);
    let kv: u64 = (m.n_layer - p.kv_gpu_layers..m.n_layer)
        .map(|l| plan::layer_cache_bytes(m, &req, l, u64::from(p.ubatch)))
        .sum();
    assert_eq!(p.vram.kv_cache, kv, "{preset}");
}

#[test]
fn plans_place_each_role_under_a_budget() {
    for preset in TINY {
        let m = info(preset);
        let total = m.total_bytes();
        // all of it resident, and a budget that holds a part of it
        for budget in [GIB, 300 * MIB + total / 3] {
            let p = plan_at(&m, budget);
            check_plan_roles(preset, &m, &p);
        }
    }
    // The real shapes under the budgets of the reference cases (gpt-oss-120b
    // is planned here only: it does not fit the GPU machine's disk).
    for (preset, gib) in [
        ("gpt-oss-20b", 4),
        ("gpt-oss-120b", 24),
        ("qwen3.6-35b-a3b", 8),
        ("gemma-3-27b", 8),
        ("gemma-4-26b-a4b", 8),
        ("glm-4.5-air", 24),
        ("deepseek-v2-lite", 4),
    ] {
        let m = synth::model_info(preset, Quant::Q4_K_M).unwrap();
        let p = plan_at(&m, gib * GIB);
        check_plan_roles(preset, &m, &p);
        assert!(p.predicted.decode_tok_s > 0.0, "{preset}");
    }
}

#[test]
fn a_recurrent_layer_never_copies_its_state_per_token() {
    let m = info("tiny-qwen3.6-35b-a3b");
    let profile = profile();
    let cm = plan::CostModel::new(
        &m,
        &profile,
        plan::Streaming::Overlapped,
        true,
        plan::Overheads::default(),
        None,
    );
    let (recurrent, attention) = (0, m.n_layer - 1);
    assert!(m.is_recurrent(recurrent) && !m.is_recurrent(attention));
    // A prompt ubatch over a host cache: the attention layer copies its
    // cells over the link; the recurrent layer runs where its state is.
    let (_, copy) = cm.attention(attention, 512, 4096, false);
    assert!(copy > 0.0);
    for depth in [0, 4096, 65536] {
        let (s, copy) = cm.attention(recurrent, 512, depth, false);
        assert_eq!(copy, 0.0, "depth {depth}");
        assert_eq!(s, cm.attention(recurrent, 512, 0, false).0, "depth {depth}");
    }
}

/// gpt-oss's biases stay with their layer (on the GPU where the layer's KV
/// is), and llama.cpp's scheduler runs a bias add where the bias is: a
/// routed-expert matmul computed on the CPU crosses to the GPU for its bias
/// and back, and the decode step pays those switches.
#[test]
fn a_host_computed_weight_crosses_to_its_bias_and_back() {
    let m = info("tiny-gpt-oss-20b");
    let mut unbiased = m.clone();
    unbiased.tensors.retain(|t| !(t.role.is_routed_expert() && t.is_bias()));
    let profile = profile();
    // Without the fixed cost of a layer's experts on the CPU, which would
    // stream the tiny preset's experts instead: the switches are the point.
    let overheads = plan::Overheads {
        cpu_experts_layer_s: 0.0,
        ..Default::default()
    };
    let decode_step = |m: &ModelInfo| {
        let cm = plan::CostModel::new(m, &profile, plan::Streaming::Pipelined, true, overheads, Some(0));
        let workload = PlanRequest::new(GIB, 4096).workload;
        let ev = plan::Evaluator::new(m, &cm, workload, 512, m.n_layer);
        // every weight resident but the routed experts, computed on the CPU
        let resident: Vec<bool> = ev
            .tensors
            .iter()
            .map(|&i| !m.tensors[i].holds_routed_experts())
            .collect();
        let on_cpu = (0..ev.tensors.len())
            .filter(|&k| !resident[k] && ev.tier_exec(k, 1, &resident, 0.0) == plan::Exec::Cpu)
            .count();
        assert_eq!(on_cpu, 3 * m.n_layer as usize);
        1.0 / ev.evaluate(&resident).decode_tok_s
    };
    // each layer: into the CPU for gate, down and up and back, and now out
    // to each one's bias: 4 switches more
    let extra = decode_step(&m) - decode_step(&unbiased);
    let want = 4.0 * f64::from(m.n_layer) * overheads.device_switch_s;
    assert!((extra - want).abs() < 1e-9, "{extra} s, not {want} s");
}

/// Qwen3-Next (`qwen3next`) writes a Gated-DeltaNet layer's beta and alpha
/// projections as one tensor, `ssm_ba` (LLM_TENSOR_SSM_BETA_ALPHA): a
/// recurrent layer's matmul weight, planned as `ssm_beta` and `ssm_alpha`
/// are, not left to the fallback for tensors of no known role.
#[test]
fn qwen3next_fused_beta_alpha_is_planned_as_a_recurrent_weight() {
    let mut m = info("tiny-qwen3.6-35b-a3b");
    m.architecture = "qwen3next".into();
    let tensors = std::mem::take(&mut m.tensors);
    for t in tensors {
        match t.role {
            TensorRole::SsmAlpha => {}
            TensorRole::SsmBeta => {
                let name = t.name.replace("ssm_beta", "ssm_ba");
                m.tensors.push(ModelTensor {
                    role: TensorRole::from_name(&name),
                    name,
                    dims: vec![t.dims[0], 2 * t.dims[1]],
                    nbytes: 2 * t.nbytes,
                    ..t
                });
            }
            _ => m.tensors.push(t),
        }
    }
    let unknown: Vec<&str> = m.unknown_tensors().map(|t| t.name.as_str()).collect();
    assert!(unknown.is_empty(), "no role for {unknown:?}");
    let fused = roles_of(&m, TensorRole::SsmBetaAlpha);
    let recurrent = (0..m.n_layer).filter(|&l| m.is_recurrent(l)).count();
    assert_eq!(fused.len(), recurrent);
    assert!(fused
        .iter()
        .all(|t| t.role.is_recurrent() && m.is_recurrent(t.layer.unwrap())));
    for budget in [GIB, 300 * MIB + m.total_bytes() / 3] {
        let p = plan_at(&m, budget);
        check_plan_roles("qwen3next", &m, &p);
    }
}

#[test]
fn a_tensor_of_no_known_role_falls_back_by_its_size() {
    let mut m = info("tiny-gpt-oss-20b");
    let extra = |name: &str, rows: u64| ModelTensor {
        name: name.into(),
        layer: Some(1),
        role: TensorRole::from_name(name),
        ty: GgmlType::F32,
        dims: vec![1024, rows],
        nbytes: 4 * 1024 * rows,
    };
    // 512 KiB and 4 MiB
    m.tensors.push(extra("blk.1.mystery_small.weight", 128));
    m.tensors.push(extra("blk.1.mystery_big.weight", 1024));
    assert_eq!(m.unknown_tensors().count(), 2);
    for budget in [GIB, 300 * MIB + m.total_bytes() / 3] {
        let p = plan_at(&m, budget);
        assert!(p.tensors.iter().all(|t| t.name != "blk.1.mystery_small.weight"));
        let big = p
            .tensors
            .iter()
            .find(|t| t.name == "blk.1.mystery_big.weight")
            .expect("the large unknown tensor is placed");
        // a host weight even with room to spare, its op left to llama.cpp,
        // not made resident for decoding either
        assert!(!big.resident, "{big:?}");
        assert!(big.exec.is_empty(), "{big:?}");
        assert!(p.tensors.iter().any(|t| t.resident), "nothing resident at {budget}");
        let decode_units = p.decode_tier.iter().flat_map(|d| &d.units);
        assert!(decode_units.flat_map(|u| &u.weights).all(|w| w != &big.name));
        let policies = plan::apply::policies(&p);
        for n_tokens in [1, 512] {
            let q = OffloadQuery {
                weight: "blk.1.mystery_big.weight",
                op: OpKind::Other,
                n_tokens,
            };
            assert_eq!((policies.offload)(&q), Offload::Default);
        }
    }
}

#[test]
fn each_role_on_its_own_cpu_buffer_type_gives_the_plain_tokens() {
    pipeshard::engine::init(None).unwrap();
    let cpu: BufferType = buffer_types().into_iter().find(|b| b.name() == "CPU").unwrap();
    let dir = common::scratch_dir("models-2026-placement");
    for preset in TINY {
        // Q4_0: the weights llama.cpp repacks on x86 (AVX2)
        let path = common::synth_tiny_model(&dir, preset, Quant::Q4_0);
        let (plain, _) = common::greedy_by_buffer(&common::load_on_cpu(&path, None));
        let m = pipeshard::gguf::inspect(&path).unwrap().1;
        let mut roles: Vec<TensorRole> = m.tensors.iter().map(|t| t.role).collect();
        roles.sort_by_key(|r| format!("{r:?}"));
        roles.dedup();
        // Alternate roles between the plain CPU buffer and llama.cpp's own
        // choice (CPU_REPACK for the weights it repacks), and the other way
        // round: every role on both, its neighbours on the other.
        for parity in [0, 1] {
            let on_cpu: HashSet<TensorRole> = roles
                .iter()
                .enumerate()
                .filter(|(i, _)| i % 2 == parity)
                .map(|(_, &r)| r)
                .collect();
            let asked: Arc<Mutex<BTreeSet<String>>> = Arc::default();
            let seen = asked.clone();
            let placement: TensorPlacement = Arc::new(move |name: &str| {
                seen.lock().unwrap().insert(name.to_string());
                on_cpu.contains(&TensorRole::from_name(name)).then_some(cpu)
            });
            let (tokens, by_buffer) = common::greedy_by_buffer(&common::load_on_cpu(&path, Some(placement)));
            assert_eq!(tokens, plain, "{preset}, parity {parity}");
            assert!(by_buffer.len() >= 2, "{preset}: weights in {by_buffer:?}");
            let asked = asked.lock().unwrap();
            let missing: Vec<&str> = m
                .tensors
                .iter()
                .map(|t| t.name.as_str())
                .filter(|n| !asked.contains(*n))
                .collect();
            assert!(missing.is_empty(), "{preset}: never asked for {missing:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The cache the plan sizes is the cache llama.cpp allocates: a context's
/// memory beside its weights, summed over buffer types, equals the plan's
/// per-layer sizes (a sliding-window layer holding its window and a
/// ubatch, not the context; a recurrent layer its state), for one sequence
/// and for several.
#[test]
fn the_planned_cache_is_the_cache_llama_cpp_allocates() {
    pipeshard::engine::init(None).unwrap();
    let dir = common::scratch_dir("models-2026-cache");
    for preset in TINY {
        let path = common::synth_tiny_model(&dir, preset, Quant::Q4_0);
        let m = pipeshard::gguf::inspect(&path).unwrap().1;
        let model = common::load_on_cpu(&path, None);
        let layouts = [
            (4096u32, 1u32, 512u32, true),
            (2048, 1, 64, true),
            (4096, 2, 256, true),
            (4096, 4, 256, false),
            // a stream per sequence, each padded by llama.cpp: 3 x 1536 cells
            (4000, 3, 256, false),
        ];
        for (n_ctx, n_seq, n_ubatch, kv_unified) in layouts {
            let params = pipeshard::engine::ContextParams {
                n_ctx,
                n_batch: n_ubatch,
                n_ubatch,
                n_seq_max: n_seq,
                kv_unified,
                n_threads: Some(2),
                ..Default::default()
            };
            let ctx = Context::new(&model, params).unwrap();
            let allocated: u64 = ctx.memory_breakdown().iter().map(|b| b.context).sum();
            let mut req = PlanRequest::new(GIB, u64::from(n_ctx));
            req.workload.parallel = n_seq;
            req.kv_unified = kv_unified;
            let planned: u64 = (0..m.n_layer)
                .map(|l| plan::layer_cache_bytes(&m, &req, l, u64::from(n_ubatch)))
                .sum();
            assert_eq!(
                allocated, planned,
                "{preset}: n_ctx {n_ctx}, {n_seq} sequences, ubatch {n_ubatch}, unified {kv_unified}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn pipeshard(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pipeshard"))
        .args(args)
        .output()
        .expect("spawning pipeshard")
}

#[test]
fn plan_and_run_under_a_budget_and_one_server_request() {
    let dir = common::scratch_dir("models-2026-cli");
    let fixture = fixture();
    let fixture = fixture.to_str().unwrap();
    for preset in TINY {
        let path = common::synth_tiny_model(&dir, preset, Quant::Q8_0);
        let m = path.to_str().unwrap();
        let out = pipeshard(&[
            "plan",
            "-m",
            m,
            "--vram-budget",
            "1GiB",
            "--profile",
            fixture,
            "-c",
            "1024",
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{preset}: plan failed:\n{stderr}");
        assert!(!stderr.contains("no role"), "{preset}: {stderr}");
        // The budget with the fixture plans the model; without a GPU
        // backend the plan cannot be applied, and run says so.
        let run = |extra: &[&str]| {
            let mut args = vec!["run", "-m", m, "-p", "hello", "-n", "4", "-t", "2", "-c", "512"];
            args.extend(extra);
            pipeshard(&args)
        };
        let out = run(&["--vram-budget", "1GiB", "--profile", fixture]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{preset}:\n{stderr}");
        assert!(stderr.contains("no GPU backend is loaded"), "{preset}:\n{stderr}");
        assert!(!stderr.contains("panicked"), "{preset}:\n{stderr}");
        let out = run(&["--vram-budget", "1GiB"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{preset}: run failed:\n{stderr}");
        assert!(!out.stdout.is_empty(), "{preset}: nothing generated");

        let port = common::server::free_port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pipeshard-server"));
        cmd.args(["-m", m, "--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["-c", "512", "-np", "1", "-t", "2", "--vram-budget", "1GiB"]);
        let mut server = common::server::Server::start(cmd, port, dir.join(format!("{preset}-server.log")));
        server.wait_healthy(|_| {});
        // a random model may well sample an end-of-text token
        let body = serde_json::json!({"prompt": "Hello", "n_predict": 4, "ignore_eos": true}).to_string();
        let reply = ureq::post(&server.url("/completion"))
            .set("Content-Type", "application/json")
            .send_string(&body)
            .unwrap_or_else(|e| panic!("{preset}: {e}"));
        let v: serde_json::Value = serde_json::from_str(&reply.into_string().unwrap()).unwrap();
        assert!(v["content"].is_string(), "{preset}: {v}");
        assert_eq!(v["tokens_predicted"].as_u64(), Some(4), "{preset}: {v}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The real presets' GGUF header (metadata, vocabulary, tensor shapes at
/// `quant`) over a sparse file of the full size: what llama.cpp's loader
/// checks without reading weights.
fn sparse_model(dir: &Path, preset: &str, quant: Quant) -> PathBuf {
    let p = synth::by_name(preset).unwrap();
    let mut w = pipeshard::gguf::GgufWriter::new();
    let vocab = synth::tokenizer::build(&p.tokenizer).unwrap();
    let kv = p.metadata().into_iter().chain([
        ("general.file_type".to_string(), quant.file_type().into()),
        ("general.quantization_version".to_string(), 2u32.into()),
    ]);
    for (k, v) in kv.chain(vocab.metadata()) {
        w.add_kv(k, v).unwrap();
    }
    let mut data_end = 0;
    for (name, ty, dims) in synth::planned_tensors(&p, quant) {
        let t = w.add_tensor(name, ty, &dims).unwrap();
        data_end = data_end.max(t.offset + t.nbytes);
    }
    let mut header = Vec::new();
    drop(w.start(&mut header).unwrap());
    let path = dir.join(format!("{preset}.gguf"));
    std::fs::write(&path, &header).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(header.len() as u64 + data_end).unwrap();
    path
}

#[test]
fn the_real_presets_load_in_the_pinned_llama_cpp() {
    pipeshard::engine::init(None).unwrap();
    let dir = common::scratch_dir("models-2026-real");
    for preset in TINY.map(|t| &t[5..]) {
        let p = synth::by_name(preset).unwrap();
        let path = sparse_model(&dir, preset, Quant::Q4_K_M);
        // every tensor's shape and every key the loader reads, no weights
        let model = Model::load(
            &path,
            ModelParams {
                n_gpu_layers: 0,
                use_mmap: false,
                no_alloc: true,
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("{preset}: {e}"));
        assert_eq!(model.n_layer(), p.n_layer as i32, "{preset}");
        assert_eq!(model.n_embd(), p.n_embd as i32, "{preset}");
        assert_eq!(model.n_vocab(), p.n_vocab as i32, "{preset}");
        assert_eq!(model.n_params(), p.n_params(), "{preset}");
        let _ = std::fs::remove_file(&path);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The decode split's tuner on the CPU through llama.cpp, on a model whose
/// memory cannot drop its last positions (qwen35moe's recurrent
/// Gated-DeltaNet state) and on one with a sliding window (gpt-oss, its
/// window's cache smaller than the prompt): `run` and `bench`'s search
/// after a prompt ([`pipeshard::launch::tune_split`]) and a server's before
/// its first request ([`Session::between_batches`]) each measure every
/// setting, and the greedy tokens after them are the untuned context's.
/// Before sequence 0 went back to the prompt's state between the settings,
/// the second setting's steps failed on the recurrent model (llama.cpp:
/// "inconsistent sequence positions") and neither search tuned.
#[test]
fn the_decode_split_is_tuned_on_recurrent_and_window_models() {
    use pipeshard::launch::{tune_split, Launch, ProcessOverhead, Session, SplitKnob, SplitSetting};
    pipeshard::engine::init(None).unwrap();
    let dir = common::scratch_dir("models-2026-tune");
    for preset in ["tiny-qwen3.6-35b-a3b", "tiny-gpt-oss-20b"] {
        let path = common::synth_tiny_model(&dir, preset, Quant::Q4_0);
        let m = pipeshard::gguf::inspect(&path).unwrap().1;
        let model = common::load_on_cpu(&path, None);
        let knob = SplitKnob::Experts {
            start: 1,
            max: m.n_expert_used - 1,
        };
        let plan = plan_at(&m, GIB);
        let launch = Launch {
            budget: plan.vram.budget,
            overhead: ProcessOverhead::for_machine(Some(&profile()), 512),
            replan: None,
            split_knob: Some(knob),
            plan,
        };
        let every: Vec<SplitSetting> = (0..m.n_expert_used).map(SplitSetting::Experts).collect();
        let measured_every = |t: &pipeshard::launch::SplitTuning| {
            let mut got: Vec<SplitSetting> = t.measured.iter().map(|(s, _)| *s).collect();
            got.sort_by_key(|s| s.to_string());
            got.dedup();
            assert_eq!(got, every, "{preset}: {t}");
            assert!(
                t.measured.iter().all(|(_, secs)| secs.is_finite() && *secs > 0.0),
                "{t}"
            );
        };
        let cp = common::small_context_params();
        let n_vocab = model.n_vocab();
        // Longer than the window's cache (the window, a ubatch, padded:
        // 256 cells), over several batches.
        let prompt: Vec<i32> = (0..300).map(|i| (i * 7919 + 1) % (n_vocab - 1)).collect();
        let mut ctx = Context::new(&model, cp.clone()).unwrap();
        let plain = common::greedy(&mut ctx, &prompt, 6, |_, _| {});

        let mut session = Session::new(&launch);
        let mut tuned = None;
        let tokens = common::greedy(&mut ctx, &prompt, 6, |i, ctx| {
            if i == 0 {
                tuned = tune_split(&mut session, ctx, prompt.len() as u32).unwrap();
                assert_eq!(ctx.seq_pos_max(0), prompt.len() as i32 - 1, "{preset}");
            }
        });
        measured_every(&tuned.unwrap_or_else(|| panic!("{preset}: not tuned")));
        assert_eq!(tokens, plain, "{preset}: the tokens after tuning");

        // A server's, before its first request: its cells removed after.
        let mut served = Session::new(&launch);
        let chosen: Arc<Mutex<Vec<u32>>> = Arc::default();
        let c = Arc::clone(&chosen);
        served.on_plan_changed(Arc::new(move |p: &plan::Plan, _| {
            c.lock().unwrap().push(p.hybrid_gpu_experts)
        }));
        served.tune_before_serving(&cp);
        ctx.clear();
        served.between_batches(ctx.context_ref());
        assert_eq!(
            chosen.lock().unwrap().len(),
            1,
            "{preset}: the server's search did not tune"
        );
        assert_eq!(ctx.seq_pos_max(0), -1, "{preset}");
        assert_eq!(common::greedy(&mut ctx, &prompt, 6, |_, _| {}), plain, "{preset}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
