//! Plans across several devices, in the pipeline order of llama.cpp's layer
//! split (`-sm layer`): each device holds a contiguous run of layers, the
//! first device the first layers; a token passes through them one device
//! after the other.
//!
//! Each device's layers are planned as today's one-device plan, against that
//! device's budget, profile and link: its resident weights in its memory,
//! its host weights streamed over its link or computed on the CPU. Only the
//! first device streams: llama.cpp's scheduler takes an op on a host weight
//! to the first device of a split, so the later devices' host weights are
//! planned (and run) on the CPU. The devices run one after the other, so
//! the prediction sums theirs. llama.cpp runs the devices of a layer split
//! in parallel (pipeline copies, `GGML_SCHED_MAX_COPIES`) only without
//! tensor overrides, which every plan with host weights has: the plan
//! assumes one scheduler copy, so nothing overlaps between the devices.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{make_plan, Plan, PlanError, PlanRequest, Prediction};
use crate::gguf::{ModelInfo, TensorRole};
use crate::profile::MachineProfile;

/// One device a plan may use.
#[derive(Debug, Clone)]
pub struct DeviceShare<'p> {
    /// ggml's name of the device (`CUDA0`, `RPC0`).
    pub device: String,
    /// Device memory the process may use there, bytes.
    pub budget: u64,
    /// The measurements of this device, its link and the host's CPU.
    pub profile: &'p MachineProfile,
}

/// One device's part of a [`DevicesPlan`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DevicePart {
    pub device: String,
    /// The first of its layers.
    pub first_layer: u32,
    /// Its layers' plan; its tensors carry the model's layer numbers, its
    /// `n_layer` and `kv_gpu_layers` count this device's layers.
    pub plan: Plan,
}

impl DevicePart {
    /// One past its last layer.
    pub fn end_layer(&self) -> u32 {
        self.first_layer + self.plan.n_layer
    }
}

/// A plan across devices: the layer split and each device's plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DevicesPlan {
    pub model: String,
    pub n_layer: u32,
    /// The ubatch every device's plan shares (one context runs them all).
    pub ubatch: u32,
    /// In pipeline order.
    pub parts: Vec<DevicePart>,
    /// The devices one after the other: TTFT and decode time add up.
    pub predicted: Prediction,
}

impl DevicesPlan {
    /// Predicted seconds for the workload.
    pub fn predicted_seconds(&self) -> f64 {
        let gen = self.parts.first().map_or(0, |p| p.plan.workload.gen_tokens);
        self.predicted.ttft_s + gen as f64 / self.predicted.decode_tok_s.max(1e-12)
    }
}

/// llama.cpp's parameters that place a [`DevicesPlan`]'s layers: its
/// `n_gpu_layers` (`-ngl`) and `tensor_split` (`-ts`), one figure per
/// device in the plan's order, with `split_mode` layer (`-sm layer`).
#[derive(Debug, Clone, PartialEq)]
pub struct LayerSplit {
    pub n_gpu_layers: u32,
    pub tensor_split: Vec<f32>,
}

impl DevicesPlan {
    /// The layer split in llama.cpp's terms. Its layers from `n_layer + 1 -
    /// n_gpu_layers` on (the output head counts as layer `n_layer`) go to
    /// the devices by the cumulative shares of `tensor_split`; whole layer
    /// counts as the shares make each boundary exact, since llama.cpp
    /// compares the same float quotients.
    pub fn layer_split(&self) -> LayerSplit {
        let Some(first) = self.parts.first() else {
            return LayerSplit {
                n_gpu_layers: 0,
                tensor_split: Vec::new(),
            };
        };
        // The first device's first layers whose KV is in host memory are
        // CPU layers.
        let cpu_layers = first.plan.n_layer - first.plan.kv_gpu_layers.min(first.plan.n_layer);
        let last = self.parts.len() - 1;
        let tensor_split = self
            .parts
            .iter()
            .enumerate()
            .map(|(d, p)| {
                let own = p.plan.n_layer - if d == 0 { cpu_layers } else { 0 };
                (own + u32::from(d == last)) as f32
            })
            .collect();
        LayerSplit {
            n_gpu_layers: self.n_layer + 1 - cpu_layers,
            tensor_split,
        }
    }
}

