//! The cost model: predicted seconds of each weight-using op for a ubatch of
//! `n` tokens, on the GPU with the weight resident, on the GPU with the
//! weight streamed over the link, or on the CPU; plus attention and the
//! price of moving activations between devices.

use serde::{Deserialize, Serialize};

use super::expert_cache::Locality;
use crate::gguf::{GgmlType, ModelInfo, ModelTensor, TensorRole};
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
    /// Routed experts in pinned host RAM, split per token (patch 0006): the
    /// GPU copies and computes some of each token's experts while the CPU
    /// computes the others.
    Hybrid,
    /// A dense feed-forward weight in pinned host RAM, split by rows (patch
    /// 0017): the GPU streams and computes a share of its rows while the
    /// CPU computes the others in place, at the same time.
    Split,
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

/// Batches from this size on compute a host-KV layer's attention on the
/// GPU (their query projections run there); ggml offloads host-weight ops
/// from the same size (`GGML_OP_OFFLOAD_MIN_BATCH`).
pub const GPU_ATTENTION_MIN_BATCH: u64 = 32;

/// The least share of the output projection's rows worth a split (patch
/// 0043).
pub const OUTPUT_SPLIT_MIN: f64 = 0.05;

/// The work of a row-split weight as if one device took all its rows (see
/// [`CostModel::split_parts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SplitParts {
    pub cpu: f64,
    pub gpu: f64,
    pub link: f64,
    pub bytes: f64,
}

impl std::ops::AddAssign for SplitParts {
    fn add_assign(&mut self, o: SplitParts) {
        self.cpu += o.cpu;
        self.gpu += o.gpu;
        self.link += o.link;
        self.bytes += o.bytes;
    }
}

/// One layer's hybrid experts in parts (see [`CostModel::hybrid_parts`]):
/// the GPU's seconds besides its copies, the copies of its experts, and the
/// CPU's seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HybridParts {
    pub gpu: f64,
    pub copies: f64,
    pub cpu: f64,
}

