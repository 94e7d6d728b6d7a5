//! The planner: where each sub-layer weight lives and runs, per token tier,
//! under a hard VRAM budget.
//!
//! A [`Plan`] keeps one set of resident weights for every tier (re-uploading
//! weights between ubatches would cost more than it saves) and, for every
//! other weight, decides per tier whether its op streams the weight to the
//! GPU or runs on the CPU. Only between a prompt and the decoding after it
//! does the residency change: the [`DecodeTier`] holds more weights in the
//! memory the prompt's compute buffers give back, where that pays for the
//! switch.
//! [`make_plan`] searches the ubatch size and how many layers keep their KV
//! cache on the GPU; for each candidate it fills the VRAM left after KV,
//! compute buffers and a reserve with the weights that save the most time per
//! byte according to the [`cost`] model.

pub mod apply;
pub mod apply_devices;
pub mod cost;
mod decode_tier;
pub mod devices;
mod evaluate;
pub mod expert_cache;
mod optimizer;
mod report;
pub mod row_split;
mod switch;

pub use cost::{CostModel, Exec, HybridParts, Overheads, Streaming};
pub use decode_tier::{planned_seconds, DecodeTier, DecodeUnit, DECODE_TIER_MARGIN};
pub use evaluate::{decode_phase, predict, DecodePhase, Evaluator};
pub use expert_cache::{ExpertCachePlan, Locality};
pub use optimizer::{make_plan, value_per_byte};
pub use report::{render, render_devices, Format};
pub use row_split::{set_row_split, RowSplit};
pub use switch::PolicySwitch;

use serde::{Deserialize, Serialize};

use crate::gguf::{GgmlType, ModelInfo};

/// Errors from planning.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(
        "a VRAM budget of {budget} cannot run this model (KV cache, compute buffers and reserve need at least {minimum}); the smallest budget that works is {minimum}",
        budget = crate::plan::fmt_bytes(*budget),
        minimum = crate::plan::fmt_bytes(*minimum)
    )]
    BudgetTooSmall { budget: u64, minimum: u64 },
    #[error("the profile has no GPU measurements, so nothing can be placed in VRAM; measure a profile on a machine with a GPU")]
    NoGpuProfile,
    #[error("invalid request: {0}")]
    Invalid(String),
}

/// The work a plan is optimised for.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// Prompt tokens processed before the first generated token.
    pub prompt_tokens: u64,
    /// Tokens generated after it.
    pub gen_tokens: u64,
    /// Speculative decoding: the model verifies a draft model's tokens in
    /// batches instead of decoding one token at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculation: Option<Speculation>,
    /// Sequences served side by side (a server's `-np`), each with this
    /// prompt and these generated tokens. They decode together, one token
    /// of each per ubatch, so decode runs at a tier of this many tokens (an
    /// MoE layer then touches several tokens' experts at once), and the
    /// prediction's decode speed is theirs in total.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub parallel: u32,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            prompt_tokens: 4096,
            gen_tokens: 64,
            speculation: None,
            parallel: 1,
        }
    }
}

impl Workload {
    /// Tokens of one decode ubatch: one of each sequence decoding together.
    pub fn decode_tokens(&self) -> u32 {
        self.parallel.max(1)
    }
}

/// Speculative decoding as the planner prices it: each step the draft
/// model proposes `draft_tokens` tokens one at a time, and the planned
/// model checks them in one batch of `draft_tokens + 1` (its own next token
/// after the last one accepted comes with the batch).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Speculation {
    /// Draft tokens per step (llama.cpp's `--spec-draft-n-max`).
    pub draft_tokens: u32,
    /// The chance that each draft token is accepted, given the ones before
    /// it were: an assumption about how well the draft predicts the model,
    /// which no measurement of this machine can supply.
    pub acceptance: f64,
    /// Seconds the draft model takes to propose one token.
    pub draft_token_s: f64,
    /// Seconds the draft model takes to read the prompt, once, before it
    /// drafts.
    #[serde(default)]
    pub draft_prompt_s: f64,
    /// Whether the draft model runs on the GPU (its device memory comes
    /// out of the budget) or on the CPU.
    #[serde(default)]
    pub draft_on_gpu: bool,
}

