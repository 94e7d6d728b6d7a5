//! Buffer types and memory accounting (patch 0001).

use std::ffi::CStr;

use super::ffi;

/// A ggml buffer type: where a tensor's bytes live (e.g. "CPU", "CUDA0",
/// "CUDA_Host").
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferType(pub(crate) ffi::ggml_backend_buffer_type_t);

// SAFETY: buffer types are immutable, process-wide singletons in ggml.
unsafe impl Send for BufferType {}
unsafe impl Sync for BufferType {}

impl BufferType {
    /// The buffer type's name.
    pub fn name(&self) -> String {
        // SAFETY: valid buffer type; ggml returns a static string.
        let p = unsafe { ffi::ggml_backend_buft_name(self.0) };
        if p.is_null() {
            return String::new();
        }
        // SAFETY: non-null NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// Whether the buffer lives in host memory.
    pub fn is_host(&self) -> bool {
        // SAFETY: valid buffer type.
        unsafe { ffi::ggml_backend_buft_is_host(self.0) }
    }

    /// ggml's index of the device this buffer type belongs to, if any.
    pub fn device_index(&self) -> Option<usize> {
        // SAFETY: a valid buffer type; device queries with in-range indices.
        unsafe {
            let dev = ffi::ggml_backend_buft_get_device(self.0);
            if dev.is_null() {
                return None;
            }
            (0..ffi::ggml_backend_dev_count()).find(|&i| ffi::ggml_backend_dev_get(i) == dev)
        }
    }

    /// Bytes a tensor of this type and shape takes on this buffer type,
    /// including backend padding.
    pub fn alloc_size(&self, ty: ffi::ggml_type, ne: [i64; 4]) -> u64 {
        // SAFETY: a stack tensor with type, shape and strides filled in (as
        // ggml_new_tensor would) is all the size query reads.
        unsafe {
            let ts = ffi::ggml_type_size(ty);
            let bs = ffi::ggml_blck_size(ty).max(1) as usize;
            let nb1 = ts * (ne[0] as usize / bs);
            let nb2 = nb1 * ne[1] as usize;
            let t = ffi::ggml_tensor {
                type_: ty,
                ne,
                nb: [ts, nb1, nb2, nb2 * ne[2] as usize],
                ..Default::default()
            };
            ffi::ggml_backend_buft_get_alloc_size(self.0, &t) as u64
        }
    }
}

impl std::fmt::Debug for BufferType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BufferType({})", self.name())
    }
}

/// Every buffer type offered by the loaded devices: each device's default
/// buffer type, then its host (pinned) buffer type if it has one.
pub fn buffer_types() -> Vec<BufferType> {
    let mut v = Vec::new();
    // SAFETY: device queries with in-range indices.
    unsafe {
        for i in 0..ffi::ggml_backend_dev_count() {
            let dev = ffi::ggml_backend_dev_get(i);
            let b = ffi::ggml_backend_dev_buffer_type(dev);
            if !b.is_null() {
                v.push(BufferType(b));
            }
            let h = ffi::ggml_backend_dev_host_buffer_type(dev);
            if !h.is_null() {
                v.push(BufferType(h));
            }
        }
    }
    v
}

/// A device's default buffer type and its pinned host buffer type, if any.
pub fn device_buffer_types(device_index: usize) -> Option<(BufferType, Option<BufferType>)> {
    // SAFETY: the index is checked against the device count.
    unsafe {
        if device_index >= ffi::ggml_backend_dev_count() {
            return None;
        }
        let dev = ffi::ggml_backend_dev_get(device_index);
        let b = ffi::ggml_backend_dev_buffer_type(dev);
        if b.is_null() {
            return None;
        }
        let h = ffi::ggml_backend_dev_host_buffer_type(dev);
        Some((BufferType(b), (!h.is_null()).then_some(BufferType(h))))
    }
}

/// Memory held by a context and its model in one buffer type.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MemoryBreakdown {
    pub buffer_type: String,
    pub is_host: bool,
    /// ggml's index of the buffer type's device.
    pub device: Option<usize>,
    /// Weights.
    pub model: u64,
    /// KV cache and other per-sequence state.
    pub context: u64,
    /// Scheduler compute buffers.
    pub compute: u64,
}

impl MemoryBreakdown {
    /// Everything this buffer type holds.
    pub fn total(&self) -> u64 {
        self.model + self.context + self.compute
    }
}

/// Weight bytes every scheduler of the process has copied from host memory
/// to another backend (streamed to the GPU) since the process started
/// (patch 0011): whole tensors, or only the experts a MoE matmul used.
pub fn weight_bytes_streamed() -> u64 {
    // SAFETY: reads a process-wide atomic counter; no arguments.
    unsafe { ffi::ggml_backend_sched_weight_bytes_copied() }
}

/// Device bytes llama.cpp reserves for `model` loaded with `params` and a
/// context made with `ctx` (weights, KV cache, compute buffers, streaming
/// slots), from a no-alloc load and reservation: nothing is read or allocated.
pub fn dry_run_device_bytes(
    model: &std::path::Path,
    mut params: super::ModelParams<'_>,
    ctx: super::ContextParams,
) -> super::Result<u64> {
    params.no_alloc = true;
    let loaded = super::Model::load(model, params)?;
    let ctx = super::Context::new(&loaded, ctx)?;
    Ok(ctx.device_bytes())
}
