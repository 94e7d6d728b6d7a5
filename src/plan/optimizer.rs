//! The optimizer: choose the ubatch size, the layers whose KV cache lives on
//! the GPU, and the resident weights, for the lowest predicted workload time.
//!
//! For each configuration the placeable weights are ordered by seconds saved
//! per VRAM byte; every prefix of that order that fits the budget is a
//! candidate, and the best candidate over all configurations wins. The order
//! and the configurations do not depend on the budget, so a bigger budget
//! only adds candidates: it can never predict slower.

use super::cost::{experts_cacheable, is_host_only, is_placeable, CostModel, Exec, Streaming};
use super::evaluate::Evaluator;
use super::expert_cache::decode_room;
use super::{kv_bytes, planned_compute, Plan, PlanError, PlanRequest, PlannedTensor, VramBreakdown};
use crate::gguf::{ModelInfo, TensorRole};
use crate::profile::MachineProfile;

/// Extra device memory a streaming context uses beyond llama.cpp's own
/// reservation, in slots (CHANGELOG.md, sessions 1-3: peaks 94 MiB and
/// 262 MiB above the reservation with 31.5 MiB and 108 MiB slots, against
/// 16 and 34 MiB for the same plans with synchronous copies).
const STREAM_OVERHEAD_SLOTS: u64 = 3;

/// How much faster (as a fraction of the smaller one's predicted time to
/// the first token) a larger ubatch must be predicted to be than a smaller
/// one to be chosen. The cost model sums
/// per-op samples, which miss what a whole graph loses at a large ubatch:
/// on the H200, upstream's full-GPU pp4096 at ub 4096 is 7% (R1) and 11%
/// (R2) slower than at ub 2048, where the samples predict it 1% faster
/// (CHANGELOG.md, session 9). A smaller ubatch also leaves its compute buffer's
/// difference to weights.
const LARGER_UBATCH_MARGIN: f64 = 0.03;

/// The streaming overhead that goes with `slots` bytes of `n` slots.
fn stream_overhead(slots: u64, n: u32) -> u64 {
    slots / n.max(1) as u64 * STREAM_OVERHEAD_SLOTS
}

/// The cost model `req` prices plans with.
fn cost_model<'a>(model: &'a ModelInfo, profile: &'a MachineProfile, req: &PlanRequest) -> CostModel<'a> {
    let mut cm = CostModel::new(
        model,
        profile,
        req.streaming(),
        req.pinned,
        req.overheads,
        req.hybrid_gpu_experts,
    );
    cm.gpu_only = req.exact;
    cm.dense_split = req.dense_split;
    cm.cache_locality = req.cache_locality.filter(|_| experts_cacheable(model));
    cm.kv_unified = req.kv_unified;
    cm
}

/// Seconds of `req`'s workload each placeable weight saves per VRAM byte
/// when resident, at `plan`'s ubatch and KV layers: the order in which the
/// optimizer fills VRAM, by weight name.
pub fn value_per_byte(
    model: &ModelInfo,
    profile: &MachineProfile,
    req: &PlanRequest,
    plan: &Plan,
) -> std::collections::HashMap<String, f64> {
    let cm = cost_model(model, profile, req);
    let ev = Evaluator::new(model, &cm, plan.workload, plan.ubatch, plan.kv_gpu_layers);
    ev.tensors
        .iter()
        .enumerate()
        .map(|(k, &i)| {
            let t = &model.tensors[i];
            (t.name.clone(), ev.saving(k) / t.cuda_alloc_size().max(1) as f64)
        })
        .collect()
}

