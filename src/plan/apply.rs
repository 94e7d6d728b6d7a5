//! Turning a [`Plan`] into load-time placement and per-op offload decisions
//! for the engine (patch 0002).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::{Exec, Plan};
use crate::engine::{
    self, BufferType, ContextParams, DeviceKind, ModelParams, MoeSplitPolicy, Offload, OffloadPolicy, OffloadQuery,
    OpKind, RowSplitPolicy, TensorPlacement,
};
use crate::gguf::tied_output;

/// Why a plan cannot be applied on this machine.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(
        "the plan keeps weights in VRAM but no GPU backend is loaded (is libggml-cuda.so in the backend directory?)"
    )]
    NoGpu,
    #[error("placing the plan across devices: {0}")]
    Devices(String),
}

/// What the engine needs to run a plan.
pub struct Applied {
    pub placement: TensorPlacement,
    pub offload: OffloadPolicy,
    /// Layers (from the last) whose KV cache lives on the GPU.
    pub n_gpu_layers: i32,
    /// Host weights must be pinned to stream fast, which needs mmap off.
    pub use_mmap: bool,
    /// Repacked CPU copies of the host weights the CPU computes a part of
    /// (patch 0039).
    pub cpu_weight_copies: bool,
    pub n_ubatch: u32,
    /// Streaming slots for the context (patch 0003); 0: synchronous copies.
    pub stream_slots: u32,
    /// Routed-expert streaming threshold, (token, expert) pairs (patch 0005).
    pub stream_routed_max: u32,
    /// Hybrid experts per layer and ubatch size (patch 0006), if any.
    pub moe_split: Option<MoeSplitPolicy>,
    /// Dense row split per weight and ubatch size (patch 0017), if any.
    pub row_split: Option<RowSplitPolicy>,
    /// Largest part of a split weight's GPU rows outside the feed-forward
    /// (patch 0043): what a streaming slot holds.
    pub row_split_part_bytes: u64,
    /// Logits rows each sequence needs per ubatch: one, or a speculative
    /// verification batch's.
    pub outputs_per_seq: u32,
}

impl Applied {
    /// Load-time settings of the plan: placement, KV layers, mmap.
    pub fn configure_model(&self, params: &mut ModelParams<'_>) {
        params.n_gpu_layers = self.n_gpu_layers;
        params.use_mmap = self.use_mmap;
        params.cpu_weight_copies = self.cpu_weight_copies;
        params.placement = Some(self.placement.clone());
    }

    /// Context settings of the plan: its ubatch, per-op offload decisions and streaming slots.
    pub fn configure_context(&self, params: &mut ContextParams) {
        params.n_ubatch = self.n_ubatch;
        params.n_batch = params.n_batch.max(self.n_ubatch);
        params.offload = Some(self.offload.clone());
        params.stream_slots = self.stream_slots;
        params.stream_routed_max = self.stream_routed_max;
        params.moe_split = self.moe_split.clone();
        params.row_split = self.row_split.clone();
        params.row_split_part_bytes = self.row_split_part_bytes;
        // The plan budgets the rows of logits each sequence samples (one
        // token, or a verification batch), not a row for every token of the
        // ubatch.
        if !params.embeddings {
            params.n_outputs_max = params.n_seq_max.max(1) * self.outputs_per_seq;
        }
    }
}

/// Build the placement callback and offload policy for `plan`.
pub fn apply(plan: &Plan) -> Result<Applied, ApplyError> {
    let buffer_types = |kind| engine::first_device(kind).and_then(|d| engine::device_buffer_types(d.index));
    let (gpu, host) = buffer_types(DeviceKind::Gpu).ok_or(ApplyError::NoGpu)?;
    let cpu = buffer_types(DeviceKind::Cpu).map(|(b, _)| b);
    let host_buft = if plan.pinned { host.or(cpu) } else { cpu };

    let homes: HashMap<String, Option<BufferType>> = plan
        .tensors
        .iter()
        .map(|t| (t.name.clone(), if t.resident { Some(gpu) } else { host_buft }))
        .collect();
    let placement: TensorPlacement = Arc::new(move |name: &str| homes.get(name).copied().flatten());
    Ok(apply_with(plan, placement))
}