impl Speculation {
    /// The size of each verification batch.
    pub fn verify_tokens(&self) -> u32 {
        self.draft_tokens + 1
    }

    /// Tokens each step yields on average: the accepted run of the draft,
    /// plus the model's own token after it, `(1 - a^(d+1)) / (1 - a)`.
    pub fn tokens_per_step(&self) -> f64 {
        let a = self.acceptance.clamp(0.0, 1.0);
        let d = self.draft_tokens as i32;
        if a >= 1.0 {
            (d + 1) as f64
        } else {
            (1.0 - a.powi(d + 1)) / (1.0 - a)
        }
    }
}

/// What to plan for.
#[derive(Debug, Clone)]
pub struct PlanRequest {
    /// Device memory the plan may use, bytes.
    pub budget: u64,
    /// Context length in tokens (all sequences together).
    pub n_ctx: u64,
    pub workload: Workload,
    /// A fixed ubatch size, or None to choose among 512..4096.
    pub ubatch: Option<u32>,
    pub type_k: GgmlType,
    pub type_v: GgmlType,
    /// Flash attention; without it each layer's attention holds its scores
    /// for the whole context in the compute buffer.
    pub flash_attention: bool,
    /// Rotating device slots for weights streamed with copies overlapped
    /// with compute (patch 0003); 0 plans for llama.cpp's synchronous copy
    /// per op, which holds the streamed weights in the compute buffer.
    pub stream_slots: u32,
    /// Host weights are pinned (model loaded without mmap).
    pub pinned: bool,
    /// VRAM kept free for CUDA's own pools and workspaces.
    pub reserve: u64,
    /// Device bytes a vision encoder needs while it runs (see
    /// [`VramBreakdown::vision_peak`]); 0 without one.
    pub vision_peak: u64,
    /// Correction of the analytic compute-buffer estimate, from a dry run
    /// ([`crate::launch::make_measured_plan`]); 1.0 uses the estimate as is.
    pub compute_scale: f64,
    pub overheads: Overheads,
    /// Hybrid experts: how many of each token's routed experts the GPU
    /// computes in MoE layers whose experts stay in host memory; `None`
    /// lets the cost model choose, `Some(0)` turns the split off.
    pub hybrid_gpu_experts: Option<u32>,
    /// Dense row split (patch 0017): the share of the rows of each dense
    /// feed-forward weight in host memory that the GPU streams and computes
    /// in decode while the CPU computes the others; `None` lets the cost
    /// model choose, `Some(0.0)` turns the split off.
    pub dense_split: Option<f64>,
    /// GPU math only: host weights are streamed, never computed on the CPU
    /// or split with it, and every projection runs on the GPU, so attention
    /// does too (over host KV layers after a copy of their cells): the plan
    /// computes exactly what the full-GPU placement does.
    pub exact: bool,
    /// A fixed number of layers (from the last) whose KV cache is on the
    /// GPU instead of the planner's choice: a live re-plan keeps the KV
    /// cache where the running context holds it.
    pub kv_gpu_layers: Option<u32>,
    /// Plan a decode tier ([`DecodeTier`]): more weights resident while
    /// decoding, in the memory the prompt's compute buffers free.
    pub decode_tier: bool,
    /// Let the CPU compute its part of hybrid experts and of a dense row
    /// split from repacked copies of those host weights
    /// ([`Plan::cpu_weight_copies`]) where host memory holds them.
    pub cpu_copies: bool,
    /// Host memory available to the process now (Linux's MemAvailable);
    /// None: not known, not checked.
    pub host_available: Option<u64>,
    /// The context keeps one KV stream for all its sequences (llama.cpp's
    /// `kv_unified`), not one per sequence; it sizes sliding-window caches.
    pub kv_unified: bool,
    /// The routing locality the expert cache (patch 0040) is priced with in
    /// decode: measured from the model's selected experts, else
    /// [`expert_cache::Locality::default`]; None plans without the cache.
    pub cache_locality: Option<expert_cache::Locality>,
}

/// Two slots let one split's copy overlap the previous split's compute; a
/// few more let the copy stream keep going through attention, which streams
/// nothing (measured on the H200: R2 at 4 GiB 0.433 s with 2 slots, 0.377 s
/// with 4; R1 at 2 GiB 0.409 s with 2, 0.383 s with 3).
pub const DEFAULT_STREAM_SLOTS: u32 = 4;