impl HybridParts {
    /// Seconds of the layer when the expert cache holds `hits` of the
    /// experts the GPU computes: the longer of the two parts.
    pub fn seconds(&self, hits: f64) -> f64 {
        (self.gpu + (1.0 - hits.clamp(0.0, 1.0)) * self.copies).max(self.cpu)
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
    /// Seconds per layer and ubatch for the ops priced by none of the
    /// profile's matmul or attention samples: norms, RoPE, activations,
    /// residual adds, a dozen small kernels each. 25 µs is the gap between
    /// predicted and measured decode of R1 with every weight resident on
    /// the H200 (3.04 against 3.83 ms per token over 32 layers,
    /// CHANGELOG.md, session 5).
    #[serde(default = "default_layer_s")]
    pub layer_s: f64,
    /// How much longer the CPU's expert matmuls take in a hybrid split
    /// (patch 0006) than the profile's samples say, because the link reads
    /// host memory for the GPU's part at the same time. On the H200 host the
    /// CPU's part of R2's split at 4 GiB took 1.2–1.5 times its samples for
    /// 2 to 5 experts per token (1.35 on average; the scheduler's timing,
    /// CHANGELOG.md, session 9), and with this factor the
    /// cost model ranks the shares 3 to 6 as measured. The factor is the
    /// host's more than the model's: in session 12 one H200 host took 1.07
    /// times (share 4 then decoded 5-13% faster than 5) and another 1.5-1.6
    /// (share 5 6-17% faster than 4); 1.35 chooses share 5, faster than or
    /// as fast as share 4 on three of the four hosts measured so far
    /// (CHANGELOG.md, session 12).
    #[serde(default = "default_cpu_contention")]
    pub hybrid_cpu_contention: f64,
    /// Seconds per entry of the attention mask (a ubatch's tokens x the KV
    /// cells it sees), which llama.cpp fills on the host before it starts
    /// the ubatch's graph. Later ubatches fill theirs while the GPU runs the
    /// previous one, but the first one's is exposed: a prompt in one ubatch
    /// of 4096 waits for 16.8M entries, two of 2048 for 4.2M. On the H200
    /// upstream's full-GPU pp4096 of R1 is 22 ms slower at ub 4096 than at
    /// ub 2048 where the samples predict it 4 ms faster (CHANGELOG.md,
    /// session 9): 26 ms for 12.6M entries, about 2 ns each. Patch 0032 fills
    /// the mask without a cell lookup per entry: on the H200 host the
    /// full-GPU prompt of R2 in one ubatch of 4096 took 0.302 s with it
    /// against 0.339 s without (CHANGELOG.md, session 13), and the
    /// host's step before the graph that holds the fill went from 83 to
    /// 8 ms in a CUPTI trace; 0.3 ns per entry (5 ms for 16.8M) is an upper
    /// bound of what is left.
    #[serde(default = "default_mask_entry_s")]
    pub mask_entry_s: f64,
    /// Seconds the device waits between two ubatches of a prompt: the
    /// next ubatch's inputs (its embeddings, positions and attention mask)
    /// are copied once the last one is done, then its first split starts.
    /// On the H200, R1's prompt at ub 1024 with every weight resident left
    /// the device idle 1.5-2.2 ms at each boundary (1.8 on average, a
    /// CUPTI trace, CHANGELOG.md, session 12), and as much with
    /// weights streamed once the scheduler stopped waiting there (patch
    /// 0030).
    #[serde(default = "default_ubatch_s")]
    pub ubatch_s: f64,
    /// Seconds per layer that going into the decode tier costs beyond its
    /// copies ([`crate::plan::DecodeTier`]): shrinking the compute buffers
    /// and reserving them twice (graph builds), and the first two steps
    /// after it, which build and capture their graphs again and start the
    /// routed-expert prefetch afresh. On the H200 this came to ~33 ms for
    /// R1 (32 layers: 21 ms to enter with 3 ms of copies, and a second
    /// step 14 ms slower than the others) and 72-80 ms for R2 (48 layers:
    /// 40-51 ms to enter with 8 ms of copies, and two steps 15-20 ms
    /// slower each), CHANGELOG.md, session 14.
    #[serde(default = "default_decode_tier_layer_s")]
    pub decode_tier_layer_s: f64,
    /// Seconds per ubatch that a layer whose routed experts run on the CPU
    /// costs beyond its expert matmuls and its two device switches, shared
    /// among its expert tensors' ops on the CPU: the
    /// ops between and after them on the CPU (the GLU, the weighting and
    /// the sum of each token's experts), each a barrier of the CPU's
    /// threads, and the copies of the router's ids and weights to the host.
    /// On the H200 host upstream's `--cpu-moe` decoded 60-110 µs per layer
    /// slower than the expert samples and the switches price (R2 Q4_0
    /// 76 µs, R2 Q4_K_M 63, R3 MXFP4 81, R4 Q4_K_M 109; each layer's
    /// part of cpu-moe's step less full-GPU's, calls 2026-11-28-a and
    /// 2026-11-29-e). The CPU part of hybrid experts has its own
    /// calibration ([`Overheads::hybrid_cpu_contention`]).
    #[serde(default = "default_cpu_experts_layer_s")]
    pub cpu_experts_layer_s: f64,
    /// Seconds per ubatch of a recurrent (Gated-DeltaNet) layer's mixer
    /// beyond its projections and [`Overheads::layer_s`]: its convolution,
    /// gates, state update and normalisation are a score of small kernels
    /// that no sample prices. Upstream's full-GPU decode of R4
    /// (Qwen3.6-35B-A3B, 30 recurrent layers of 40) took 4.57 ms a token
    /// on the H200 where the samples priced 3.34 ms (call 2026-11-29-e):
    /// 41 µs per recurrent layer.
    #[serde(default = "default_recurrent_layer_s")]
    pub recurrent_layer_s: f64,
    /// Seconds per ubatch that a routed-expert tensor with a bias (gpt-oss)
    /// adds to the CPU's part of a hybrid split ([`CostModel::hybrid_parts`])
    /// beyond its samples, and to the GPU's: the bias is added where its
    /// layer runs (the GPU), so each of the layer's three expert matmuls
    /// hands the CPU's rows over and back before the next starts, where an
    /// unbiased layer (Qwen3-MoE) chains its CPU part. On the H200 host the decode tuner's probes of R3
    /// (gpt-oss-20b MXFP4 at 4 GiB, calibrated routing, no expert cache:
    /// see [`experts_cacheable`]) took 34.88, 32.27 and 34.97 ms per step
    /// with 3 of 4 experts on the GPU (calls 2026-11-29-g R3-cal-1, -h
    /// R3-timing, -j R3-free), where the samples priced 27.3 ms: 7.6 ms
    /// over 24 layers of 3 biased expert tensors, 105 µs each. R2 and R4
    /// (unbiased) are priced within 10% of their measured hybrid decode
    /// (calls 2026-11-29-i, -j).
    #[serde(default = "default_hybrid_bias_s")]
    pub hybrid_bias_s: f64,
}

fn default_hybrid_bias_s() -> f64 {
    105e-6
}

fn default_cpu_experts_layer_s() -> f64 {
    80e-6
}

fn default_recurrent_layer_s() -> f64 {
    41e-6
}

fn default_decode_tier_layer_s() -> f64 {
    1.5e-3
}

fn default_ubatch_s() -> f64 {
    1.8e-3
}

fn default_mask_entry_s() -> f64 {
    0.3e-9
}

fn default_layer_s() -> f64 {
    25e-6
}

fn default_cpu_contention() -> f64 {
    1.35
}

impl Default for Overheads {
    fn default() -> Self {
        Overheads {
            device_switch_s: 25e-6,
            stream_issue_s: 15e-6,
            layer_s: default_layer_s(),
            hybrid_cpu_contention: default_cpu_contention(),
            mask_entry_s: default_mask_entry_s(),
            ubatch_s: default_ubatch_s(),
            decode_tier_layer_s: default_decode_tier_layer_s(),
            cpu_experts_layer_s: default_cpu_experts_layer_s(),
            recurrent_layer_s: default_recurrent_layer_s(),
            hybrid_bias_s: default_hybrid_bias_s(),
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
    /// Ubatches of at most this many tokens stream only the routed experts
    /// of their MoE matmuls, once known, instead of whole expert tensors
    /// ahead of use (patch 0005); see [`CostModel::new`].
    pub routed_max_tokens: u64,
    /// Hybrid experts: how many of each token's routed experts the GPU
    /// computes; `None` lets the cost model choose, `Some(0)` turns them off.
    pub hybrid_gpu_experts: Option<u32>,
    /// Dense row split: the share of a split weight's rows the GPU computes
    /// in decode; `None` lets the cost model choose, `Some(0.0)` turns the
    /// split off.
    pub dense_split: Option<f64>,
    /// GPU math only ([`crate::plan::PlanRequest::exact`]): host weights
    /// always stream, never run on the CPU or split with it.
    pub gpu_only: bool,
    /// The routing locality that prices the expert cache (patch 0040) in
    /// decode; None prices every routed expert as copied.
    pub cache_locality: Option<Locality>,
    /// The sequences share one KV stream ([`crate::plan::KvStreams`]): a
    /// token's attention runs over the cells of all of them (the others'
    /// masked), not over its own sequence's.
    pub kv_unified: bool,
    /// Decode may run the dense row split with ffn_down streamed whole
    /// ([`crate::plan::RowSplit::down_whole`]) where that is faster.
    pub split_down_whole: bool,
}

/// A tensor the planner has no role for stays resident with its layer up to
/// this size, as the norms and biases do; a larger one is a host weight.
pub const UNKNOWN_RESIDENT_MAX: u64 = 1 << 20;

/// Whether a tensor is a matmul weight the planner places (as opposed to
/// norms, biases, sinks, a recurrent layer's convolution kernel and the
/// input embedding, which are tiny or always on the CPU), or a tensor of no
/// known role larger than [`UNKNOWN_RESIDENT_MAX`], which is placed in host
/// memory ([`is_host_only`]).
pub fn is_placeable(t: &ModelTensor) -> bool {
    if !t.role.is_known() {
        return t.nbytes > UNKNOWN_RESIDENT_MAX;
    }
    t.dims.len() >= 2 && !t.is_bias() && !matches!(t.role, TensorRole::TokenEmbd | TensorRole::SsmConv) && t.dims[1] > 1
}

/// Whether the scheduler may keep `model`'s routed experts in its expert
/// cache (patch 0055): not where they carry biases (gpt-oss). The bias add
/// (ADD_ID) reads the router's ids after the first routed split, and the
/// cache rewrites those ids to positions in its regions, so the scheduler
/// streams every routed split through the slots instead ("the ids are read
/// after the first routed split"). Priced as cached, R3 (gpt-oss-20b MXFP4
/// at 4 GiB) was predicted at 54.5-59.8 tok/s with 3 GPU experts and
/// decoded 28-30 on the H200 host, and its decode with 0 GPU experts and
/// the prompt's compute buffers left to the cache took 33.9 ms per step
/// where the plan made at 0, whose decode tier holds two layers' experts
/// instead, took 27 ms (calls 2026-11-29-g, -h, -j).
pub fn experts_cacheable(model: &ModelInfo) -> bool {
    !model
        .tensors
        .iter()
        .any(|t| t.holds_routed_experts() && has_bias(model, t))
}

/// Whether `model` holds a bias for weight `t` (`<stem>.bias` beside
/// `<stem>.weight`).
fn has_bias(model: &ModelInfo, t: &ModelTensor) -> bool {
    t.name
        .strip_suffix(".weight")
        .is_some_and(|stem| model.tensors.iter().any(|b| b.name.strip_suffix(".bias") == Some(stem)))
}

/// Whether a placeable tensor stays in host memory whatever the budget: one
/// of no known role, whose op the planner cannot price; its consumer runs
/// where llama.cpp puts it.
pub fn is_host_only(t: &ModelTensor) -> bool {
    !t.role.is_known()
}

impl<'a> CostModel<'a> {
    /// The cost model of `model` on `profile`. A streamed MoE matmul copies
    /// only its routed experts in ubatches small enough that this beats
    /// copying the whole tensor ahead of use, overlapped with compute: the
    /// routed copy waits for the router and is not overlapped, but moves
    /// only the experts touched.
    pub fn new(
        model: &'a ModelInfo,
        profile: &'a MachineProfile,
        streaming: Streaming,
        pinned: bool,
        overheads: Overheads,
        hybrid_gpu_experts: Option<u32>,
    ) -> CostModel<'a> {
        let mut cm = CostModel {
            model,
            profile,
            streaming,
            pinned,
            overheads,
            routed_max_tokens: 0,
            hybrid_gpu_experts,
            dense_split: None,
            gpu_only: false,
            cache_locality: None,
            kv_unified: true,
            split_down_whole: true,
        };
        cm.routed_max_tokens = cm.find_routed_max_tokens();
        cm
    }

    fn find_routed_max_tokens(&self) -> u64 {
        let bw = self.link_bw();
        let Some(t) = self.model.tensors.iter().find(|t| t.holds_routed_experts()) else {
            return 0;
        };
        if bw <= 0.0 || self.streaming == Streaming::Synchronous {
            return 0;
        }
        let copy = t.nbytes as f64 / bw;
        let mut n = 0;
        while n < 4096 {
            let m = n + 1;
            let gpu = self.compute_seconds(t, m, Device::Gpu);
            let routed = copy * self.experts_touched(m) + gpu + self.overheads.device_switch_s;
            if routed >= copy.max(gpu) {
                break;
            }
            n = m;
        }
        n
    }

    /// Whether a streamed op on `t` copies only its routed experts in a ubatch of `n` tokens.
    pub fn streams_routed(&self, t: &ModelTensor, n: u64) -> bool {
        t.holds_routed_experts() && (self.streaming == Streaming::Synchronous || n <= self.routed_max_tokens)
    }

    pub fn link_bw(&self) -> f64 {
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

    /// Seconds of the matmul with weight `t` for a ubatch of `n` tokens on `device`.
    fn compute_seconds(&self, t: &ModelTensor, n: u64, device: Device) -> f64 {
        self.compute_seconds_out(t, n, device, 1)
    }

    /// [`CostModel::compute_seconds`] where `outputs` of the tokens need
    /// logits: the output projection runs for those only, and for none in
    /// a prompt chunk without outputs (every chunk but the last).
    fn compute_seconds_out(&self, t: &ModelTensor, n: u64, device: Device, outputs: u64) -> f64 {
        if t.role == TensorRole::Output {
            if outputs == 0 {
                return 0.0;
            }
            return self.experts_seconds(t, outputs.min(n.max(1)), device, 1);
        }
        self.experts_seconds(t, n, device, self.model.n_expert_used.max(1) as u64)
    }

    /// [`CostModel::compute_seconds`] with `used` experts per token for an
    /// expert tensor (a part of each token's routed experts).
    fn experts_seconds(&self, t: &ModelTensor, n: u64, device: Device, used: u64) -> f64 {
        // Placeable tensors have two dimensions at least; a row of one
        // otherwise.
        let dim = |i: usize| t.dims.get(i).copied().unwrap_or(1);
        let (k, rows) = (dim(0), dim(1));
        let experts = t.dims.get(2).copied().unwrap_or(1);
        if t.holds_routed_experts() {
            self.profile.expert_seconds(device, t.ty, k, rows, (experts, used), n)
        } else {
            self.profile.matmul_seconds(device, t.ty, k, rows * experts, n, false)
        }
    }

    /// Seconds of the op using `t` for a ubatch of `n` tokens when executed
    /// as `exec` (for [`Exec::Hybrid`], see [`CostModel::hybrid_seconds`]).
    pub fn op_seconds(&self, t: &ModelTensor, n: u64, exec: Exec) -> f64 {
        self.op_seconds_out(t, n, exec, 1)
    }

    /// [`CostModel::op_seconds`] for a ubatch of `n` tokens of which
    /// `outputs` need logits: a prompt chunk's last token (1), or every
    /// token of a step where several sequences decode together.
    pub fn op_seconds_out(&self, t: &ModelTensor, n: u64, exec: Exec, outputs: u64) -> f64 {
        match exec {
            Exec::Resident => self.compute_seconds_out(t, n, Device::Gpu, outputs),
            Exec::Cpu => self.compute_seconds_out(t, n, Device::Cpu, outputs) + self.cpu_experts_share(t),
            Exec::Hybrid | Exec::Split => f64::INFINITY,
            Exec::Stream => {
                let bw = self.link_bw();
                if bw <= 0.0 {
                    return f64::INFINITY;
                }
                let copy = self.copy_seconds(t, n);
                let gpu = self.compute_seconds_out(t, n, Device::Gpu, outputs);
                if self.streaming != Streaming::Synchronous && self.streams_routed(t, n) {
                    // The copy waits for the router's ids, then the op for the copy.
                    return copy + gpu + self.overheads.device_switch_s;
                }
                match self.streaming {
                    Streaming::Synchronous => copy + gpu,
                    Streaming::Overlapped => copy.max(gpu),
                    // The copy is priced per ubatch, see `copy_seconds`.
                    Streaming::Pipelined => gpu + self.overheads.stream_issue_s,
                }
            }
        }
    }

    /// The share of [`Overheads::cpu_experts_layer_s`] that an op on the
    /// CPU with weight `t` carries: a routed-expert tensor's part of its
    /// layer's (shared among the layer's expert tensors, so that the
    /// choice between the CPU and streaming, made weight by weight, sees
    /// it); nothing for other weights.
    fn cpu_experts_share(&self, t: &ModelTensor) -> f64 {
        if !t.holds_routed_experts() {
            return 0.0;
        }
        let in_layer = self
            .model
            .tensors
            .iter()
            .filter(|o| o.layer == t.layer && o.holds_routed_experts())
            .count();
        self.overheads.cpu_experts_layer_s / in_layer.max(1) as f64
    }

    /// Seconds the link is busy streaming `t` for a ubatch of `n` tokens.
    pub fn copy_seconds(&self, t: &ModelTensor, n: u64) -> f64 {
        let bw = self.link_bw();
        if bw <= 0.0 {
            return f64::INFINITY;
        }
        let frac = if self.streams_routed(t, n) {
            self.experts_touched(n)
        } else {
            1.0
        };
        t.nbytes as f64 * frac / bw + self.overheads.stream_issue_s
    }

    /// Seconds of one layer's routed experts (`experts`: its expert weight
    /// tensors, all in host memory) for a ubatch of `n` tokens when the GPU
    /// copies and computes `k` of each token's routed experts while the CPU
    /// computes the others (patch 0006): the longer of the two parts, every
    /// expert the GPU computes copied (see [`CostModel::hybrid_parts`]).
    pub fn hybrid_seconds(&self, experts: &[&ModelTensor], n: u64, k: u32) -> f64 {
        self.hybrid_parts(experts, n, k).seconds(0.0)
    }

    /// The parts of [`CostModel::hybrid_seconds`]. The CPU's part starts
    /// once the host has issued the GPU's copies and launches, and shares
    /// host memory with those copies
    /// ([`Overheads::hybrid_cpu_contention`]).
    pub fn hybrid_parts(&self, experts: &[&ModelTensor], n: u64, k: u32) -> HybridParts {
        let bw = self.link_bw();
        if bw <= 0.0 {
            return HybridParts {
                gpu: f64::INFINITY,
                copies: 0.0,
                cpu: f64::INFINITY,
            };
        }
        let used = self.model.n_expert_used.max(1) as u64;
        let per_expert = k as f64 / self.model.n_expert.max(1) as f64;
        let touched = 1.0 - (1.0 - per_expert).powf(n as f64);
        // The GPU part starts once the router's ids are read; the CPU
        // part's activations cross to the host and its sum back.
        let mut p = HybridParts {
            gpu: self.overheads.device_switch_s,
            copies: 0.0,
            cpu: 2.0 * self.overheads.device_switch_s,
        };
        for t in experts {
            // The bias's handovers hold both parts.
            let bias = if has_bias(self.model, t) {
                self.overheads.hybrid_bias_s
            } else {
                0.0
            };
            p.copies += t.nbytes as f64 * touched / bw;
            p.gpu += self.overheads.stream_issue_s + bias + self.experts_seconds(t, n, Device::Gpu, k as u64);
            p.cpu += self.overheads.stream_issue_s
                + bias
                + self.overheads.hybrid_cpu_contention
                    * self.experts_seconds(t, n, Device::Cpu, used.saturating_sub(k as u64).max(1));
        }
        p
    }

    /// The shares of each token's experts the GPU may compute in a hybrid
    /// split: the one asked for, or every one from 1 to all but one; none
    /// where the split is off.
    pub fn hybrid_shares(&self) -> Vec<u32> {
        let used = self.model.n_expert_used;
        match self.hybrid_gpu_experts {
            _ if used < 2 => Vec::new(),
            Some(0) => Vec::new(),
            Some(k) => vec![k.clamp(1, used - 1)],
            None => (1..used).collect(),
        }
    }

    /// The best hybrid split of a layer's routed experts for a ubatch of `n`
    /// tokens: how many of each token's experts the GPU computes, and the
    /// seconds; `None` where the split does not apply (the routed copies
    /// need streaming slots and a ubatch within `routed_max_tokens`).
    pub fn best_hybrid(&self, experts: &[&ModelTensor], n: u64) -> Option<(u32, f64)> {
        if !self.hybrid_applies(experts, n) {
            return None;
        }
        self.hybrid_shares()
            .into_iter()
            .map(|k| (k, self.hybrid_seconds(experts, n, k)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// Whether a hybrid split of `experts` may run for a ubatch of `n`
    /// tokens (see [`CostModel::best_hybrid`]).
    pub fn hybrid_applies(&self, experts: &[&ModelTensor], n: u64) -> bool {
        !(self.gpu_only
            || self.streaming == Streaming::Synchronous
            || n > self.routed_max_tokens
            || experts.is_empty()
            || self.hybrid_shares().is_empty())
    }

    /// Whether a host weight may split by rows between the CPU and the GPU
    /// (patch 0017): a dense feed-forward matrix, streamed through slots,
    /// unless the split is turned off or the plan is GPU-only.
    pub fn splits_rows(&self, t: &ModelTensor) -> bool {
        matches!(t.role, TensorRole::FfnUp | TensorRole::FfnGate | TensorRole::FfnDown)
            && t.dims.iter().skip(2).all(|&d| d == 1)
            && self.row_split_on()
    }

    /// Whether this plan may split any host weight by rows: its copies are
    /// pinned and pipelined over a link, the plan is not GPU-only, and the
    /// split is not turned off.
    fn row_split_on(&self) -> bool {
        !self.gpu_only
            && self.pinned
            && self.streaming != Streaming::Synchronous
            && self.link_bw() > 0.0
            && self.dense_split.map_or(true, |f| f > 0.0)
    }

    /// The output projection's row split in single-token decode (patch
    /// 0043), where the CPU would compute it alone: it is the step's last
    /// op, when the link has copied every other weight, so the GPU's rows
    /// cost the link time that idles otherwise. The share balances the
    /// CPU's rows against the link's copy of the GPU's, at most
    /// `max_gpu_bytes` (what the streaming slots hold at once, so that
    /// every part is copied while the CPU computes). Returns the GPU's
    /// share and the seconds it saves per step; None where the split does
    /// not apply or saves nothing.
    pub fn output_split(&self, t: &ModelTensor, max_gpu_bytes: u64) -> Option<(f64, f64)> {
        if t.role != TensorRole::Output || !self.row_split_on() || t.nbytes == 0 {
            return None;
        }
        let bw = self.link_bw();
        let cpu = self.compute_seconds(t, 1, Device::Cpu);
        let link = t.nbytes as f64 / bw;
        let share = (cpu / (cpu + link)).min(max_gpu_bytes as f64 / t.nbytes as f64);
        let saved = cpu - ((1.0 - share) * cpu).max(share * link) - self.overheads.device_switch_s;
        (share >= OUTPUT_SPLIT_MIN && saved > 0.0).then_some((share, saved))
    }

    /// The parts of a row split of `t` for a ubatch of `n` tokens, each as
    /// if it held all the rows (a share `f` on the GPU scales them by `1-f`
    /// and `f`): CPU seconds, GPU seconds, link seconds, and the host bytes
    /// read either way (see [`CostModel::host_read_seconds`]).
    pub fn split_parts(&self, t: &ModelTensor, n: u64) -> SplitParts {
        let bw = self.link_bw();
        SplitParts {
            cpu: self.compute_seconds(t, n, Device::Cpu),
            gpu: self.compute_seconds(t, n, Device::Gpu),
            link: if bw > 0.0 { t.nbytes as f64 / bw } else { f64::INFINITY },
            bytes: t.nbytes as f64,
        }
    }

    /// How fast the CPU's part of a row split runs while the link copies,
    /// relative to alone: host memory serves the copies at the link's rate
    /// and the CPU what is left of
    /// [`MachineProfile::host_read_bw_with_link`] (on the H200 host 90-95
    /// GB/s together: ~37 GB/s beside 55 GB/s of copies, where the CPU's
    /// Q4_0 matvec alone reads ~58-66 GB/s). `parts` gives the CPU's and
    /// the link's rates; 1 where the profile has no such figure.
    pub fn cpu_rate_beside_copies(&self, parts: &SplitParts) -> f64 {
        match self.profile.host_read_bw_with_link {
            Some(total) if parts.cpu > 0.0 && parts.link > 0.0 && parts.bytes > 0.0 => {
                let cpu_bw = parts.bytes / parts.cpu;
                let link_bw = parts.bytes / parts.link;
                ((total - link_bw) / cpu_bw).clamp(0.05, 1.0)
            }
            _ => 1.0,
        }
    }

    /// Host memory's seconds per second of the CPU's matvecs and per second
    /// of the link's copies, when both read it together at
    /// [`MachineProfile::host_read_bw_with_link`]: the CPU reads at the rate
    /// of `parts` (the row-split weights'), the link at its own. A step with
    /// `c` seconds of CPU work and `l` of copies takes at least `c * a + l *
    /// b`. None where the profile has no such figure.
    pub fn host_memory_shares(&self, parts: &SplitParts) -> Option<(f64, f64)> {
        match self.profile.host_read_bw_with_link {
            Some(total) if total > 0.0 && parts.cpu > 0.0 && parts.bytes > 0.0 => {
                Some((parts.bytes / parts.cpu / total, self.link_bw() / total))
            }
            _ => None,
        }
    }

    /// The cheaper of streaming and CPU for a host weight, judged op by op
    /// (a pipelined copy counts in full here: the link is shared).
    pub fn best_host_exec(&self, t: &ModelTensor, n: u64) -> (Exec, f64) {
        let s = match self.streaming {
            Streaming::Pipelined => self.op_seconds(t, n, Exec::Stream).max(self.copy_seconds(t, n)),
            _ => self.op_seconds(t, n, Exec::Stream),
        };
        let c = self.op_seconds(t, n, Exec::Cpu);
        if is_host_only(t) {
            return (Exec::Cpu, c);
        }
        if self.gpu_only || s < c {
            (Exec::Stream, s)
        } else {
            (Exec::Cpu, c)
        }
    }

    /// Seconds for a ubatch of `n` tokens at `depth` with the whole model
    /// in one place: every weight resident and the KV cache on the GPU, or
    /// everything on the CPU. This prices a small draft model, which runs
    /// unsplit beside the planned one.
    pub fn unsplit_seconds(&self, on_gpu: bool, n: u64, depth: u64) -> f64 {
        let exec = if on_gpu { Exec::Resident } else { Exec::Cpu };
        let weights: f64 = self
            .model
            .tensors
            .iter()
            .filter(|t| is_placeable(t))
            .map(|t| self.op_seconds(t, n, exec))
            .sum();
        let attention: f64 = (0..self.model.n_layer)
            .map(|l| self.attention_seconds(l, n, depth + n / 2, on_gpu))
            .sum();
        weights + attention + self.model.n_layer as f64 * self.overheads.layer_s
    }

    /// Attention (flash attention over the KV cache) for one layer: a
    /// ubatch of `n` tokens against `n_kv` cells (the middle of the ubatch).
    ///
    /// A layer whose KV cache is in host memory computes a prompt chunk's
    /// attention on the GPU all the same: its queries come from projections
    /// that run there, so ggml's scheduler puts the attention beside them
    /// and first copies the K and V cells in use from the (pageable) host
    /// cache, synchronously. Only small batches, whose projections run on
    /// the CPU, attend on the CPU. (Priced on the CPU, a 16k-token prompt
    /// of R1 with half its KV cache in host memory was predicted at 62 s
    /// and took 3.2 s on the H200, CHANGELOG.md, session 7)
    pub fn attention_seconds(&self, layer: u32, n: u64, n_kv: u64, kv_on_gpu: bool) -> f64 {
        self.attention(layer, n, n_kv, kv_on_gpu).0
    }

    /// [`CostModel::attention_seconds`], and of those the seconds the copy
    /// of host KV cells holds the link: it shares the link with streamed
    /// weights, so it cannot hide behind their copies (R1's exact plan at
    /// 2 GiB with 28 of 32 KV layers in host memory decoded 8.5 tok/s where
    /// pricing the copy as free of the link predicted 17, CHANGELOG.md, session 8).
    pub fn attention(&self, layer: u32, n: u64, n_kv: u64, kv_on_gpu: bool) -> (f64, f64) {
        self.attention_shared(layer, n, n_kv, 0, kv_on_gpu)
    }

    /// [`CostModel::attention`] in a KV stream that other sequences share:
    /// besides its own `n_kv` cells a token's attention passes over `masked`
    /// cells of theirs. The GPU's kernels compute them (their scores are
    /// masked, not skipped) and a copy of host cells moves them; the CPU's
    /// kernel skips a masked cell after reading its mask.
    pub fn attention_shared(&self, layer: u32, n: u64, n_kv: u64, masked: u64, kv_on_gpu: bool) -> (f64, f64) {
        let n_head = self.model.n_head.get(layer as usize).copied().unwrap_or(0) as u64;
        if n_head == 0 {
            return (0.0, 0.0);
        }
        // A recurrent layer updates a fixed state (about a head's size in
        // rows per head) instead of attending over the context, where the
        // state lives: it is never copied per token.
        if self.model.is_recurrent(layer) {
            let state_rows = self.model.head_dim_k;
            let device = if kv_on_gpu && self.profile.has_gpu() {
                Device::Gpu
            } else {
                Device::Cpu
            };
            let s = self
                .profile
                .attention_seconds(device, self.model.head_dim_k, n_head, n, state_rows);
            return (s, 0.0);
        }
        // A sliding window holds the other sequences' windows only.
        let (n_kv, masked) = match (self.model.is_swa(layer), self.model.sliding_window) {
            (true, Some(w)) => (n_kv.min(w), masked * n_kv.min(w) / n_kv.max(1)),
            _ => (n_kv, masked),
        };
        let on = |device, cells| {
            self.profile
                .attention_seconds(device, self.model.head_dim_k, n_head, n, cells)
        };
        let gpu = on(Device::Gpu, n_kv + masked);
        if kv_on_gpu {
            return (gpu, 0.0);
        }
        if !self.profile.has_gpu() {
            return (on(Device::Cpu, n_kv), 0.0);
        }
        // Small batches attend where their projections ran: on the CPU,
        // unless the plan is exact and runs every projection on the GPU.
        // The GPU waits for that layer's attention, and the link gets no
        // further ahead than the free streaming slots, which the weights
        // before it have filled: the CPU's attention holds the stream as
        // long as it runs. (Priced as overlapping the copies, R1 Q4_K_M at
        // 2 GiB with its KV in host memory was predicted at 21.7 tok/s and
        // decoded 15.2 on the H200, where its plan with the KV on the GPU
        // decoded 26.2; Gemma-3-27B Q4_K_M at 8 GiB, 10.3 predicted and 5.0
        // measured; bench/results/summary.json, calls 2026-11-29-a, -c.)
        if n < GPU_ATTENTION_MIN_BATCH && !self.gpu_only {
            let s = on(Device::Cpu, n_kv);
            return (s, s);
        }
        let per_token = self
            .model
            .kv_bytes_per_token(layer, GgmlType::F16, GgmlType::F16)
            .unwrap_or(0);
        let copied = per_token * (n_kv + masked + n / 2);
        // A CPU layer's KV cache is in the GPU's pinned host buffer (patch
        // 0018), copied in stream order without a drain.
        let pinned = self.profile.link.as_ref().map_or(f64::INFINITY, |l| l.h2d_pinned);
        let copy = copied as f64 / pinned;
        (gpu + copy, copy)
    }
}
