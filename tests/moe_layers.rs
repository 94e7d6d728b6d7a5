//! MoE layers whose experts stay in host memory, on the H200 host's frozen
//! profile: the cost model prices them as upstream's llama-bench measured
//! them there, and the planner places experts at least as well as keeping
//! whole layers' experts on the GPU, as upstream's `-ncmoe N` does.

use std::path::Path;

use pipeshard::gguf::ModelInfo;
use pipeshard::plan::{self, expert_cache::decode_room, CostModel, Evaluator, PlanRequest, Workload};
use pipeshard::profile::MachineProfile;
use pipeshard_devtools::synth::{self, Quant};

const GIB: u64 = 1 << 30;

fn h200_profile() -> MachineProfile {
    MachineProfile::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/h200-machine-profile.yaml"))
        .expect("the H200 profile fixture")
}

/// The request `pipeshard bench` plans with on the H200: the reference
/// settings, 433 MiB outside llama.cpp's buffers.
fn reference_request(budget: u64) -> PlanRequest {
    let mut r = PlanRequest::new(budget, 4352);
    r.reserve = 433 << 20;
    r
}

/// Every weight resident but the routed experts of the layers not in
/// `gpu_layers`, over `ev`'s tensors.
fn experts_on_gpu(info: &ModelInfo, ev: &Evaluator, gpu_layers: &[u32]) -> Vec<bool> {
    ev.tensors
        .iter()
        .map(|&i| {
            let t = &info.tensors[i];
            !t.holds_routed_experts() || t.layer.is_some_and(|l| gpu_layers.contains(&l))
        })
        .collect()
}

/// llama-bench's `-ncmoe n_cpu`: the routed experts of the first `n_cpu`
/// layers on the CPU.
fn ncmoe(info: &ModelInfo, ev: &Evaluator, n_cpu: u32) -> Vec<bool> {
    experts_on_gpu(info, ev, &(n_cpu..info.n_layer).collect::<Vec<_>>())
}

/// Decode speed of upstream's placements with `n_cpu` layers' experts on
/// the CPU, at ubatch 512 (llama-bench's), with every KV layer on the GPU.
fn ncmoe_decode(info: &ModelInfo, profile: &MachineProfile, n_cpu: u32) -> f64 {
    let cm = CostModel::new(
        info,
        profile,
        plan::Streaming::Pipelined,
        true,
        plan::Overheads::default(),
        Some(0),
    );
    let ev = Evaluator::new(info, &cm, Workload::default(), 512, info.n_layer);
    ev.evaluate(&ncmoe(info, &ev, n_cpu)).decode_tok_s
}

/// Upstream's decode (tg64 at depth 4096, 16 threads) on the H200 with
/// every weight on the GPU and with every layer's experts on the CPU
/// (`--cpu-moe`): R2 Q4_0 in call 2026-11-28-a, R4 (Qwen3.6-35B-A3B,
/// Gated-DeltaNet layers beside attention) Q4_K_M in call 2026-11-29-e
/// (bench/results/summary.json). Before the cost model priced what a layer's
/// experts on the CPU cost beyond their matmuls, and a recurrent layer's
/// small kernels, it predicted R4 291 and 69 tok/s and R2 45 tok/s on the
/// CPU.
#[test]
fn experts_on_the_cpu_and_recurrent_layers_cost_what_upstream_measured() {
    let profile = h200_profile();
    let r4 = synth::model_info("qwen3.6-35b-a3b", Quant::Q4_K_M).unwrap();
    let r2 = synth::model_info("qwen3-30b-a3b", Quant::Q4_0).unwrap();
    for (case, info, n_cpu, measured) in [
        ("R4 full GPU", &r4, 0, 218.9),
        ("R4 cpu-moe", &r4, r4.n_layer, 47.6),
        ("R2 cpu-moe", &r2, r2.n_layer, 36.3),
    ] {
        let predicted = ncmoe_decode(info, &profile, n_cpu);
        assert!(
            (predicted / measured - 1.0).abs() <= 0.15,
            "{case}: predicted {predicted:.1} tok/s, measured {measured}"
        );
    }
}