impl PlanRequest {
    /// How host weights reach the GPU under this request.
    pub fn streaming(&self) -> Streaming {
        Streaming::with_slots(self.stream_slots)
    }

    /// Defaults for a budget and context.
    pub fn new(budget: u64, n_ctx: u64) -> PlanRequest {
        PlanRequest {
            budget,
            n_ctx,
            workload: Workload::default(),
            ubatch: None,
            type_k: GgmlType::F16,
            type_v: GgmlType::F16,
            flash_attention: true,
            stream_slots: DEFAULT_STREAM_SLOTS,
            pinned: true,
            reserve: 160 << 20,
            vision_peak: 0,
            compute_scale: 1.0,
            overheads: Overheads::default(),
            hybrid_gpu_experts: None,
            dense_split: None,
            exact: false,
            kv_gpu_layers: None,
            kv_unified: true,
            decode_tier: true,
            cpu_copies: true,
            host_available: None,
            cache_locality: Some(expert_cache::Locality::default()),
        }
    }
}

/// Where one weight lives and runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedTensor {
    pub name: String,
    pub layer: Option<u32>,
    pub role: String,
    /// Bytes in host memory.
    pub bytes: u64,
    /// Bytes it takes in VRAM (CUDA padding included).
    pub vram_bytes: u64,
    pub resident: bool,
    /// Per tier (ubatch tokens), how its op runs.
    pub exec: Vec<(u32, Exec)>,
    /// Per tier where its op runs [`Exec::Split`]: the share of its rows
    /// the GPU computes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_share: Vec<(u32, f64)>,
    /// The output projection loaded from the token embedding (the model
    /// has no `output.weight`): a copy of its own wherever its buffer type
    /// differs from the embedding's.
    #[serde(default, skip_serializing_if = "is_false")]
    pub tied: bool,
}

/// The VRAM the plan uses, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct VramBreakdown {
    pub weights: u64,
    pub kv_cache: u64,
    pub compute: u64,
    /// Streaming slots (overlapped streaming): slots x the largest streamed weight.
    #[serde(default)]
    pub stream_slots: u64,
    /// Device memory streaming uses beyond llama.cpp's reservation (measured).
    #[serde(default)]
    pub stream_overhead: u64,
    pub reserve: u64,
    /// Device bytes the vision encoder needs while it runs (compute and
    /// streaming slots; its weights stay on the host). The language
    /// model's compute memory is released meanwhile, so only the larger of
    /// the two peaks counts in `total`.
    #[serde(default)]
    pub vision_peak: u64,
    pub total: u64,
    pub budget: u64,
    /// Device bytes llama.cpp's own no-alloc reservation of this plan needs
    /// (everything but the reserve), when it was checked.
    #[serde(default)]
    pub measured: Option<u64>,
}

impl VramBreakdown {
    /// Memory held for the whole run: weights, KV cache and the reserve.
    pub fn persistent(&self) -> u64 {
        self.weights + self.kv_cache + self.reserve
    }

    /// The language model's compute peak: compute buffers and streaming.
    pub fn language_peak(&self) -> u64 {
        self.compute + self.stream_slots + self.stream_overhead
    }

    /// Persistent memory plus the larger of the language model's and the
    /// vision encoder's peaks, which never coexist.
    pub fn total_with(persistent: u64, language_peak: u64, vision_peak: u64) -> u64 {
        persistent + language_peak.max(vision_peak)
    }
}

/// Predicted speed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    pub ttft_s: f64,
    pub prompt_tok_s: f64,
    /// Generated tokens per second, with speculative decoding if the
    /// workload has it.
    pub decode_tok_s: f64,
    /// With speculative decoding: what a step costs and what it yields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculation: Option<SpeculationPrediction>,
}

/// The predicted cost of speculative decoding.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SpeculationPrediction {
    /// Seconds the model takes to verify one batch of draft tokens.
    pub verify_s: f64,
    /// Seconds of one step: the draft's tokens and their verification.
    pub step_s: f64,
    /// Tokens one step yields on average.
    pub tokens_per_step: f64,
    /// Decode tokens per second of the same plan without a draft.
    pub plain_decode_tok_s: f64,
}