/// `order` with each layer's routed-expert tensors made resident together,
/// as llama.cpp's `-ncmoe` keeps whole layers' experts on the GPU: the
/// layers' groups and the other weights ordered by the seconds they save
/// per byte together. A layer with some of its expert tensors resident
/// still runs the others on the CPU, with the device switches (and the
/// hybrid split it loses) that the per-tensor order does not count, so a
/// prefix of whole layers can beat every prefix of that order.
fn whole_layer_order(model: &ModelInfo, ev: &Evaluator, order: &[usize]) -> Vec<usize> {
    let sizes = ev.device_bytes();
    let mut units: Vec<Vec<usize>> = Vec::new();
    for &k in order {
        let t = &model.tensors[ev.tensors[k]];
        let group = t.holds_routed_experts().then_some(t.layer).flatten();
        let same = |u: &Vec<usize>| {
            let f = &model.tensors[ev.tensors[u[0]]];
            group.is_some() && f.holds_routed_experts() && f.layer == group
        };
        match units.iter_mut().find(|u| same(u)) {
            Some(u) => u.push(k),
            None => units.push(vec![k]),
        }
    }
    let ratio = |u: &[usize]| {
        u.iter().map(|&k| ev.saving(k)).sum::<f64>() / u.iter().map(|&k| sizes[k].max(1)).sum::<u64>() as f64
    };
    // Stable: units of equal value keep the per-tensor order's.
    units.sort_by(|a, b| ratio(b).total_cmp(&ratio(a)));
    units.concat()
}

