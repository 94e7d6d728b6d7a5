//! Turning a [`Plan`] into load-time placement and per-op offload decisions
//! for the engine (patch 0002).

use std::collections::HashMap;
use std::sync::Arc;

use super::{Exec, Plan};
use crate::engine::{self, BufferType, DeviceKind, Offload, OffloadPolicy, OffloadQuery, TensorPlacement};

/// Why a plan cannot be applied on this machine.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(
        "the plan keeps weights in VRAM but no GPU backend is loaded (is libggml-cuda.so in the backend directory?)"
    )]
    NoGpu,
}

/// What the engine needs to run a plan.
pub struct Applied {
    pub placement: TensorPlacement,
    pub offload: OffloadPolicy,
    /// Layers (from the last) whose KV cache lives on the GPU.
    pub n_gpu_layers: i32,
    /// Host weights must be pinned to stream fast, which needs mmap off.
    pub use_mmap: bool,
    pub n_ubatch: u32,
}

fn gpu_buffer_types() -> Option<(BufferType, Option<BufferType>)> {
    let dev = engine::list_devices().into_iter().find(|d| d.kind == DeviceKind::Gpu)?;
    engine::device_buffer_types(dev.index)
}

/// Build the placement callback and offload policy for `plan`.
pub fn apply(plan: &Plan) -> Result<Applied, ApplyError> {
    let (gpu, host) = gpu_buffer_types().ok_or(ApplyError::NoGpu)?;
    let cpu = engine::device_buffer_types(
        engine::list_devices()
            .into_iter()
            .find(|d| d.kind == DeviceKind::Cpu)
            .map_or(0, |d| d.index),
    )
    .map(|(b, _)| b);
    let host_buft = if plan.pinned { host.or(cpu) } else { cpu };

    let homes: HashMap<String, Option<BufferType>> = plan
        .tensors
        .iter()
        .map(|t| (t.name.clone(), if t.resident { Some(gpu) } else { host_buft }))
        .collect();
    let placement: TensorPlacement = Arc::new(move |name: &str| homes.get(name).copied().flatten());

    let tiers = plan.tiers.clone();
    let execs: HashMap<String, Vec<(u32, Exec)>> = plan
        .tensors
        .iter()
        .filter(|t| !t.resident)
        .map(|t| (t.name.clone(), t.exec.clone()))
        .collect();
    let offload: OffloadPolicy = Arc::new(move |q: &OffloadQuery<'_>| {
        let Some(per_tier) = execs.get(q.weight) else {
            return Offload::Default;
        };
        let n = q.n_tokens.max(1) as u32;
        let tier = tiers
            .iter()
            .copied()
            .find(|&t| t >= n)
            .unwrap_or_else(|| *tiers.last().unwrap_or(&1));
        match per_tier.iter().find(|(t, _)| *t == tier).map(|(_, e)| *e) {
            Some(Exec::Stream) => Offload::Gpu,
            Some(Exec::Cpu) => Offload::Cpu,
            _ => Offload::Default,
        }
    });
    Ok(Applied {
        placement,
        offload,
        // With every layer's KV on the GPU, offload the output layer too
        // (llama.cpp counts it as one more layer), so output_norm is there.
        n_gpu_layers: if plan.kv_gpu_layers >= plan.n_layer {
            plan.n_layer as i32 + 1
        } else {
            plan.kv_gpu_layers as i32
        },
        use_mmap: !plan.pinned,
        n_ubatch: plan.ubatch,
    })
}
