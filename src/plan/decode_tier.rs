//! The decode tier's own residency. A context's compute buffers are sized
//! for its largest ubatch: a prompt's. Single-token decoding needs a small
//! part of them. Once a prompt is done the launch shrinks them to the
//! decode ubatch's size (patch 0033) and makes more weights resident in the
//! memory that frees, until the next prompt, which gets it back first
//! ([`crate::launch::DecodeResidency`]).
//!
//! The weights come in units: a weight, or all of a layer's routed-expert
//! tensors together (a layer whose experts split between the CPU and the
//! GPU splits as a whole, so one resident expert tensor of three would only
//! stop the split). Units are added greedily by the decode time they save
//! per byte, as the cost model prices the whole step with them, so a unit
//! that saves nothing is never added.
//!
//! The list goes on past the freed memory, for as many bytes as the plan
//! allows for what the process holds outside llama.cpp's buffers (the
//! reserve, streaming's overhead): those allowances are estimates made
//! before loading, and the launch measures the room under the budget
//! (NVML) and takes the prefix that fits
//! ([`crate::launch::Session::enter_decode`]).

use serde::{Deserialize, Serialize};

use super::cost::{is_host_only, CostModel, Streaming};
use super::evaluate::Evaluator;
use super::expert_cache::decode_room;
use super::{planned_compute, Exec, Plan, PlanRequest};
use crate::gguf::ModelInfo;

/// Memory of the freed compute buffers left unused for what the decode
/// tier's new graphs hold outside llama.cpp's buffers: CUDA graphs captured
/// again (ggml-cuda keeps the stale ones for a while) and the pool's
/// temporaries at the new shapes.
pub const DECODE_TIER_MARGIN: u64 = 64 << 20;

/// Weights that become resident together in the decode tier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecodeUnit {
    pub weights: Vec<String>,
    /// Their device bytes.
    pub bytes: u64,
}

/// What the decode tier adds to a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecodeTier {
    /// The ubatch decode runs with: the largest of the plan's tiers below
    /// the prompt's ubatch.
    pub ubatch: u32,
    /// The compute buffers at that ubatch, priced like the plan's.
    pub compute: u64,
    /// Units made resident while decoding, best first; a launch takes the
    /// prefix that the room it measures holds.
    pub units: Vec<DecodeUnit>,
    /// How many of the last units go beyond the freed memory, into the
    /// plan's allowances outside llama.cpp's buffers.
    #[serde(default)]
    pub beyond: usize,
    /// The predicted decode speed with the planned units (all but those
    /// beyond) resident.
    pub predicted_decode_tok_s: f64,
}

impl DecodeTier {
    /// The units that fit the freed memory.
    pub fn planned(&self) -> &[DecodeUnit] {
        &self.units[..self.units.len() - self.beyond.min(self.units.len())]
    }

    /// Device bytes of the planned units.
    pub fn bytes(&self) -> u64 {
        self.planned().iter().map(|u| u.bytes).sum()
    }

    /// Device bytes of all units.
    pub fn all_bytes(&self) -> u64 {
        self.units.iter().map(|u| u.bytes).sum()
    }
}

