//! Placement hooks (patch 0002): choose each weight's buffer type at load
//! time, and decide per op whether an op with a host weight runs on the GPU.

use std::ffi::{c_char, c_void, CStr};
use std::sync::Arc;

use super::ffi;
use super::memory::BufferType;

/// Picks a buffer type for a weight tensor by name; `None` keeps llama.cpp's choice.
pub type TensorPlacement = Arc<dyn Fn(&str) -> Option<BufferType> + Send + Sync>;

/// Decides whether an op whose weight is in host memory runs on the GPU.
pub type OffloadPolicy = Arc<dyn Fn(&OffloadQuery<'_>) -> Offload + Send + Sync>;

/// Hybrid experts (patch 0006): how many of each token's routed experts run
/// on the GPU in `layer` for a ubatch of `n_tokens` tokens; 0 (or all of
/// them) keeps the layer's experts together.
pub type MoeSplitPolicy = Arc<dyn Fn(u32, u32) -> u32 + Send + Sync>;

/// Dense row split (patch 0017): of the `rows` rows of the host weight
/// `name` (a feed-forward up, gate or down matrix), how many the GPU computes
/// for a ubatch of `n_tokens` tokens, streaming only those rows, while the
/// CPU computes the others in place; 0 (or all of them) keeps the op whole.
pub type RowSplitPolicy = Arc<dyn Fn(&str, u64, u32) -> u64 + Send + Sync>;

/// The kind of op asking to be offloaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    MulMat,
    /// Mixture-of-experts matmul over the routed experts.
    MulMatId,
    GetRows,
    Other,
}

/// An op that uses a host-resident weight.
#[derive(Debug, Clone, Copy)]
pub struct OffloadQuery<'a> {
    /// The weight's name, e.g. `blk.3.ffn_up.weight`.
    pub weight: &'a str,
    pub op: OpKind,
    /// Tokens in the ubatch as the op sees them (`ne[1]`, or `ne[2]` for MUL_MAT_ID).
    pub n_tokens: i64,
}

/// The answer of an [`OffloadPolicy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offload {
    /// Copy the weight to the GPU and run the op there.
    Gpu,
    /// Run the op on the CPU, next to the weight.
    Cpu,
    /// Let the backend decide (upstream's batch-size threshold).
    Default,
}

pub(crate) unsafe extern "C" fn tensor_buft_trampoline(
    name: *const c_char,
    user: *mut c_void,
) -> ffi::ggml_backend_buffer_type_t {
    if name.is_null() || user.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: user points at the TensorPlacement owned by Model::load for the
    // duration of the load; name is a NUL-terminated tensor name.
    let f = &*(user as *const TensorPlacement);
    let name = CStr::from_ptr(name).to_string_lossy();
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&name))) {
        Ok(Some(b)) => b.0,
        _ => std::ptr::null_mut(),
    }
}

pub(crate) unsafe extern "C" fn offload_trampoline(
    op: *const ffi::ggml_tensor,
    weight: *const ffi::ggml_tensor,
    user: *mut c_void,
) -> i32 {
    if op.is_null() || weight.is_null() || user.is_null() {
        return -1;
    }
    // SAFETY: user points at the OffloadPolicy boxed inside the Context that
    // owns the scheduler; op and weight are live graph tensors.
    let f = &*(user as *const OffloadPolicy);
    let (op, weight) = (&*op, &*weight);
    let name = CStr::from_ptr(weight.name.as_ptr()).to_string_lossy();
    let (kind, n_tokens) = match op.op {
        ffi::GGML_OP_MUL_MAT => (OpKind::MulMat, op.ne[1]),
        ffi::GGML_OP_MUL_MAT_ID => (OpKind::MulMatId, op.ne[2]),
        ffi::GGML_OP_GET_ROWS => (OpKind::GetRows, op.ne[1]),
        _ => (OpKind::Other, op.ne[1]),
    };
    let q = OffloadQuery {
        weight: &name,
        op: kind,
        n_tokens,
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&q))) {
        Ok(Offload::Gpu) => 1,
        Ok(Offload::Cpu) => 0,
        _ => -1,
    }
}

pub(crate) unsafe extern "C" fn moe_split_trampoline(il: i32, n_tokens: i32, user: *mut c_void) -> i32 {
    if user.is_null() || il < 0 || n_tokens < 0 {
        return 0;
    }
    // SAFETY: user points at the MoeSplitPolicy boxed inside the Context
    // whose graphs ask it.
    let f = &*(user as *const MoeSplitPolicy);
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(il as u32, n_tokens as u32))) {
        Ok(n) => n.min(i32::MAX as u32) as i32,
        Err(_) => 0,
    }
}

pub(crate) unsafe extern "C" fn row_split_trampoline(
    name: *const c_char,
    n_rows: i64,
    n_tokens: i32,
    user: *mut c_void,
) -> i64 {
    if name.is_null() || user.is_null() || n_rows <= 0 || n_tokens < 0 {
        return 0;
    }
    // SAFETY: user points at the RowSplitPolicy boxed inside the Context
    // whose graphs ask it; name is the weight's NUL-terminated name.
    let f = &*(user as *const RowSplitPolicy);
    let name = CStr::from_ptr(name).to_string_lossy();
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        f(&name, n_rows as u64, n_tokens as u32)
    })) {
        Ok(n) => n.min(n_rows as u64) as i64,
        Err(_) => 0,
    }
}

/// Where the scheduler streams one split's host weights (patch 0003).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamStep {
    /// The rotating device slot the split's weights are copied into.
    pub slot: usize,
    /// The split after whose compute the copy is issued; `None` means before
    /// the first split.
    pub issue_after: Option<usize>,
}

/// The streaming schedule the ggml scheduler follows for a graph whose
/// splits stream weights where `streams[i]` is true, with `n_slots` slots:
/// `None` for splits that stream nothing. This is the scheduler's own code
/// (`ggml_backend_sched_stream_schedule`), so it can be checked without a GPU.
pub fn stream_schedule(streams: &[bool], n_slots: usize) -> Vec<Option<StreamStep>> {
    assert!((1..=8).contains(&n_slots), "the scheduler supports 1 to 8 stream slots");
    let n = streams.len();
    let mut slot = vec![-1i32; n];
    let mut after = vec![-1i32; n];
    let n_splits = i32::try_from(n).expect("split count fits in i32");
    // SAFETY: the three arrays hold n_splits elements each; the function only
    // reads `streams` and writes `slot` and `after` within those bounds.
    unsafe {
        ffi::ggml_backend_sched_stream_schedule(
            n_splits,
            streams.as_ptr(),
            n_slots as i32,
            slot.as_mut_ptr(),
            after.as_mut_ptr(),
        );
    }
    slot.iter()
        .zip(&after)
        .map(|(&s, &a)| {
            (s >= 0).then(|| StreamStep {
                slot: s as usize,
                issue_after: usize::try_from(a).ok(),
            })
        })
        .collect()
}
