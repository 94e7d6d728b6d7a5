//! The cost model: predicted seconds of each weight-using op for a ubatch of
//! `n` tokens, on the GPU with the weight resident, on the GPU with the
//! weight streamed over the link, or on the CPU; plus attention and the
//! price of moving activations between devices.

use serde::{Deserialize, Serialize};

use crate::gguf::{ModelInfo, ModelTensor, TensorRole};
use crate::profile::{Device, MachineProfile};

/// Where a weight-using op runs for one tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Exec {
    /// Weight resident in VRAM, op on the GPU.
    Resident,
    /// Weight in pinned host RAM, copied to the GPU for the op.
    Stream,
    /// Weight in host RAM, op on the CPU.
    Cpu,
}

/// How host weights reach the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Streaming {
    /// llama.cpp's scheduler today: each copy waits for the device, then the op runs.
    Synchronous,
    /// Copies of the next split overlap the current split's compute (two
    /// slots): each streamed op costs the longer of its copy and its compute.
    Overlapped,
    /// With three or more slots the copy stream also runs ahead through
    /// splits that stream nothing (attention): a ubatch costs the longer of
    /// all its copies and all its compute.
    Pipelined,
}

impl Streaming {
    /// The streaming mode of a scheduler with `slots` streaming slots.
    pub fn with_slots(slots: u32) -> Streaming {
        match slots {
            0 => Streaming::Synchronous,
            1 | 2 => Streaming::Overlapped,
            _ => Streaming::Pipelined,
        }
    }
}

/// Fixed costs the profile cannot measure per op.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Overheads {
    /// Seconds per switch between CPU and GPU within a graph (synchronisation
    /// and a small activation copy).
    pub device_switch_s: f64,
    /// Seconds per streamed weight for issuing and waiting on the copy.
    pub stream_issue_s: f64,
}

impl Default for Overheads {
    fn default() -> Self {
        Overheads {
            device_switch_s: 25e-6,
            stream_issue_s: 15e-6,
        }
    }
}

/// The cost model for one model on one machine.
pub struct CostModel<'a> {
    pub model: &'a ModelInfo,
    pub profile: &'a MachineProfile,
    pub streaming: Streaming,
    /// Host weights are in pinned memory (loaded without mmap).
    pub pinned: bool,
    pub overheads: Overheads,
}

/// Whether a tensor is a matmul weight the planner places (as opposed to
/// norms, biases and the input embedding, which are tiny or always on the CPU).
pub fn is_placeable(t: &ModelTensor) -> bool {
    t.dims.len() >= 2 && !t.is_bias() && t.role != TensorRole::TokenEmbd && t.dims[1] > 1
}

impl CostModel<'_> {
    fn link_bw(&self) -> f64 {
        match &self.profile.link {
            Some(l) if self.pinned => l.h2d_pinned,
            Some(l) => l.h2d_pageable,
            None => 0.0,
        }
    }

    /// Fraction of a model's experts that a ubatch of `n` tokens touches.
    pub fn experts_touched(&self, n: u64) -> f64 {
        let e = self.model.n_expert.max(1) as f64;
        let u = self.model.n_expert_used.max(1) as f64;
        1.0 - (1.0 - u / e).powf(n as f64)
    }

    /// Seconds of the op using `t` for a ubatch of `n` tokens when executed as `exec`.
    pub fn op_seconds(&self, t: &ModelTensor, n: u64, exec: Exec) -> f64 {
        let (k, rows) = (t.dims[0], t.dims[1]);
        let experts = t.dims.get(2).copied().unwrap_or(1);
        let is_expert = t.role.is_routed_expert() && experts > 1;
        let compute = |device: Device| {
            if is_expert {
                self.profile.expert_seconds(
                    device,
                    t.ty,
                    k,
                    rows,
                    (experts, self.model.n_expert_used.max(1) as u64),
                    n,
                )
            } else {
                // The output projection only runs for the tokens that need logits.
                let n = if t.role == TensorRole::Output { 1 } else { n };
                self.profile.matmul_seconds(device, t.ty, k, rows * experts, n, false)
            }
        };
        match exec {
            Exec::Resident => compute(Device::Gpu),
            Exec::Cpu => compute(Device::Cpu),
            Exec::Stream => {
                let bw = self.link_bw();
                if bw <= 0.0 {
                    return f64::INFINITY;
                }
                let copy = self.copy_seconds(t, n);
                let gpu = compute(Device::Gpu);
                match self.streaming {
                    Streaming::Synchronous => copy + gpu,
                    Streaming::Overlapped => copy.max(gpu),
                    // The copy is priced per ubatch, see `copy_seconds`.
                    Streaming::Pipelined => gpu + self.overheads.stream_issue_s,
                }
            }
        }
    }

    /// Seconds the link is busy streaming `t` for a ubatch of `n` tokens.
    pub fn copy_seconds(&self, t: &ModelTensor, n: u64) -> f64 {
        let bw = self.link_bw();
        if bw <= 0.0 {
            return f64::INFINITY;
        }
        let experts = t.dims.get(2).copied().unwrap_or(1);
        let frac = if t.role.is_routed_expert() && experts > 1 {
            self.experts_touched(n)
        } else {
            1.0
        };
        t.nbytes as f64 * frac / bw + self.overheads.stream_issue_s
    }

    /// The cheaper of streaming and CPU for a host weight, judged op by op
    /// (a pipelined copy counts in full here: the link is shared).
    pub fn best_host_exec(&self, t: &ModelTensor, n: u64) -> (Exec, f64) {
        let s = match self.streaming {
            Streaming::Pipelined => self.op_seconds(t, n, Exec::Stream).max(self.copy_seconds(t, n)),
            _ => self.op_seconds(t, n, Exec::Stream),
        };
        let c = self.op_seconds(t, n, Exec::Cpu);
        if s < c {
            (Exec::Stream, s)
        } else {
            (Exec::Cpu, c)
        }
    }

    /// Attention (flash attention over the KV cache) for one layer.
    pub fn attention_seconds(&self, layer: u32, n: u64, n_kv: u64, kv_on_gpu: bool) -> f64 {
        let n_head = self.model.n_head.get(layer as usize).copied().unwrap_or(0) as u64;
        if n_head == 0 {
            return 0.0;
        }
        let n_kv = match (self.model.is_swa(layer), self.model.sliding_window) {
            (true, Some(w)) => n_kv.min(w),
            _ => n_kv,
        };
        let device = if kv_on_gpu { Device::Gpu } else { Device::Cpu };
        self.profile
            .attention_seconds(device, self.model.head_dim_k, n_head, n, n_kv)
    }
}