/// The decode tier of `plan`, made by [`super::make_plan`] for `req`; None
/// when decode runs at the prompt's ubatch, when a vision encoder uses the
/// compute buffers' place, with llama.cpp's synchronous streaming (its
/// compute buffers hold streamed weights), or when the decode time the
/// freed memory saves over the workload's generated tokens does not pay
/// for the copies and the switch ([`super::Overheads::decode_tier_layer_s`]),
/// which every prompt pays again.
pub fn decode_tier(model: &ModelInfo, cm: &CostModel<'_>, req: &PlanRequest, plan: &Plan) -> Option<DecodeTier> {
    if req.vision_peak > 0 || plan.streaming == Streaming::Synchronous {
        return None;
    }
    let ubatch = plan.tiers.iter().copied().filter(|&t| t < plan.ubatch).max()?;
    let compute = planned_compute(model, req, ubatch as u64, 0);
    let mut room = plan
        .vram
        .compute
        .saturating_sub(compute)
        .saturating_sub(DECODE_TIER_MARGIN);

    let mut ev = Evaluator::new(model, cm, plan.workload, plan.ubatch, plan.kv_gpu_layers);
    let mut resident: Vec<bool> = ev
        .tensors
        .iter()
        .map(|&i| {
            plan.tensors
                .iter()
                .any(|t| t.resident && t.name == model.tensors[i].name)
        })
        .collect();
    // Without the tier the expert cache keeps what the prompt's compute
    // buffers leave unused in decode; in the tier only what the smaller
    // ones leave, which the tier's weights must more than make up for.
    ev.price_cache(model, cm, decode_room(model, req, plan.vram.compute), plan.stream_slots);
    let before = 1.0 / ev.decode_speed(&resident).0.max(1e-12);
    ev.price_cache(model, cm, decode_room(model, req, compute), plan.stream_slots);
    // Candidate units, as indices into `ev.tensors`; not a tied output,
    // which the context knows by the embedding's name and cannot move.
    let mut units: Vec<Vec<usize>> = Vec::new();
    for (k, &i) in ev.tensors.iter().enumerate() {
        let t = &model.tensors[i];
        if resident[k] || is_host_only(t) || model.is_tied_output(t) {
            continue;
        }
        if let (true, Some(layer)) = (t.role.is_routed_expert(), t.layer) {
            if let Some(u) = units.iter_mut().find(|u| {
                let f = &model.tensors[ev.tensors[u[0]]];
                f.role.is_routed_expert() && f.layer == Some(layer)
            }) {
                u.push(k);
                continue;
            }
        }
        units.push(vec![k]);
    }
    let size = |u: &[usize]| -> u64 { u.iter().map(|&k| model.tensors[ev.tensors[k]].cuda_alloc_size()).sum() };
    let step_s = |res: &[bool]| 1.0 / ev.decode_speed(res).0.max(1e-12);
    // Decode steps of the workload (per sequence where several decode
    // together: `decode_tok_s` is theirs in total), and the copy of a
    // unit's bytes, which each prompt pays again.
    let steps = plan.workload.gen_tokens as f64 / plan.workload.decode_tokens() as f64;
    let link = cm.link_bw();
    let copy_s = |bytes: u64| if link > 0.0 { bytes as f64 / link } else { f64::INFINITY };

    let mut chosen: Vec<DecodeUnit> = Vec::new();
    let mut now = step_s(&resident);
    // First the freed memory, then the allowances beyond it; the step with
    // the planned units, and how many they are.
    let mut planned = (now, 0);
    for (pass, extra) in [0, plan.vram.reserve + plan.vram.stream_overhead]
        .into_iter()
        .enumerate()
    {
        room += extra;
        loop {
            // The unit that saves the most decode time per byte and fits.
            let mut best: Option<(f64, usize, f64)> = None;
            for (ui, u) in units.iter().enumerate() {
                let bytes = size(u);
                if bytes > room {
                    continue;
                }
                let mut with = resident.clone();
                for &k in u {
                    with[k] = true;
                }
                let t = step_s(&with);
                let gain = (now - t) / bytes.max(1) as f64;
                // It must save more over the workload than its copy costs.
                let pays = (now - t) * steps > copy_s(bytes);
                if pays && now - t > 1e-9 && best.map_or(true, |b| gain > b.0) {
                    best = Some((gain, ui, t));
                }
            }
            let Some((_, ui, t)) = best else {
                break;
            };
            let u = units.swap_remove(ui);
            let bytes = size(&u);
            for &k in &u {
                resident[k] = true;
            }
            room -= bytes;
            now = t;
            chosen.push(DecodeUnit {
                weights: u.iter().map(|&k| model.tensors[ev.tensors[k]].name.clone()).collect(),
                bytes,
            });
        }
        if pass == 0 {
            planned = (now, chosen.len());
        }
    }
    let (now, n_planned) = planned;
    // The switch itself (buffers, graphs) must pay too, with the planned
    // units; a tier without units saves nothing, so it never does.
    let switch_s = cm.overheads.decode_tier_layer_s * model.n_layer as f64;
    if (before - now) * steps <= switch_s + copy_s(chosen[..n_planned].iter().map(|u| u.bytes).sum()) {
        return None;
    }
    Some(DecodeTier {
        ubatch,
        compute,
        beyond: chosen.len() - n_planned,
        units: chosen,
        predicted_decode_tok_s: 1.0 / now,
    })
}

/// Predicted seconds of `plan`'s workload with its decode tier, if any:
/// the prompt, the switch into the tier and its copies, then the generated
/// tokens at the tier's speed.
pub fn planned_seconds(model: &ModelInfo, cm: &CostModel<'_>, plan: &Plan) -> f64 {
    let Some(tier) = &plan.decode_tier else {
        return plan.predicted_seconds();
    };
    let link = cm.link_bw().max(1e-12);
    let switch_s = cm.overheads.decode_tier_layer_s * model.n_layer as f64;
    plan.predicted.ttft_s
        + switch_s
        + tier.bytes() as f64 / link
        + plan.workload.gen_tokens as f64 / tier.predicted_decode_tok_s.max(1e-12)
}

impl Plan {
    /// This plan with `units` of its decode tier resident as well and its
    /// compute buffers at the decode tier's size: the decisions in force
    /// while decoding. Their ops run on the GPU in every tier; the others'
    /// decisions (streaming, the CPU, the split shares) stay.
    pub fn decoding(&self, n_units: usize) -> Plan {
        let mut p = self.clone();
        let Some(tier) = self.decode_tier.as_ref() else {
            return p;
        };
        let names: std::collections::HashSet<&str> = tier
            .units
            .iter()
            .take(n_units)
            .flat_map(|u| u.weights.iter().map(String::as_str))
            .collect();
        for t in p.tensors.iter_mut().filter(|t| names.contains(t.name.as_str())) {
            t.resident = true;
            for e in t.exec.iter_mut() {
                e.1 = Exec::Resident;
            }
            t.gpu_share.clear();
        }
        p.vram.weights = p.resident_bytes();
        p.vram.compute = tier.compute;
        p.vram.total =
            super::VramBreakdown::total_with(p.vram.persistent(), p.vram.language_peak(), p.vram.vision_peak);
        p.decode_tier = None;
        p
    }
}