/// R4 at 8 GiB, as `bench` plans it on the H200 (its plan there computed
/// every host expert on the CPU): no placement that keeps whole layers'
/// experts on the GPU (the last layers', as `-ncmoe` does, or the smallest
/// layers', those whose down experts are Q4_K rather than Q6_K), within the
/// same budget at the plan's ubatch and KV layers, is predicted faster than
/// the plan. The per-weight order made some layers' gate and up experts
/// resident without their down experts, which leaves the layer on the CPU
/// for one matmul and its switches: 73.1 tok/s against 73.6 with whole
/// layers.
#[test]
fn the_plan_is_no_slower_than_keeping_whole_layers_experts_on_the_gpu() {
    let profile = h200_profile();
    let info = synth::model_info("qwen3.6-35b-a3b", Quant::Q4_K_M).unwrap();
    for hybrid in [Some(0), None] {
        let mut req = reference_request(8 * GIB);
        req.hybrid_gpu_experts = hybrid;
        let p = plan::make_plan(&info, &profile, &req).unwrap();
        let mut cm = CostModel::new(
            &info,
            &profile,
            req.streaming(),
            req.pinned,
            req.overheads,
            req.hybrid_gpu_experts,
        );
        cm.cache_locality = req.cache_locality;
        let mut ev = Evaluator::new(&info, &cm, req.workload, p.ubatch, p.kv_gpu_layers);
        ev.price_cache(&info, &cm, decode_room(&info, &req, p.vram.compute), p.stream_slots);
        let planned: Vec<bool> = ev
            .tensors
            .iter()
            .map(|&i| p.tensors.iter().any(|t| t.resident && t.name == info.tensors[i].name))
            .collect();
        let objective = |res: &[bool]| ev.objective(&ev.evaluate(res));
        let fixed = p.vram.kv_cache + p.vram.reserve + p.vram.compute;
        // Layers by their experts' bytes, the last first among equals.
        let layer_bytes = |l: u32| -> u64 {
            let res = experts_on_gpu(&info, &ev, &[l]);
            let all = experts_on_gpu(&info, &ev, &[]);
            (0..res.len())
                .filter(|&k| res[k] && !all[k])
                .map(|k| ev.device_bytes()[k])
                .sum()
        };
        let mut by_size: Vec<u32> = (0..info.n_layer).rev().collect();
        by_size.sort_by_key(|&l| layer_bytes(l));
        let candidates = (0..=info.n_layer)
            .map(|n_cpu| (format!("-ncmoe {n_cpu}"), ncmoe(&info, &ev, n_cpu)))
            .chain((0..=by_size.len()).map(|n| {
                let res = experts_on_gpu(&info, &ev, &by_size[..n]);
                (format!("the {n} smallest layers"), res)
            }));
        let mut fitting = 0;
        for (name, res) in candidates {
            let weights: u64 = (0..res.len()).filter(|&k| res[k]).map(|k| ev.device_bytes()[k]).sum();
            let slots = ev.slot_bytes(&res, p.stream_slots);
            let overhead = slots / u64::from(p.stream_slots.max(1)) * 3;
            if fixed + weights + slots + overhead > req.budget {
                continue;
            }
            fitting += 1;
            assert!(
                objective(&planned) <= objective(&res) + 1e-9,
                "hybrid {hybrid:?}: the plan ({:.4} s) is slower than {name} ({:.4} s)",
                objective(&planned),
                objective(&res)
            );
        }
        assert!(fitting > 0, "hybrid {hybrid:?}: no whole-layer placement fits");
    }
}

/// A profile whose GPU runs one token's K-quant expert matmuls at `slower`
/// times Q4_0's time and whose CPU runs them at Q4_0's rate.
fn with_slow_k_quant_gpu_experts(mut profile: MachineProfile, slower: f64) -> MachineProfile {
    let q4_0: Vec<_> = profile
        .matmul
        .iter()
        .filter(|s| s.experts.is_some() && s.ty == "q4_0")
        .cloned()
        .collect();
    for ty in ["q4_K", "q6_K"] {
        for s in &q4_0 {
            let mut k = s.clone();
            k.ty = ty.into();
            if k.device == pipeshard::profile::Device::Gpu && k.tokens == 1 {
                k.seconds *= slower;
            }
            profile.matmul.push(k);
        }
    }
    profile.make_monotone();
    profile
}

/// R4 at 8 GiB with the H200's compute buffers (llama.cpp reserved 1.17 GiB
/// less than the estimate, call 2026-11-29-e), on a GPU slow enough at
/// K-quant expert matmuls that a hybrid layer copying every expert the GPU
/// computes costs more than the CPU: the expert cache holds most of them,
/// so the plan still splits each token's experts. The admission without
/// the cache made every layer's experts run on the CPU (hybrid experts 0),
/// as the plan measured on the H200 did (there with the old pricing of the
/// CPU's experts, at twice Q4_0's GPU time).
#[test]
fn hybrid_experts_are_admitted_at_the_hits_the_cache_gives() {
    let profile = with_slow_k_quant_gpu_experts(h200_profile(), 6.0);
    let info = synth::model_info("qwen3.6-35b-a3b", Quant::Q4_K_M).unwrap();
    let plan_with = |hybrid: Option<u32>| {
        let mut req = reference_request(8 * GIB);
        req.compute_scale = 0.45;
        req.hybrid_gpu_experts = hybrid;
        plan::make_plan(&info, &profile, &req).unwrap()
    };
    let (chosen, cpu) = (plan_with(None), plan_with(Some(0)));
    assert!(chosen.hybrid_gpu_experts > 0, "{}", chosen.hybrid_gpu_experts);
    assert!(chosen.expert_cache.is_some());
    assert!(
        chosen.predicted.decode_tok_s > cpu.predicted.decode_tok_s,
        "{:.1} tok/s against {:.1} with every host expert on the CPU",
        chosen.predicted.decode_tok_s,
        cpu.predicted.decode_tok_s
    );
}