/// Make the best plan for `model` on the machine described by `profile`.
pub fn make_plan(model: &ModelInfo, profile: &MachineProfile, req: &PlanRequest) -> Result<Plan, PlanError> {
    if req.n_ctx == 0 || req.workload.prompt_tokens == 0 {
        return Err(PlanError::Invalid(
            "n_ctx and the prompt length must be positive".into(),
        ));
    }
    if req.ubatch == Some(0) {
        return Err(PlanError::Invalid("the ubatch size must be positive".into()));
    }
    if !profile.has_gpu() {
        return Err(PlanError::NoGpuProfile);
    }
    super::log_unknown_tensors(model);
    let streaming = req.streaming();
    // The placement is chosen with every split weight at one share; the
    // row split's mode once it is (see `split_mode`).
    let mut cm = cost_model(model, profile, req);
    cm.split_down_whole = false;
    // Streamed weights held in the compute buffer: with synchronous copies
    // the scheduler copies a layer's streamed weights there; with overlapped
    // streaming they go through the slots instead, sized per candidate below.
    let in_compute: u64 = match streaming {
        Streaming::Synchronous => (0..model.n_layer)
            .map(|l| {
                model
                    .tensors
                    .iter()
                    .filter(|t| t.layer == Some(l) && is_placeable(t) && t.role != TensorRole::AttnOutput)
                    .map(|t| t.nbytes)
                    .sum::<u64>()
            })
            .max()
            .unwrap_or(0),
        Streaming::Overlapped | Streaming::Pipelined => 0,
    };
    let ubatches: Vec<u32> = match req.ubatch {
        Some(u) => vec![u],
        None => [512u32, 1024, 2048, 4096]
            .into_iter()
            .filter(|&u| u as u64 <= req.workload.prompt_tokens.max(512) && u as u64 <= req.n_ctx.max(512))
            .collect(),
    };
    // An exact plan keeps every layer's KV cache on the GPU: llama.cpp makes
    // a layer whose cache is in host memory a CPU layer, whose small
    // tensors (norms) stay in host memory and whose ops on them run on the
    // CPU for small batches. R1's exact plan with its KV in host memory
    // diverged from the full-GPU output at token 11 (CHANGELOG.md, session 9).
    let kv_steps: Vec<u32> = if let Some(l) = req.kv_gpu_layers {
        vec![l.min(model.n_layer)]
    } else if req.exact {
        vec![model.n_layer]
    } else {
        let step = (model.n_layer as usize / 8).max(1);
        let mut v: Vec<u32> = (0..=model.n_layer).rev().step_by(step).collect();
        if v.last() != Some(&0) {
            v.push(0);
        }
        v
    };

    let mut best: Option<(f64, Plan)> = None;
    let mut minimum = u64::MAX;
    let tier_with_cache = req.decode_tier && cm.cache_locality.is_some() && model.n_expert > 0;
    for &u in &ubatches {
        // The ubatch's best configuration for the prompt's residency.
        let mut u_best: Option<(f64, Plan)> = None;
        for &kv_layers in &kv_steps {
            let kv = kv_bytes(model, req, kv_layers, u as u64);
            let compute = planned_compute(model, req, u as u64, in_compute);
            let fixed = kv + req.reserve;
            let mut ev = Evaluator::new(model, &cm, req.workload, u, kv_layers);
            ev.price_cache(model, &cm, decode_room(model, req, compute), req.stream_slots);
            let sizes = ev.device_bytes();
            let mut order: Vec<usize> = (0..ev.tensors.len()).filter(|&k| ev.saving(k) > 0.0).collect();
            order.sort_by(|&a, &b| {
                let ra = ev.saving(a) / sizes[a].max(1) as f64;
                let rb = ev.saving(b) / sizes[b].max(1) as f64;
                rb.partial_cmp(&ra).unwrap_or(std::cmp::Ordering::Equal).then_with(|| {
                    model.tensors[ev.tensors[a]]
                        .name
                        .cmp(&model.tensors[ev.tensors[b]].name)
                })
            });
            // Every prefix of the order is a candidate. The slots shrink as
            // the largest streamed weights become resident, so a prefix may
            // fit where a shorter one does not: all are tried. A second
            // order first makes resident the weights far larger than the
            // typical one (an output matrix that streams in every tier
            // would otherwise size every slot, and the first order may
            // reach it only after most of the budget is spent). A third
            // makes each layer's routed experts resident together
            // (`whole_layer_order`).
            let slot_bytes = |resident: &[bool]| match streaming {
                Streaming::Synchronous => 0,
                Streaming::Overlapped | Streaming::Pipelined => ev.slot_bytes(resident, req.stream_slots),
            };
            let orders = {
                let mut by_size: Vec<u64> = order.iter().map(|&k| sizes[k]).collect();
                by_size.sort_unstable();
                let typical = by_size.get(by_size.len() / 2).copied().unwrap_or(0);
                let mut big: Vec<usize> = order.iter().copied().filter(|&k| sizes[k] > 2 * typical).collect();
                big.sort_by_key(|&k| std::cmp::Reverse(sizes[k]));
                let mut big_first = big.clone();
                big_first.extend(order.iter().copied().filter(|k| !big.contains(k)));
                let whole = whole_layer_order(model, &ev, &order);
                let mut orders = vec![order];
                for o in [big_first, whole] {
                    if !orders.contains(&o) {
                        orders.push(o);
                    }
                }
                orders
            };
            // (objective, order, prefix length, weight bytes, slot bytes)
            let mut cfg_best: Option<(f64, usize, usize, u64, u64)> = None;
            for (oi, order) in orders.iter().enumerate() {
                let mut resident = vec![false; ev.tensors.len()];
                let mut used = 0u64;
                for pos in 0..=order.len() {
                    if pos > 0 {
                        let k = order[pos - 1];
                        used += sizes[k];
                        resident[k] = true;
                    }
                    let slots = slot_bytes(&resident);
                    let need = VramBreakdown::total_with(
                        fixed + used,
                        compute + slots + stream_overhead(slots, req.stream_slots),
                        req.vision_peak,
                    );
                    minimum = minimum.min(need);
                    if need > req.budget {
                        continue;
                    }
                    let obj = ev.objective(&ev.evaluate(&resident));
                    if cfg_best.map_or(true, |b| obj < b.0 - 1e-12) {
                        cfg_best = Some((obj, oi, pos, used, slots));
                    }
                }
            }
            let Some(cfg_best) = cfg_best else {
                continue;
            };
            if u_best.as_ref().is_some_and(|(b, _)| cfg_best.0 >= *b - 1e-12) {
                continue;
            }
            let mut resident = vec![false; ev.tensors.len()];
            for &k in &orders[cfg_best.1][..cfg_best.2] {
                resident[k] = true;
            }
            let predicted = ev.evaluate(&resident);
            let tiers = ev.tiers();
            let share = ev.decode_row_split(&resident).share;
            let tensors = ev
                .tensors
                .iter()
                .enumerate()
                .map(|(k, &i)| {
                    let t = &model.tensors[i];
                    // A host-only weight's op is left where llama.cpp puts
                    // its consumer.
                    let exec: Vec<(u32, Exec)> = if is_host_only(t) {
                        Vec::new()
                    } else {
                        tiers
                            .iter()
                            .map(|&n| (n, ev.tier_exec(k, n, &resident, share)))
                            .collect()
                    };
                    PlannedTensor {
                        name: t.name.clone(),
                        layer: t.layer,
                        role: format!("{:?}", t.role),
                        bytes: t.nbytes,
                        vram_bytes: sizes[k],
                        resident: resident[k],
                        gpu_share: exec
                            .iter()
                            .filter(|&&(_, e)| e == Exec::Split)
                            .map(|&(n, _)| (n, share))
                            .collect(),
                        exec,
                        tied: model.is_tied_output(t),
                    }
                })
                .collect();
            let (weights, slots) = (cfg_best.3, cfg_best.4);
            let overhead = stream_overhead(slots, req.stream_slots);
            let plan = Plan {
                model: model.name.clone().unwrap_or_else(|| model.architecture.clone()),
                ubatch: u,
                tiers,
                kv_gpu_layers: kv_layers,
                n_layer: model.n_layer,
                streaming,
                stream_slots: if streaming == Streaming::Synchronous {
                    0
                } else {
                    req.stream_slots
                },
                // 0 with synchronous copies (routed_max_tokens is 0 then).
                stream_routed_max: (cm.routed_max_tokens * model.n_expert_used as u64).min(u32::MAX as u64) as u32,
                hybrid_gpu_experts: ev.hybrid_gpu_experts(&resident),
                batch_gpu_experts: ev.batch_gpu_experts(&resident),
                row_split_share: share,
                row_split_down_whole: false,
                exact: req.exact,
                // Decided once the plan is chosen (cpu_weight_copies).
                cpu_weight_copies: false,
                pinned: req.pinned,
                vram: VramBreakdown {
                    weights,
                    kv_cache: kv,
                    compute,
                    stream_slots: slots,
                    stream_overhead: overhead,
                    reserve: req.reserve,
                    vision_peak: req.vision_peak,
                    total: VramBreakdown::total_with(
                        weights + kv + req.reserve,
                        compute + slots + overhead,
                        req.vision_peak,
                    ),
                    budget: req.budget,
                    measured: None,
                },
                predicted,
                workload: req.workload,
                tensors,
                decode_tier: None,
                expert_cache: None,
            };
            u_best = Some((cfg_best.0, plan));
        }
        // With its decode tier where decode caches routed experts: the
        // tier's weights and the expert cache share the memory a prompt's
        // compute buffers leave in decode, so the ubatch (the size of those
        // buffers) is chosen with the tier.
        let Some((objective, mut plan)) = u_best else {
            continue;
        };
        let seconds = if tier_with_cache {
            plan.decode_tier = super::decode_tier::decode_tier(model, &cm, req, &plan);
            super::decode_tier::planned_seconds(model, &cm, &plan)
        } else {
            objective
        };
        if best.as_ref().is_some_and(|(b, p)| {
            let margin = if p.ubatch < u {
                LARGER_UBATCH_MARGIN * p.predicted.ttft_s
            } else {
                0.0
            };
            seconds >= *b - margin - 1e-12
        }) {
            continue;
        }
        best = Some((seconds, plan));
    }
    let mut plan = best.map(|(_, p)| p).ok_or(PlanError::BudgetTooSmall {
        budget: req.budget,
        minimum,
    })?;
    cm.split_down_whole = true;
    split_mode(model, &cm, req, &mut plan);
    plan.cpu_weight_copies = cpu_weight_copies(req, &plan);
    if req.decode_tier && !tier_with_cache {
        plan.decode_tier = super::decode_tier::decode_tier(model, &cm, req, &plan);
    }
    // The decode phase's own hybrid share: the tier's residency and the
    // cache's hits decide it.
    let decoding = super::evaluate::decode_phase(model, &cm, req, &plan);
    plan.expert_cache = decoding.expert_cache;
    if plan.hybrid_gpu_experts > 0 && decoding.hybrid_gpu_experts > 0 {
        plan.hybrid_gpu_experts = decoding.hybrid_gpu_experts;
    }
    split_output(model, &cm, &mut plan);
    Ok(plan)
}

