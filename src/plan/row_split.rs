//! The dense row split's two decode modes (patch 0017): every host
//! feed-forward weight split at one share, or ffn_down streamed whole with
//! up's and gate's rows split. The optimizer prices both
//! ([`super::Evaluator::decode_row_split`]) and the decode tuner tries both
//! (`launch::tune`); each puts its choice in force here.

use super::{is_dense_ffn, Exec, Plan};

/// The least GPU share of up's and gate's rows with ffn_down streamed
/// whole: one unit of the decode tuner's search (2.5%). There the link
/// carries ffn_down whole, and each unit of up and gate more costs link
/// time: R1 at 2 GiB on an H200 host probed 28.56 ms per step at 5% and
/// 30.41 at 10%, and kept the least share the search allowed then, 5%
/// (CHANGELOG.md, session 24, call b).
pub const DOWN_WHOLE_LEAST_SHARE: f64 = 0.025;

/// The row split a decode step runs with.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RowSplit {
    /// The GPU's share of each split weight's rows (up's and gate's only
    /// with `down_whole`); 0: no weight splits.
    pub share: f64,
    /// ffn_down streams whole instead of splitting.
    pub down_whole: bool,
}

/// Put `split` in force in `plan`'s decode: the shares the callbacks
/// answer, and with ffn_down whole the ops that stream instead, nothing
/// else (the residency and memory stay the plan's). The feed-forward
/// weights' share is the split's; the output projection keeps its own
/// (patch 0043, see [`super::CostModel::output_split`]). Once ffn_down
/// streams whole it stays so: the split weights' other execs are gone.
pub fn set_row_split(plan: &mut Plan, split: RowSplit) {
    plan.row_split_share = split.share;
    plan.row_split_down_whole |= split.down_whole;
    // The tiers where ffn_down splits: with ffn_down whole, it streams
    // there (the CPU copies made for it at load go unused), and so do the
    // attention weights the CPU would compute there, so that the CPU
    // computes one part per layer (up's and gate's rows) and hands over to
    // the GPU once.
    let tiers: Vec<u32> = plan
        .tensors
        .iter()
        .filter(|t| split.down_whole && t.role == "FfnDown")
        .flat_map(|t| t.gpu_share.iter().map(|&(n, _)| n))
        .collect();
    let kv_gpu_from = plan.n_layer.saturating_sub(plan.kv_gpu_layers);
    for t in &mut plan.tensors {
        if !t.resident && (t.role == "FfnDown" || streams_with_down(&t.role, t.layer, kv_gpu_from)) {
            t.gpu_share.retain(|(n, _)| !tiers.contains(n));
            for (n, e) in &mut t.exec {
                if matches!(*e, Exec::Split | Exec::Cpu) && tiers.contains(n) {
                    *e = Exec::Stream;
                }
            }
        }
        if is_dense_ffn(&t.role) {
            for (_, s) in &mut t.gpu_share {
                *s = split.share;
            }
        }
    }
}

/// Whether a host weight of `role` in `layer` streams in decode with
/// ffn_down whole where the CPU would compute it: an attention weight of a
/// layer whose KV cache is on the GPU (from `kv_gpu_from`).
pub(crate) fn streams_with_down(role: &str, layer: Option<u32>, kv_gpu_from: u32) -> bool {
    role.starts_with("Attn") && layer.is_some_and(|l| l >= kv_gpu_from)
}