/// A complete placement, with its VRAM use and predicted speed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub model: String,
    pub ubatch: u32,
    /// Token tiers, ascending; a ubatch of n tokens uses the first tier >= n.
    pub tiers: Vec<u32>,
    /// Layers (counted from the last) whose KV cache and attention are on the GPU.
    pub kv_gpu_layers: u32,
    pub n_layer: u32,
    pub streaming: Streaming,
    /// Rotating device slots for streamed weights; 0 with synchronous streaming.
    #[serde(default)]
    pub stream_slots: u32,
    /// A streamed MoE matmul routing at most this many (token, expert) pairs
    /// copies only the experts it uses (patch 0005); 0: whole tensors.
    #[serde(default)]
    pub stream_routed_max: u32,
    /// Hybrid experts in the decode tier (patch 0006): how many of each
    /// token's routed experts the GPU computes in layers whose expert
    /// tensors run [`Exec::Hybrid`]; 0 if none does.
    #[serde(default)]
    pub hybrid_gpu_experts: u32,
    /// Hybrid experts in the decode ubatch of several sequences decoding
    /// together (the tier of [`Workload::decode_tokens`] tokens, one of each
    /// sequence): how many of each token's routed experts the GPU computes
    /// there, in the layers that split in some tier; 0 if none splits
    /// there (each weight runs as its exec in that tier says).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub batch_gpu_experts: u32,
    /// Dense row split in the decode tier (patch 0017): the share of the
    /// rows of the weights that run [`Exec::Split`] the GPU computes; 0 if
    /// none does.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub row_split_share: f64,
    /// The dense row split's ffn_down weights stream whole in the decode
    /// tier instead of splitting, so that the CPU computes one part per
    /// layer (up's and gate's rows) and hands over to the GPU once instead
    /// of twice; set by the decode tuner where that is faster
    /// ([`crate::launch::SplitSetting::RowsDownWhole`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub row_split_down_whole: bool,
    /// Every op on the GPU (see [`PlanRequest::exact`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exact: bool,
    /// The CPU computes its part of hybrid experts and of a dense row split
    /// from copies of those host weights in its repacked layout (patch
    /// 0039), made at load: [`Plan::cpu_copy_bytes`] more host memory for
    /// faster CPU kernels.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cpu_weight_copies: bool,
    pub pinned: bool,
    pub vram: VramBreakdown,
    pub predicted: Prediction,
    pub workload: Workload,
    pub tensors: Vec<PlannedTensor>,
    /// More weights resident while decoding (None: the same residency).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_tier: Option<DecodeTier>,
    /// The expert cache expected in decode (patch 0040), with the decode
    /// tier's weights resident where there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_cache: Option<ExpertCachePlan>,
}

impl Plan {
    /// Predicted seconds for the whole workload: the prompt, then the
    /// generated tokens (per sequence where several decode together:
    /// `decode_tok_s` is theirs in total).
    pub fn predicted_seconds(&self) -> f64 {
        self.predicted.ttft_s + self.workload.gen_tokens as f64 / self.predicted.decode_tok_s.max(1e-12)
    }

    /// The tier a ubatch of `n` tokens runs with.
    pub fn tier_for(&self, n: u64) -> u32 {
        tier_for(&self.tiers, n)
    }

    /// Bytes of resident weights.
    pub fn resident_bytes(&self) -> u64 {
        self.tensors.iter().filter(|t| t.resident).map(|t| t.vram_bytes).sum()
    }

    /// Whether some host weight runs [`Exec::Hybrid`] in some tier: the
    /// layers whose experts [`Plan::hybrid_gpu_experts`] splits (0 once a
    /// tuner found the CPU computing them all fastest).
    pub fn has_hybrid_layers(&self) -> bool {
        self.tensors
            .iter()
            .any(|t| !t.resident && t.exec.iter().any(|&(_, e)| e == Exec::Hybrid))
    }

    /// Bytes of host weights (pinned when the plan is).
    pub fn host_bytes(&self) -> u64 {
        self.tensors.iter().filter(|t| !t.resident).map(|t| t.bytes).sum()
    }