/// Plan `model` across `devices` (in pipeline order) for `req`; `req.budget`
/// is ignored (each device has its own). Searches the layer split from the
/// one proportional to the budgets, and the ubatch that all devices share.
pub fn make_devices_plan(
    model: &ModelInfo,
    devices: &[DeviceShare<'_>],
    req: &PlanRequest,
) -> Result<DevicesPlan, PlanError> {
    if devices.is_empty() || devices.len() > model.n_layer as usize {
        return Err(PlanError::Invalid(format!(
            "{} devices for a model of {} layers",
            devices.len(),
            model.n_layer
        )));
    }
    let ubatches: Vec<Option<u32>> = match req.ubatch {
        Some(u) => vec![Some(u)],
        None => [512u32, 1024, 2048, 4096]
            .into_iter()
            .filter(|&u| u64::from(u) <= req.workload.prompt_tokens.max(512))
            .map(Some)
            .collect(),
    };
    let mut best: Option<DevicesPlan> = None;
    let mut first_err = None;
    for ubatch in ubatches {
        let req = PlanRequest { ubatch, ..req.clone() };
        match search_split(model, devices, &req) {
            Ok(p)
                if !best
                    .as_ref()
                    .is_some_and(|b| b.predicted_seconds() <= p.predicted_seconds()) =>
            {
                best = Some(p)
            }
            Ok(_) => {}
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    best.ok_or_else(|| first_err.unwrap_or_else(|| PlanError::Invalid("no ubatch to plan".into())))
}

/// The best layer split for `req`'s ubatch: from the split proportional to
/// the budgets, move each boundary by a few layers while that helps.
fn search_split(model: &ModelInfo, devices: &[DeviceShare<'_>], req: &PlanRequest) -> Result<DevicesPlan, PlanError> {
    let mut memo = Parts::new();
    let mut bounds = proportional_bounds(model, devices);
    let mut best = plan_split(model, devices, req, &bounds, &mut memo);
    for _ in 0..4 {
        let mut moved = false;
        for i in 1..devices.len() {
            for delta in [-4i64, -2, -1, 1, 2, 4] {
                let b = i64::from(bounds[i]) + delta;
                if b <= i64::from(bounds[i - 1]) || b >= i64::from(bounds[i + 1]) {
                    continue;
                }
                let mut cand = bounds.clone();
                cand[i] = b as u32;
                let p = plan_split(model, devices, req, &cand, &mut memo);
                if better(&p, &best) {
                    (bounds, best, moved) = (cand, p, true);
                }
            }
        }
        if !moved {
            break;
        }
    }
    best
}

fn better(a: &Result<DevicesPlan, PlanError>, b: &Result<DevicesPlan, PlanError>) -> bool {
    match (a, b) {
        (Ok(a), Ok(b)) => a.predicted_seconds() < b.predicted_seconds(),
        (Ok(_), Err(_)) => true,
        _ => false,
    }
}

/// Layer boundaries (device d holds `bounds[d]..bounds[d + 1]`) that give
/// each device a share of the layers' bytes proportional to its budget,
/// at least one layer each.
pub fn proportional_bounds(model: &ModelInfo, devices: &[DeviceShare<'_>]) -> Vec<u32> {
    let n = model.n_layer;
    let total_budget: f64 = devices.iter().map(|d| d.budget as f64).sum::<f64>().max(1.0);
    let layer_bytes: Vec<f64> = (0..n).map(|l| model.layer_bytes(l) as f64).collect();
    let total_bytes: f64 = layer_bytes.iter().sum::<f64>().max(1.0);
    let mut bounds = vec![0u32];
    let (mut acc, mut share, mut l) = (0.0, 0.0, 0u32);
    for (d, dev) in devices.iter().enumerate().take(devices.len() - 1) {
        share += dev.budget as f64 / total_budget;
        while l < n && (acc + layer_bytes[l as usize] / 2.0) / total_bytes < share {
            acc += layer_bytes[l as usize];
            l += 1;
        }
        // At least one layer here and one for every device after it.
        let left = (devices.len() - 1 - d) as u32;
        l = l.max(bounds[d] + 1).min(n - left);
        bounds.push(l);
    }
    bounds.push(n);
    bounds
}

/// Each device's plan for its layers, kept while the split is searched: a
/// device's plan depends on its layers only.
type Parts = HashMap<(usize, u32, u32), Result<DevicePart, String>>;

/// Each device's plan for the split `bounds`, and their sum.
fn plan_split(
    model: &ModelInfo,
    devices: &[DeviceShare<'_>],
    req: &PlanRequest,
    bounds: &[u32],
    memo: &mut Parts,
) -> Result<DevicesPlan, PlanError> {
    let mut parts = Vec::with_capacity(devices.len());
    for (d, dev) in devices.iter().enumerate() {
        let (first, end) = (bounds[d], bounds[d + 1]);
        let part = memo
            .entry((d, first, end))
            .or_insert_with(|| plan_part(model, devices.len(), d, dev, req, first, end))
            .clone();
        parts.push(part.map_err(PlanError::Invalid)?);
    }
    let ttft_s = parts.iter().map(|p| p.plan.predicted.ttft_s).sum::<f64>();
    let token_s = parts
        .iter()
        .map(|p| 1.0 / p.plan.predicted.decode_tok_s.max(1e-12))
        .sum::<f64>();
    // Each part's decode speed counts every sequence's tokens; a token
    // takes the parts' times one after the other.
    let prompt = req.workload.prompt_tokens as f64;
    Ok(DevicesPlan {
        model: model_name(model),
        n_layer: model.n_layer,
        ubatch: parts.first().map_or(0, |p| p.plan.ubatch),
        predicted: Prediction {
            ttft_s,
            prompt_tok_s: prompt / ttft_s.max(1e-12),
            decode_tok_s: 1.0 / token_s,
            speculation: None,
        },
        parts,
    })
}

/// The streaming slots a device's plan may use, up to `most` (the
/// request's): each device holds its own slots, which at a few GiB per
/// device can cost more resident weights than their overlap saves; the
/// devices' times add up, so each device takes its own best.
fn slot_candidates(most: u32) -> impl Iterator<Item = u32> {
    [most, 2, 1]
        .into_iter()
        .enumerate()
        .filter(move |&(i, s)| i == 0 || (s < most && s > 0))
        .map(|(_, s)| s)
}

/// Device `d`'s (of `n`) plan for the layers `first..end`, with the
/// streaming slots that serve it best.
fn plan_part(
    model: &ModelInfo,
    n: usize,
    d: usize,
    dev: &DeviceShare<'_>,
    req: &PlanRequest,
    first: u32,
    end: u32,
) -> Result<DevicePart, String> {
    let sub = layer_slice(model, first, end, d == 0, d + 1 == n);
    // llama.cpp makes only the model's first layers CPU layers (its
    // n_gpu_layers counts from the last): the first device's plan may keep
    // its first layers' KV in host memory, every later device keeps all of
    // its layers' KV. The decode tier's swap of residency between a prompt
    // and its decoding is a one-device session's, which a split has not got.
    let req = PlanRequest {
        budget: dev.budget,
        kv_gpu_layers: if d == 0 { req.kv_gpu_layers } else { Some(end - first) },
        decode_tier: false,
        ..req.clone()
    };
    let profile = part_profile(dev.profile, d);
    let mut plan = slot_candidates(req.stream_slots)
        .filter_map(|stream_slots| {
            make_plan(
                &sub,
                &profile,
                &PlanRequest {
                    stream_slots,
                    ..req.clone()
                },
            )
            .ok()
        })
        .min_by(|a, b| a.predicted_seconds().total_cmp(&b.predicted_seconds()))
        .map_or_else(|| make_plan(&sub, &profile, &req), Ok)
        .map_err(|e| format!("{} (layers {first}-{}): {e}", dev.device, end - 1))?;
    for t in &mut plan.tensors {
        t.layer = t.layer.map(|l| l + first);
    }
    plan.model = model_name(model);
    Ok(DevicePart {
        device: dev.device.clone(),
        first_layer: first,
        plan,
    })
}

/// The profile device `d` of a split is planned with. llama.cpp's
/// scheduler offloads an op on a host weight to the first device of a
/// split only, so a later device's host weights are computed on the CPU,
/// next to them: its plan sees no bandwidth to stream them with.
fn part_profile(profile: &MachineProfile, d: usize) -> MachineProfile {
    let mut p = profile.clone();
    if let (1.., Some(link)) = (d, p.link.as_mut()) {
        link.h2d_pinned = 0.0;
        link.h2d_pageable = 0.0;
    }
    p
}

fn model_name(model: &ModelInfo) -> String {
    model.name.clone().unwrap_or_else(|| model.architecture.clone())
}

/// The layers `first..end` of `model` as a model of their own, numbered
/// from 0 (tensor names keep the model's numbers); the input embeddings
/// go with the first part, the output head with the last.
pub fn layer_slice(model: &ModelInfo, first: u32, end: u32, input: bool, output: bool) -> ModelInfo {
    let n = model.n_layer as usize;
    let range = first as usize..end as usize;
    fn slice<T: Clone>(v: &[T], n: usize, r: std::ops::Range<usize>) -> Vec<T> {
        if v.len() == n {
            v[r].to_vec()
        } else {
            v.to_vec()
        }
    }
    let keep = |t: &crate::gguf::ModelTensor| match t.layer {
        Some(l) => (first..end).contains(&l),
        None if t.role == TensorRole::TokenEmbd => input,
        None => output,
    };
    ModelInfo {
        n_layer: end - first,
        n_ff: slice(&model.n_ff, n, range.clone()),
        n_head: slice(&model.n_head, n, range.clone()),
        n_head_kv: slice(&model.n_head_kv, n, range.clone()),
        swa_layers: slice(&model.swa_layers, n, range.clone()),
        recurrent_layers: slice(&model.recurrent_layers, n, range),
        kv_layers_end: model.kv_layers_end.clamp(first, end) - first,
        tensors: model
            .tensors
            .iter()
            .filter(|t| keep(t))
            .map(|t| crate::gguf::ModelTensor {
                layer: t.layer.map(|l| l - first),
                ..t.clone()
            })
            .collect(),
        tied_output: model.tied_output && output,
        ..model.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Exec;
    use pipeshard_devtools::synth::{model_info, Quant};

    #[test]
    fn a_slice_renumbers_its_layers_and_takes_the_ends_it_is_given() {
        let m = model_info("llama3.1-8b", Quant::Q4_0).unwrap();
        let first = layer_slice(&m, 0, 10, true, false);
        let last = layer_slice(&m, 10, m.n_layer, false, true);
        assert_eq!((first.n_layer, last.n_layer), (10, m.n_layer - 10));
        let has = |s: &ModelInfo, role| s.tensors.iter().any(|t| t.role == role);
        assert!(has(&first, TensorRole::TokenEmbd) && !has(&first, TensorRole::Output));
        assert!(!has(&last, TensorRole::TokenEmbd) && has(&last, TensorRole::Output));
        let t = last.tensors.iter().find(|t| t.layer == Some(0)).unwrap();
        assert!(t.name.starts_with("blk.10."), "{}", t.name);
        assert_eq!(first.tensors.len() + last.tensors.len(), m.tensors.len());
    }

    /// The device llama.cpp's `load_tensors` gives layer `il` (the output
    /// head is `n_layer`) under `split`, or None for the CPU: its formula,
    /// in its f32 arithmetic.
    fn llama_device(split: &LayerSplit, n_layer: u32, il: u32) -> Option<usize> {
        let i_gpu_start = (n_layer + 1).saturating_sub(split.n_gpu_layers);
        let act = split.n_gpu_layers.min(n_layer + 1);
        if il < i_gpu_start || il - i_gpu_start >= act {
            return None;
        }
        let mut sum = 0.0f32;
        let mut cum: Vec<f32> = split
            .tensor_split
            .iter()
            .map(|s| {
                sum += s;
                sum
            })
            .collect();
        for c in &mut cum {
            *c /= sum;
        }
        let x = (il - i_gpu_start) as f32 / act as f32;
        Some(cum.iter().position(|&c| c > x).unwrap_or(cum.len()))
    }

    fn gpu_machine_profile() -> crate::profile::MachineProfile {
        crate::profile::MachineProfile::load(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpu-machine-profile.yaml"),
        )
        .unwrap()
    }

    #[test]
    fn llamas_layer_split_puts_every_layer_where_the_plan_does() {
        let m = model_info("llama3.1-8b", Quant::Q4_0).unwrap();
        let p = gpu_machine_profile();
        let share = |device: &str, budget| DeviceShare {
            device: device.into(),
            budget,
            profile: &p,
        };
        for budgets in [[1u64 << 30, 1 << 30, 1 << 30], [2 << 30, 1 << 30, 3 << 30]] {
            let devices = [share("A", budgets[0]), share("B", budgets[1]), share("C", budgets[2])];
            let mut req = PlanRequest::new(0, 4096);
            req.ubatch = Some(512);
            let plan = make_devices_plan(&m, &devices, &req).unwrap();
            let split = plan.layer_split();
            let cpu_layers = plan.parts[0].plan.n_layer - plan.parts[0].plan.kv_gpu_layers;
            for (d, part) in plan.parts.iter().enumerate() {
                for il in part.first_layer..part.end_layer() {
                    let want = (il >= cpu_layers).then_some(d);
                    assert_eq!(llama_device(&split, m.n_layer, il), want, "layer {il} of {split:?}");
                }
            }
            assert_eq!(llama_device(&split, m.n_layer, m.n_layer), Some(plan.parts.len() - 1));
        }
    }

    #[test]
    fn only_the_first_device_streams_host_weights() {
        let m = model_info("llama3.1-8b", Quant::Q4_0).unwrap();
        let p = gpu_machine_profile();
        let share = |device: &str, gib: u64| DeviceShare {
            device: device.into(),
            budget: gib << 30,
            profile: &p,
        };
        let mut req = PlanRequest::new(0, 4096);
        req.ubatch = Some(512);
        let streamed = |part: &DevicePart| {
            part.plan
                .tensors
                .iter()
                .filter(|t| !t.resident && t.exec.iter().any(|(_, e)| *e == Exec::Stream))
                .count()
        };
        for (a, b) in [(1, 1), (2, 2), (1, 3), (3, 1)] {
            let plan = make_devices_plan(&m, &[share("A", a), share("B", b)], &req).unwrap();
            // The model does not fit: the first device streams.
            assert!(streamed(&plan.parts[0]) > 0, "{a}+{b} GiB");
            assert_eq!(streamed(&plan.parts[1]), 0, "{a}+{b} GiB");
            // No part swaps residency after the prompt: that is a
            // one-device session's.
            assert!(plan.parts.iter().all(|p| p.plan.decode_tier.is_none()), "{a}+{b} GiB");
        }
    }

    #[test]
    fn proportional_bounds_follow_the_budgets_and_leave_each_device_a_layer() {
        let m = model_info("llama3.1-8b", Quant::Q4_0).unwrap();
        let p = gpu_machine_profile();
        let share = |budget| DeviceShare {
            device: "GPU".into(),
            budget,
            profile: &p,
        };
        assert_eq!(proportional_bounds(&m, &[share(1), share(1)]), [0, 16, 32]);
        assert_eq!(proportional_bounds(&m, &[share(1), share(3)]), [0, 8, 32]);
        assert_eq!(
            proportional_bounds(&m, &[share(1), share(0), share(0)]),
            [0, 30, 31, 32]
        );
    }
}
