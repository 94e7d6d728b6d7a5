//! Turning a [`DevicesPlan`] into llama.cpp's layer split: the devices and
//! their shares of the layers (`-dev`, `-ts`, `-sm layer`), each weight's
//! buffer type (its layer's device, or host memory), and the per-op
//! decisions of each device's plan for its own layers.
//!
//! Two limits of the pinned llama.cpp shape what runs:
//! - its scheduler offloads an op with a host weight to the first device
//!   that takes it (the first of the split), not to the layer's own: the
//!   first device's host weights stream as its plan says, while the later
//!   devices' plans compute their host weights on the CPU, next to them
//!   ([`super::devices`]), which their offload decisions hold to, so that no
//!   weight crosses to another layer's device;
//! - pipeline parallelism (`GGML_SCHED_MAX_COPIES`) is meant for splits
//!   without tensor overrides: with several scheduler copies the compute
//!   buffers would be reserved once per copy, beyond the plans' budgets, and
//!   weight streaming refuses to run. A tensor override that matches no
//!   weight keeps llama.cpp to one copy, which is what the plans price.

use std::collections::HashMap;
use std::sync::Arc;

use super::apply::{apply_with, Applied, ApplyError};
use super::devices::DevicesPlan;
use crate::engine::{self, BufferType, ModelParams, MoeSplitPolicy, Offload, OffloadPolicy, RowSplitPolicy};

/// A tensor-override pattern no weight name matches: its presence alone
/// turns llama.cpp's pipeline parallelism off.
pub const NO_PIPELINE_OVERRIDE: &str = "^pipeshard: one scheduler copy$";

/// What the engine needs to run a plan across devices.
pub struct AppliedDevices {
    /// The first device's settings, with every device's placement and
    /// per-op decisions.
    pub applied: Applied,
    /// ggml's device indices, in the plan's (pipeline) order.
    pub devices: Vec<usize>,
    /// Each device's share of the offloaded layers (`-ts`).
    pub tensor_split: Vec<f32>,
    /// The buffer type each device's resident weights load into.
    pub device_bufts: Vec<BufferType>,
    /// The buffer type host weights load into.
    pub host_buft: BufferType,
}

impl AppliedDevices {
    /// Load-time settings: the layer split, placement, KV layers, mmap.
    pub fn configure_model(&self, params: &mut ModelParams<'_>) {
        self.applied.configure_model(params);
        params.devices = self.devices.clone();
        params.tensor_split = self.tensor_split.clone();
        params
            .tensor_overrides
            .push((NO_PIPELINE_OVERRIDE.to_string(), self.host_buft));
    }
}

/// Build the layer split, placement and per-op policies of `plan`, whose
/// parts run on the ggml devices `devices` (indices, in the plan's order).
pub fn apply_devices(plan: &DevicesPlan, devices: &[usize]) -> Result<AppliedDevices, ApplyError> {
    let first = plan.parts.first().ok_or(ApplyError::NoGpu)?;
    if devices.len() != plan.parts.len() {
        return Err(ApplyError::Devices(format!(
            "{} devices for a plan of {} parts",
            devices.len(),
            plan.parts.len()
        )));
    }
    let device_bufts = devices
        .iter()
        .zip(&plan.parts)
        .map(|(&d, part)| {
            engine::device_buffer_types(d)
                .map(|(b, _)| b)
                .ok_or_else(|| ApplyError::Devices(format!("{}: ggml gives it no buffer type", part.device)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let host_buft = host_buffer_type(plan, devices)?;
    let homes: HashMap<String, BufferType> = plan
        .parts
        .iter()
        .zip(&device_bufts)
        .flat_map(|(part, &buft)| {
            part.plan
                .tensors
                .iter()
                .map(move |t| (t.name.clone(), if t.resident { buft } else { host_buft }))
        })
        .collect();
    let mut applied = apply_with(&first.plan, Arc::new(move |name: &str| homes.get(name).copied()));
    let owner = owners(plan);
    applied.offload = offload_policy(plan, owner.clone());
    applied.moe_split = moe_split_policy(plan);
    applied.row_split = row_split_policy(plan, owner);
    let split = plan.layer_split();
    applied.n_gpu_layers = split.n_gpu_layers as i32;
    applied.use_mmap = !plan.parts.iter().any(|p| p.plan.pinned);
    applied.cpu_weight_copies = plan.parts.iter().any(|p| p.plan.cpu_weight_copies);
    Ok(AppliedDevices {
        applied,
        devices: devices.to_vec(),
        tensor_split: split.tensor_split,
        device_bufts,
        host_buft,
    })
}

/// Where host weights live: the pinned host memory of the first device
/// that has it when a part pins its weights, else plain CPU memory.
fn host_buffer_type(plan: &DevicesPlan, devices: &[usize]) -> Result<BufferType, ApplyError> {
    let cpu = engine::first_device(engine::DeviceKind::Cpu)
        .and_then(|d| engine::device_buffer_types(d.index))
        .map(|(b, _)| b)
        .ok_or_else(|| ApplyError::Devices("no CPU device".into()))?;
    let pinned = plan.parts.iter().any(|p| p.plan.pinned);
    let host = devices
        .iter()
        .filter_map(|&d| engine::device_buffer_types(d).and_then(|(_, h)| h))
        .next();
    Ok(if pinned { host.unwrap_or(cpu) } else { cpu })
}

/// Each weight's part (index into the plan's parts).
fn owners(plan: &DevicesPlan) -> Arc<HashMap<String, usize>> {
    Arc::new(
        plan.parts
            .iter()
            .enumerate()
            .flat_map(|(d, p)| p.plan.tensors.iter().map(move |t| (t.name.clone(), d)))
            .collect(),
    )
}

/// Each part's own offload decisions for its weights; a later part's host
/// weights stay on the CPU, as its plan computes them (the scheduler would
/// take them to the first device).
fn offload_policy(plan: &DevicesPlan, owner: Arc<HashMap<String, usize>>) -> OffloadPolicy {
    let parts: Vec<OffloadPolicy> = plan
        .parts
        .iter()
        .map(|p| super::apply::policies(&p.plan).offload)
        .collect();
    Arc::new(move |q| match owner.get(q.weight) {
        Some(0) => parts[0](q),
        Some(&d) => match parts[d](q) {
            Offload::Gpu => Offload::Cpu,
            other => other,
        },
        None => Offload::Default,
    })
}

/// The first part's hybrid experts in its own layers; the later parts'
/// layers keep their experts together (on the CPU, as their offload says).
fn moe_split_policy(plan: &DevicesPlan) -> Option<MoeSplitPolicy> {
    let first = plan.parts.first()?;
    let own = super::apply::policies(&first.plan).moe_split?;
    let layers = first.first_layer..first.end_layer();
    Some(Arc::new(move |layer, n_tokens| {
        if layers.contains(&layer) {
            own(layer, n_tokens)
        } else {
            0
        }
    }))
}

/// The first part's dense row split of its own weights.
fn row_split_policy(plan: &DevicesPlan, owner: Arc<HashMap<String, usize>>) -> Option<RowSplitPolicy> {
    let own = super::apply::row_split_policy(&plan.parts.first()?.plan)?;
    Some(Arc::new(move |name, rows, n_tokens| {
        if owner.get(name) == Some(&0) {
            own(name, rows, n_tokens)
        } else {
            0
        }
    }))
}
