//! Benchmark routing (patch 0050): the routed experts of each MoE layer
//! chosen by a callback instead of the router's top-k, and an observer of
//! the experts each layer actually computed with.

use std::ffi::c_void;
use std::sync::Arc;

/// One MoE layer's routed experts for one ubatch: `ids` holds
/// `batch.n_used` experts per token, token by token, each below
/// `batch.n_expert`.
#[derive(Debug)]
pub struct MoeIds<'a> {
    pub batch: MoeRouteQuery<'a>,
    pub ids: &'a [i32],
}

/// Chooses the routed experts of one MoE layer for a ubatch: called with
/// the layer's shape, positions and sequences, it fills `ids` (`n_used` per
/// token, each below `n_expert`). The router is still computed, and the
/// expert weights come from its probabilities at these experts.
pub type MoeRoutePolicy = Arc<dyn Fn(&MoeRouteQuery<'_>, &mut [i32]) + Send + Sync>;

/// Receives the routed experts every MoE layer computed with, after each
/// ubatch.
pub type MoeObserver = Box<dyn FnMut(&MoeIds<'_>) + Send>;

/// One MoE layer and ubatch, as a [`MoeRoutePolicy`] is asked for it:
/// `pos` and `seq` are each token's position and (first) sequence.
#[derive(Debug)]
pub struct MoeRouteQuery<'a> {
    pub layer: u32,
    pub n_expert: u32,
    pub n_used: u32,
    pub pos: &'a [i32],
    pub seq: &'a [i32],
}

/// A view of `n` items at `p`, or None where `p` is null.
///
/// # Safety
/// `p` must point at `n` valid items for the returned lifetime, or be null.
unsafe fn slice<'a, T>(p: *const T, n: usize) -> Option<&'a [T]> {
    (!p.is_null()).then(|| std::slice::from_raw_parts(p, n))
}

/// The layer and ubatch llama.cpp passes to both callbacks, or None where
/// an argument is out of range or a pointer null.
///
/// # Safety
/// `pos` and `seq_id` must point at `n_tokens` items valid for `'a`, or be null.
unsafe fn route_query<'a>(
    il: i32,
    n_tokens: i32,
    n_expert: i32,
    n_expert_used: i32,
    pos: *const i32,
    seq_id: *const i32,
) -> Option<MoeRouteQuery<'a>> {
    if il < 0 || n_tokens <= 0 || n_expert <= 0 || n_expert_used <= 0 {
        return None;
    }
    let n = n_tokens as usize;
    Some(MoeRouteQuery {
        layer: il as u32,
        n_expert: n_expert as u32,
        n_used: n_expert_used as u32,
        pos: slice(pos, n)?,
        seq: slice(seq_id, n)?,
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn moe_route_trampoline(
    il: i32,
    n_tokens: i32,
    n_expert: i32,
    n_expert_used: i32,
    pos: *const i32,
    seq_id: *const i32,
    ids: *mut i32,
    user: *mut c_void,
) {
    if user.is_null() || ids.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes n_tokens positions and sequence ids and an
    // ids buffer of n_tokens * n_expert_used entries, valid for the call.
    let Some(q) = route_query(il, n_tokens, n_expert, n_expert_used, pos, seq_id) else {
        return;
    };
    let out = std::slice::from_raw_parts_mut(ids, q.pos.len() * q.n_used as usize);
    // SAFETY: user points at the MoeRoutePolicy boxed inside the Context
    // (or leaked by the server's load hook) whose graphs ask it.
    let f = &*(user as *const MoeRoutePolicy);
    // A panic leaves the ids llama.cpp zeroed: expert 0 for every slot.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&q, out)));
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn moe_observe_trampoline(
    il: i32,
    n_tokens: i32,
    n_expert: i32,
    n_expert_used: i32,
    pos: *const i32,
    seq_id: *const i32,
    ids: *const i32,
    user: *mut c_void,
) {
    if user.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes n_tokens positions and sequence ids and
    // n_tokens * n_expert_used ids, valid for the call.
    let Some(batch) = route_query(il, n_tokens, n_expert, n_expert_used, pos, seq_id) else {
        return;
    };
    let Some(ids) = slice(ids, batch.pos.len() * batch.n_used as usize) else {
        return;
    };
    // SAFETY: user points at the MoeObserver boxed inside the Context that
    // is decoding (the only caller, on the decoding thread).
    let f = &mut *(user as *mut MoeObserver);
    let m = MoeIds { batch, ids };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&m)));
}