    /// Host bytes that repacked CPU copies take: every host weight that
    /// runs [`Exec::Hybrid`] in some tier, every feed-forward weight that
    /// runs [`Exec::Split`], and the ffn_down weights streamed whole
    /// instead (patch 0039 copies every dense feed-forward weight in host
    /// memory, and no weight outside the feed-forward).
    pub fn cpu_copy_bytes(&self) -> u64 {
        self.tensors
            .iter()
            .filter(|t| {
                let ffn = is_dense_ffn(&t.role);
                !t.resident
                    && ((self.row_split_down_whole && t.role == "FfnDown")
                        || t.exec
                            .iter()
                            .any(|&(_, e)| e == Exec::Hybrid || (ffn && e == Exec::Split)))
            })
            .map(|t| t.bytes)
            .sum()
    }

    /// The largest part of a split weight's GPU rows outside the
    /// feed-forward (the output projection, patch 0043): the largest weight
    /// that otherwise goes through the streaming slots (streamed whole in
    /// some tier, or a feed-forward weight split by rows), less a margin
    /// for the slots' row padding, so that the slots need not grow; 0 (one
    /// part) where none does.
    pub fn row_split_part_bytes(&self) -> u64 {
        const PADDING: u64 = 64 << 10;
        self.tensors
            .iter()
            .filter(|t| {
                !t.resident
                    && t.exec
                        .iter()
                        .any(|&(_, e)| e == Exec::Stream || (e == Exec::Split && is_dense_ffn(&t.role)))
            })
            .map(|t| t.bytes)
            .max()
            .map_or(0, |b| b.saturating_sub(PADDING).max(1))
    }

    /// Weight bytes copied to the GPU for one ubatch of `tier`: every host
    /// weight whose op streams at that tier, once.
    pub fn streamed_bytes(&self, tier: u32) -> u64 {
        self.tensors
            .iter()
            .filter(|t| t.exec.iter().any(|&(n, e)| n == tier && e == Exec::Stream))
            .map(|t| t.bytes)
            .sum()
    }

    /// [`Plan::streamed_bytes`] of every tier, computed once.
    pub fn streamed_per_tier(&self) -> StreamedPerTier {
        StreamedPerTier {
            ubatch: self.ubatch.max(1),
            tiers: self.tiers.clone(),
            bytes: self.tiers.iter().map(|&t| self.streamed_bytes(t)).collect(),
        }
    }
}

/// The weight bytes a plan streams per ubatch, by tier.
#[derive(Debug, Clone)]
pub struct StreamedPerTier {
    ubatch: u32,
    tiers: Vec<u32>,
    bytes: Vec<u64>,
}

impl StreamedPerTier {
    /// What a batch of `n_tokens` does under the plan: llama.cpp splits it
    /// into ubatches of the plan's ubatch size; returns the tier of the last
    /// one and the weight bytes all of them stream.
    pub fn batch(&self, n_tokens: u32) -> (u32, u64) {
        let (mut left, mut bytes, mut tier) = (n_tokens, 0, 0);
        while left > 0 {
            let m = left.min(self.ubatch);
            let i = tier_index(&self.tiers, m as u64);
            tier = self.tiers.get(i).copied().unwrap_or(1);
            bytes += self.bytes.get(i).copied().unwrap_or(0);
            left -= m;
        }
        (tier, bytes)
    }
}

/// Index of the tier a ubatch of `n` tokens runs with: the first tier at
/// least that large, or the largest.
fn tier_index(tiers: &[u32], n: u64) -> usize {
    tiers
        .iter()
        .position(|&t| t as u64 >= n)
        .unwrap_or(tiers.len().saturating_sub(1))
}

/// The tier of `tiers` a ubatch of `n` tokens runs with (1 if there are none).
fn tier_for(tiers: &[u32], n: u64) -> u32 {
    tiers.get(tier_index(tiers, n)).copied().unwrap_or(1)
}

/// Whether a planned tensor's role is a dense feed-forward weight, which
/// patch 0017 splits in the layer's feed-forward (and patch 0039 copies).
pub(crate) fn is_dense_ffn(role: &str) -> bool {
    matches!(role, "FfnUp" | "FfnGate" | "FfnDown")
}