/// The dense row split's mode for `plan`'s placement: ffn_down streamed
/// whole with up and gate split, where the cost model prices that decode
/// faster than every split weight at the plan's share
/// ([`Evaluator::decode_row_split`]); the prediction is then that mode's.
/// The placement itself (residency, KV layers, ubatch) is chosen with
/// every weight split: the mode's step leaves up's and gate's CPU part
/// beside ffn_down's copies, priced as unsplit, which made the KV cache in
/// host memory look cheap (R1 Q4_K_M at 2 GiB on the H200 profile: 28 of
/// 32 layers on the GPU, where the host KV cache decoded 15.2 tok/s against
/// 26.2, see tests/plan.rs).
fn split_mode(model: &ModelInfo, cm: &CostModel<'_>, req: &PlanRequest, plan: &mut Plan) {
    if plan.row_split_share <= 0.0 {
        return;
    }
    let mut ev = Evaluator::new(model, cm, plan.workload, plan.ubatch, plan.kv_gpu_layers);
    ev.price_cache(model, cm, decode_room(model, req, plan.vram.compute), req.stream_slots);
    let resident = super::evaluate::residency(&ev, model, plan);
    let split = ev.decode_row_split(&resident);
    if split.down_whole {
        super::set_row_split(plan, split);
        plan.predicted = ev.evaluate(&resident);
    }
}