/// The settings of `plan` with the weights placed by `placement`.
pub(super) fn apply_with(plan: &Plan, placement: TensorPlacement) -> Applied {
    let Policies {
        offload,
        moe_split,
        row_split,
    } = policies(plan);
    Applied {
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
        cpu_weight_copies: plan.cpu_weight_copies,
        n_ubatch: plan.ubatch,
        stream_slots: plan.stream_slots,
        stream_routed_max: plan.stream_routed_max,
        moe_split,
        row_split,
        row_split_part_bytes: plan.row_split_part_bytes(),
        outputs_per_seq: plan.workload.speculation.map_or(1, |s| s.verify_tokens()),
    }
}

/// The per-op decisions of a plan that the running context asks for each
/// ubatch: they need no GPU, and a live re-plan swaps them
/// ([`super::switch::PolicySwitch`]).
pub struct Policies {
    pub offload: OffloadPolicy,
    pub moe_split: Option<MoeSplitPolicy>,
    pub row_split: Option<RowSplitPolicy>,
}

/// The offload, hybrid-expert and row-split callbacks of `plan`.
pub fn policies(plan: &Plan) -> Policies {
    let tier_of = tier_of(plan);
    // (tier, layer) pairs whose routed experts split between GPU and CPU.
    let hybrid: HashSet<(u32, u32)> = plan
        .tensors
        .iter()
        .filter(|t| !t.resident)
        .flat_map(|t| {
            t.exec
                .iter()
                .filter(|(_, e)| *e == Exec::Hybrid)
                .filter_map(|&(tier, _)| Some((tier, t.layer?)))
        })
        .collect();
    let gpu_experts = plan.hybrid_gpu_experts;
    // The decode ubatch of several sequences has a share of its own, in
    // every layer that splits in some tier (the tuner may split it where
    // the plan streams that ubatch's experts).
    let batch = plan.workload.decode_tokens();
    let batch = (batch > 1).then(|| {
        let layers: HashSet<u32> = hybrid.iter().map(|&(_, l)| l).collect();
        (batch, plan.batch_gpu_experts, layers)
    });
    let batch_k = batch.as_ref().map_or(0, |b| b.1);
    let moe_split: Option<MoeSplitPolicy> = ((gpu_experts > 0 || batch_k > 0) && !hybrid.is_empty()).then(|| {
        let tier_of = tier_of.clone();
        Arc::new(move |layer: u32, n_tokens: u32| {
            let tier = tier_of(n_tokens.max(1));
            match &batch {
                Some((b, k, layers)) if tier == *b => u32::from(layers.contains(&layer)) * k,
                _ if hybrid.contains(&(tier, layer)) => gpu_experts,
                _ => 0,
            }
        }) as MoeSplitPolicy
    });
    let execs: HashMap<String, Vec<(u32, Exec)>> = plan
        .tensors
        .iter()
        .filter(|t| !t.resident)
        .map(|t| (t.name.clone(), t.exec.clone()))
        .collect();
    // Hybrid layers of the several sequences' ubatch with no GPU share
    // there stream their experts, as they do unsplit in that tier.
    let unsplit_batch =
        (plan.workload.decode_tokens() > 1 && plan.batch_gpu_experts == 0).then_some(plan.workload.decode_tokens());
    let tied = ties(plan);
    let offload: OffloadPolicy = Arc::new(move |q: &OffloadQuery<'_>| {
        let Some(per_tier) = execs.get(planned_name(tied, q.weight, q.op == OpKind::MulMat)) else {
            return Offload::Default;
        };
        let tier = tier_of(q.n_tokens.max(1) as u32);
        match per_tier.iter().find(|(t, _)| *t == tier).map(|(_, e)| *e) {
            Some(Exec::Hybrid) if unsplit_batch == Some(tier) => Offload::Gpu,
            Some(Exec::Stream) => Offload::Gpu,
            // A hybrid layer's or a split weight's GPU and CPU parts are
            // placed by the graph itself; the CPU is where the weights are.
            Some(Exec::Cpu | Exec::Hybrid | Exec::Split) => Offload::Cpu,
            _ => Offload::Default,
        }
    });
    Policies {
        offload,
        moe_split,
        row_split: row_split_policy(plan),
    }
}