fn is_false(b: &bool) -> bool {
    !b
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

fn is_zero_u32(x: &u32) -> bool {
    *x == 0
}

/// Human-readable bytes (GiB/MiB).
pub fn fmt_bytes(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

/// Parse "4GiB", "512MiB", "2.5G", "1e9" or plain bytes.
pub fn parse_bytes(s: &str) -> Result<u64, PlanError> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| PlanError::Invalid(format!("not a size: {s:?}")))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" | "kib" => 1024.0,
        "m" | "mb" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" | "tib" => 1024.0f64.powi(4),
        _ => return Err(PlanError::Invalid(format!("unknown unit in {s:?} (use MiB or GiB)"))),
    };
    if !(v.is_finite() && v >= 0.0) {
        return Err(PlanError::Invalid(format!("not a size: {s:?}")));
    }
    Ok((v * mult) as u64)
}

/// Logs, once per process and name, every tensor of `model` the planner
/// has no role for, and what it does with it.
pub fn log_unknown_tensors(model: &ModelInfo) {
    static LOGGED: std::sync::Mutex<Option<std::collections::HashSet<String>>> = std::sync::Mutex::new(None);
    let mut logged = LOGGED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let logged = logged.get_or_insert_with(Default::default);
    for t in model.unknown_tensors() {
        if logged.insert(t.name.clone()) {
            let placement = if cost::is_placeable(t) {
                "a host weight, its op computed where llama.cpp runs its consumer"
            } else {
                "resident with its layer"
            };
            tracing::warn!(
                tensor = %t.name,
                bytes = t.nbytes,
                "the planner has no role for this tensor; it is {placement}"
            );
        }
    }
}

/// Norms, biases and other small tensors, which stay resident with their layer.
pub fn small_bytes(model: &ModelInfo) -> u64 {
    model
        .tensors
        .iter()
        .filter(|t| !cost::is_placeable(t) && t.role != crate::gguf::TensorRole::TokenEmbd)
        .map(|t| t.cuda_alloc_size())
        .sum()
}

/// KV cache bytes for the last `gpu_layers` layers at `n_ctx` tokens, in a
/// context of ubatch `ubatch`.
pub fn kv_bytes(model: &ModelInfo, req: &PlanRequest, gpu_layers: u32, ubatch: u64) -> u64 {
    (model.n_layer - gpu_layers..model.n_layer)
        .map(|l| layer_cache_bytes(model, req, l, ubatch))
        .sum()
}

/// What `layer` keeps per context under `req` with ubatch `ubatch`: its KV
/// cache, every cell of every stream ([`KvStreams`]); in a sliding-window
/// layer what llama.cpp's SWA cache holds (the sequences' windows plus a
/// ubatch, never more than a stream); and a fixed state per sequence in a
/// recurrent layer.
pub fn layer_cache_bytes(model: &ModelInfo, req: &PlanRequest, layer: u32, ubatch: u64) -> u64 {
    if model.is_recurrent(layer) {
        return model.state_bytes(layer, u64::from(req.workload.decode_tokens()));
    }
    let kv = KvStreams::of(req);
    let per_tok = model.kv_bytes_per_token(layer, req.type_k, req.type_v).unwrap_or(0);
    let cells = match (model.is_swa(layer), model.sliding_window) {
        (true, Some(w)) => kv.swa_cells(w, ubatch),
        _ => kv.cells,
    };
    per_tok * cells * kv.streams
}

/// The KV cache's layout as llama.cpp makes it (`llama_context`'s
/// `n_ctx_seq`): the context padded to 256 cells, in one stream for every
/// sequence when unified (`kv_unified`), else in a stream per sequence of
/// its share, padded to 256 cells again, so that the streams together can
/// hold more than the context (`-c 17000 -np 4`: 4 x 4352 cells, not 17152).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvStreams {
    /// Streams: 1 when unified, else one per sequence.
    pub streams: u64,
    /// Cells of each stream (a full-attention layer's KV cache holds them all).
    pub cells: u64,
    /// The sequences sharing the context (`n_seq_max`).
    pub n_seq: u64,
}