/// The output projection's row split in single-token decode (patch 0043,
/// [`CostModel::output_split`]), where it is in host memory and the CPU
/// computes it there: its own share, which the decode tuner leaves as it
/// is, in parts of a streaming slot each. Measured on an H200 host (R1 at 2
/// GiB from saved plans, ffn_down streamed whole, 5% of up and gate on the
/// GPU, interleaved three times; CHANGELOG.md, session 23, call a): 24.4,
/// 32.8, 30.2 tok/s with 30.6% of its rows on the GPU (the cost model's
/// share, what the slots hold), 29.4, 28.9, 30.9 with 20%, against 24.5,
/// 28.8, 29.0 unsplit. Not where decode caches routed experts: the
/// scheduler caches no split while another streams a whole weight's rows
/// through the slots (patch 0040).
fn split_output(model: &ModelInfo, cm: &CostModel<'_>, plan: &mut Plan) {
    if plan.expert_cache.is_some() {
        return;
    }
    let max_gpu_bytes = plan.row_split_part_bytes() * plan.stream_slots as u64;
    let Some(k) = plan
        .tensors
        .iter()
        .position(|t| !t.resident && t.role == "Output" && t.exec.contains(&(1, Exec::Cpu)))
    else {
        return;
    };
    let Some(t) = model.tensors.iter().find(|t| t.name == plan.tensors[k].name) else {
        return;
    };
    let Some((share, saved)) = cm.output_split(t, max_gpu_bytes) else {
        return;
    };
    let planned = &mut plan.tensors[k];
    for (n, e) in &mut planned.exec {
        if *n == 1 {
            *e = Exec::Split;
        }
    }
    planned.gpu_share = vec![(1, share)];
    // Single-token decode is the workload's decode where one sequence
    // decodes without a draft.
    if plan.workload.speculation.is_none() && plan.workload.decode_tokens() == 1 {
        let faster = |tok_s: f64| 1.0 / (1.0 / tok_s - saved).max(1e-9);
        plan.predicted.decode_tok_s = faster(plan.predicted.decode_tok_s);
        if let Some(d) = &mut plan.decode_tier {
            d.predicted_decode_tok_s = faster(d.predicted_decode_tok_s);
        }
    }
}

/// Host memory left free beside the weights and their CPU copies.
const HOST_MARGIN: u64 = 2 << 30;

/// Whether the weights the CPU computes a part of (hybrid experts, dense
/// row split) get repacked CPU copies (patch 0039): only where it computes
/// some, and where host memory holds the copies beside the host weights
/// with [`HOST_MARGIN`] to spare. The CPU's repacked kernels ran its share
/// of an R2 layer's experts 1.3-1.7x as fast (CHANGELOG.md, session 17).
fn cpu_weight_copies(req: &PlanRequest, plan: &Plan) -> bool {
    if !req.cpu_copies
        || plan.exact
        || (plan.hybrid_gpu_experts == 0 && plan.batch_gpu_experts == 0 && plan.row_split_share <= 0.0)
    {
        return false;
    }
    let copies = plan.cpu_copy_bytes();
    copies > 0
        && req
            .host_available
            .map_or(true, |avail| plan.host_bytes() + copies + HOST_MARGIN <= avail)
}