/// The tier of `plan` a ubatch of `n` tokens runs with, for the callbacks
/// that outlive the plan.
fn tier_of(plan: &Plan) -> impl Fn(u32) -> u32 + Clone + Send + Sync + 'static {
    let tiers = plan.tiers.clone();
    move |n: u32| super::tier_for(&tiers, n as u64)
}

/// The dense row split of `plan` (patch 0017): for a weight and a ubatch
/// size, the rows the GPU computes; `None` if no weight splits in any tier.
pub fn row_split_policy(plan: &Plan) -> Option<RowSplitPolicy> {
    // Per weight, the GPU's share of its rows in the tiers where it splits.
    let shares: HashMap<String, Vec<(u32, f64)>> = plan
        .tensors
        .iter()
        .filter(|t| !t.resident && !t.gpu_share.is_empty())
        .map(|t| (t.name.clone(), t.gpu_share.clone()))
        .collect();
    let tier_of = tier_of(plan);
    let tied = ties(plan);
    (!shares.is_empty()).then(|| {
        Arc::new(move |name: &str, rows: u64, n_tokens: u32| {
            let tier = tier_of(n_tokens.max(1));
            shares
                .get(planned_name(tied, name, true))
                .and_then(|s| s.iter().find(|(t, _)| *t == tier))
                .map_or(0, |&(_, share)| gpu_rows(rows, share))
        }) as RowSplitPolicy
    })
}

/// Whether `plan` places a tied output (the token embedding loaded again
/// as the output projection).
fn ties(plan: &Plan) -> bool {
    plan.tensors.iter().any(|t| t.tied)
}

/// The planned weight behind the weight `name` of an op (a `matmul` or
/// another): the tied output keeps the token embedding's name once loaded,
/// so the matmul by that name is the output projection's, and the
/// embedding's own lookup (not planned) is not.
fn planned_name(tied: bool, name: &str, matmul: bool) -> &str {
    if tied && matmul && name == tied_output::EMBEDDING {
        tied_output::OUTPUT
    } else {
        name
    }
}

/// Rows of a weight's `rows` the GPU computes for a share: whole blocks of
/// 32 rows (the CPU's part starts the matrix, so the GPU's rows start on a
/// block boundary too when `rows` is a multiple of 32).
pub fn gpu_rows(rows: u64, share: f64) -> u64 {
    if share.is_nan() || share <= 0.0 {
        return 0;
    }
    let n = ((rows as f64 * share.min(1.0)) / 32.0).round() as u64 * 32;
    n.min(rows)
}

#[cfg(test)]
mod tests {
    use super::gpu_rows;

    #[test]
    fn gpu_rows_are_whole_blocks_within_the_matrix() {
        assert_eq!(gpu_rows(14336, 0.0), 0);
        assert_eq!(gpu_rows(14336, f64::NAN), 0);
        assert_eq!(gpu_rows(14336, 0.5), 7168);
        assert_eq!(gpu_rows(4096, 0.6) % 32, 0);
        assert_eq!(gpu_rows(4096, 1.0), 4096);
        assert_eq!(gpu_rows(4096, 7.0), 4096);
        assert_eq!(gpu_rows(20, 0.9), 20);
    }
}