impl KvStreams {
    /// The layout of `n_ctx` tokens for `n_seq` sequences.
    pub fn new(n_ctx: u64, n_seq: u64, unified: bool) -> KvStreams {
        let pad = |n: u64| n.div_ceil(256) * 256;
        let (n_ctx, n_seq) = (pad(n_ctx), n_seq.max(1));
        if unified || n_seq == 1 {
            KvStreams {
                streams: 1,
                cells: n_ctx,
                n_seq,
            }
        } else {
            KvStreams {
                streams: n_seq,
                cells: pad(n_ctx / n_seq),
                n_seq,
            }
        }
    }

    /// The layout of `req`'s context, its sequences being the workload's.
    pub fn of(req: &PlanRequest) -> KvStreams {
        KvStreams::new(req.n_ctx, u64::from(req.workload.parallel.max(1)), req.kv_unified)
    }

    /// Whether every sequence is in one stream.
    pub fn unified(&self) -> bool {
        self.streams == 1
    }

    /// Cells of each stream of llama.cpp's SWA cache (`llama_kv_cache_iswa`,
    /// without `swa_full`): the windows of the sequences the stream holds
    /// plus a ubatch, padded to 256, never more than the stream.
    pub fn swa_cells(&self, window: u64, ubatch: u64) -> u64 {
        let per_stream = if self.unified() { self.n_seq } else { 1 };
        (window * per_stream + ubatch)
            .div_ceil(256)
            .min(self.cells.div_ceil(256))
            * 256
    }
}

/// Attention scores without flash attention: a ubatch of `u` tokens
/// against every cell of its stream (each token sees one stream: with a
/// stream per sequence, the ubatch's tokens divide among them), for every
/// head, in F32, and the softmax beside them.
pub(crate) fn attention_scores_bytes(model: &ModelInfo, u: u64, kv: KvStreams) -> u64 {
    let n_head = model.n_head.iter().copied().max().unwrap_or(0) as u64;
    u * kv.cells * n_head * 4 * 2
}

/// The compute memory a plan for `req` prices at ubatch `u`: the
/// [`compute_bytes`] estimate (with `streamed_layer_bytes`), attention
/// scores without flash attention, scaled by the dry run's correction
/// ([`PlanRequest::compute_scale`]), and the small tensors.
pub(crate) fn planned_compute(model: &ModelInfo, req: &PlanRequest, u: u64, streamed_layer_bytes: u64) -> u64 {
    let scores = if req.flash_attention {
        0
    } else {
        attention_scores_bytes(model, u, KvStreams::of(req))
    };
    ((compute_bytes(model, u, streamed_layer_bytes) + scores) as f64 * req.compute_scale) as u64 + small_bytes(model)
}

/// Compute-buffer estimate for a ubatch of `u` tokens on the GPU: the
/// activations of one layer plus the largest set of weights one layer
/// streams through the compute buffer.
pub fn compute_bytes(model: &ModelInfo, u: u64, streamed_layer_bytes: u64) -> u64 {
    let n_ff = model
        .n_ff
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
        .max(model.n_ff_exp.unwrap_or(0) * model.n_expert_used as u64);
    let n_head = model.n_head.iter().copied().max().unwrap_or(0) as u64;
    let n_head_kv = model.n_head_kv.iter().copied().max().unwrap_or(0) as u64;
    let qkv = (n_head + 2 * n_head_kv) * model.head_dim_k;
    let act = u * 4 * (6 * model.n_embd + 3 * n_ff + qkv);
    // Expert matmuls hold per-(token, expert) rows: the routed inputs and
    // outputs in the compute buffer, and gathered copies in ggml-cuda's pool.
    // The factor is calibrated on the H200 measurements in
    // CHANGELOG.md, sessions 1-3 (R2 at ubatch 4096 peaked ~1.6 GiB above
    // an estimate without this term); a dry-run measurement replaces it later.
    let moe = if model.n_expert > 0 {
        u * 4 * model.n_expert_used as u64 * 5 * (model.n_embd + model.n_ff_exp.unwrap_or(0))
    } else {
        0
    };
    let logits = model.n_vocab.unwrap_or(0) * 4;
    act + moe + logits + streamed_layer_bytes + (32 << 20)
}
