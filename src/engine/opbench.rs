//! Micro-benchmarks of single ggml ops on one device, for the machine
//! profile: weight matmuls (dense and expert), flash attention, and
//! host↔device copies.

use std::ffi::{c_void, CString};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use super::error::{EngineError, Result};
use super::ffi;

/// A ggml backend instance on one device.
pub struct Backend {
    ptr: NonNull<ffi::ggml_backend>,
    dev: ffi::ggml_backend_dev_t,
}

// SAFETY: a backend is used by one thread at a time (no Sync).
unsafe impl Send for Backend {}

impl Drop for Backend {
    fn drop(&mut self) {
        // SAFETY: created by ggml_backend_dev_init, freed once.
        unsafe { ffi::ggml_backend_free(self.ptr.as_ptr()) };
    }
}

impl Backend {
    /// Open the device with the given index in [`super::list_devices`].
    pub fn open(device_index: usize) -> Result<Backend> {
        // SAFETY: index checked against the device count.
        unsafe {
            if device_index >= ffi::ggml_backend_dev_count() {
                return Err(EngineError::InvalidArgument(format!("no device {device_index}")));
            }
            let dev = ffi::ggml_backend_dev_get(device_index);
            let ptr = NonNull::new(ffi::ggml_backend_dev_init(dev, std::ptr::null()))
                .ok_or_else(|| EngineError::InvalidArgument(format!("cannot initialise device {device_index}")))?;
            Ok(Backend { ptr, dev })
        }
    }

    /// Set the thread count (CPU backends; a no-op elsewhere).
    pub fn set_threads(&mut self, n: i32) {
        let name = CString::new("ggml_backend_set_n_threads").unwrap();
        // SAFETY: the proc address, when present, has the documented signature.
        unsafe {
            let reg = ffi::ggml_backend_dev_backend_reg(self.dev);
            let f = ffi::ggml_backend_reg_get_proc_address(reg, name.as_ptr());
            if !f.is_null() {
                let f: ffi::ggml_backend_set_n_threads_t = std::mem::transmute(f);
                if let Some(f) = f {
                    f(self.ptr.as_ptr(), n);
                }
            }
        }
    }
}

/// A small ggml graph with its tensors allocated on one backend.
struct Graph {
    ctx: NonNull<ffi::ggml_context>,
    buf: ffi::ggml_backend_buffer_t,
    graph: *mut ffi::ggml_cgraph,
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: both were created together and are freed once.
        unsafe {
            if !self.buf.is_null() {
                ffi::ggml_backend_buffer_free(self.buf);
            }
            ffi::ggml_free(self.ctx.as_ptr());
        }
    }
}

impl Graph {
    /// Build the graph that computes `out` and allocate every tensor of
    /// `ctx` on `backend`.
    ///
    /// # Safety
    /// `out` must be a tensor of `ctx`.
    unsafe fn allocate(
        ctx: NonNull<ffi::ggml_context>,
        out: *mut ffi::ggml_tensor,
        backend: &Backend,
    ) -> Result<Graph> {
        Graph::allocate_all(ctx, &[out], backend)
    }

    /// [`Graph::allocate`] for a graph that computes each of `outs`.
    ///
    /// # Safety
    /// Every tensor of `outs` must be a tensor of `ctx`.
    unsafe fn allocate_all(
        ctx: NonNull<ffi::ggml_context>,
        outs: &[*mut ffi::ggml_tensor],
        backend: &Backend,
    ) -> Result<Graph> {
        let graph = ffi::ggml_new_graph(ctx.as_ptr());
        for &out in outs {
            ffi::ggml_build_forward_expand(graph, out);
        }
        let buf = ffi::ggml_backend_alloc_ctx_tensors(ctx.as_ptr(), backend.ptr.as_ptr());
        let g = Graph { ctx, buf, graph };
        if buf.is_null() {
            return Err(EngineError::InvalidArgument(
                "allocating benchmark tensors failed".into(),
            ));
        }
        Ok(g)
    }
}

fn new_ctx(n_tensors: usize) -> Result<NonNull<ffi::ggml_context>> {
    // SAFETY: metadata-only context (no_alloc); sizes from ggml's own helpers.
    unsafe {
        let params = ffi::ggml_init_params {
            mem_size: ffi::ggml_tensor_overhead() * n_tensors + ffi::ggml_graph_overhead() + 1024,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        };
        NonNull::new(ffi::ggml_init(params)).ok_or_else(|| EngineError::InvalidArgument("ggml_init failed".into()))
    }
}

/// The next value of a xorshift64 generator (benchmark data, not statistics).
fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Fill a tensor with small random values, quantized to its type. A block
/// of up to 1 Mi random values is converted once and tiled over the tensor:
/// speed does not depend on the values, and generating hundreds of millions
/// of them would dominate the profile's run time.
fn fill_random(t: *mut ffi::ggml_tensor, seed: u64) {
    // SAFETY: t is an allocated tensor; we write exactly ggml_nbytes(t) bytes,
    // converting whole rows so that the tiled pattern stays row-aligned.
    unsafe {
        let ty = (*t).type_;
        let ne0 = (*t).ne[0];
        let nrows = ffi::ggml_nrows(t);
        let rows = nrows.min(((1i64 << 20) / ne0.max(1)).max(1));
        let n = (ne0 * rows) as usize;
        let mut s = seed | 1;
        let src: Vec<f32> = (0..n)
            .map(|_| ((xorshift(&mut s) >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1)
            .collect();
        let row_bytes = ffi::ggml_row_size(ty, ne0);
        let block_len = row_bytes * rows as usize;
        let mut block = vec![0u8; block_len];
        match ty {
            ffi::GGML_TYPE_F32 => {
                block.copy_from_slice(std::slice::from_raw_parts(src.as_ptr() as *const u8, block_len))
            }
            ffi::GGML_TYPE_F16 => {
                let mut h = vec![0u16; n];
                ffi::ggml_fp32_to_fp16_row(src.as_ptr(), h.as_mut_ptr() as *mut ffi::ggml_fp16_t, n as i64);
                block.copy_from_slice(std::slice::from_raw_parts(h.as_ptr() as *const u8, block_len));
            }
            _ => {
                ffi::ggml_quantize_chunk(
                    ty,
                    src.as_ptr(),
                    block.as_mut_ptr() as *mut c_void,
                    0,
                    rows,
                    ne0,
                    std::ptr::null(),
                );
            }
        }
        let nbytes = ffi::ggml_nbytes(t);
        let mut off = 0usize;
        while off < nbytes {
            let len = block.len().min(nbytes - off);
            ffi::ggml_backend_tensor_set(t, block.as_ptr() as *const c_void, off, len);
            off += len;
        }
    }
}

fn time_graph(backend: &Backend, g: &Graph, min_reps: u32, min_time: Duration) -> Result<f64> {
    time_graph_with(backend, g, min_reps, min_time, || {})
}

/// [`time_graph`], calling `before_rep` (untimed) before each repetition
/// and before the untimed warm-up run.
fn time_graph_with(
    backend: &Backend,
    g: &Graph,
    min_reps: u32,
    min_time: Duration,
    mut before_rep: impl FnMut(),
) -> Result<f64> {
    // The fastest repetition, not the mean: a shared machine preempts us at
    // random, which only ever makes a repetition slower.
    // SAFETY: graph and backend are valid; ggml_backend_graph_compute
    // returns after the backend has synchronised.
    unsafe {
        before_rep();
        let st = ffi::ggml_backend_graph_compute(backend.ptr.as_ptr(), g.graph);
        if st != ffi::GGML_STATUS_SUCCESS {
            return Err(EngineError::InvalidArgument(format!("graph compute failed: {st}")));
        }
        let t0 = Instant::now();
        let mut reps = 0u32;
        let mut best = f64::INFINITY;
        while reps < min_reps || t0.elapsed() < min_time {
            before_rep();
            let t = Instant::now();
            ffi::ggml_backend_graph_compute(backend.ptr.as_ptr(), g.graph);
            best = best.min(t.elapsed().as_secs_f64());
            reps += 1;
        }
        Ok(best)
    }
}

fn check_type(ty: ffi::ggml_type, k: i64) -> Result<()> {
    // SAFETY: plain queries.
    let bs = unsafe { ffi::ggml_blck_size(ty) };
    if bs <= 0 || k % bs != 0 {
        return Err(EngineError::InvalidArgument(format!(
            "row length {k} is not a multiple of the block size {bs}"
        )));
    }
    Ok(())
}

/// Seconds for `y = W x` with W of type `ty` and shape `k × n` (k the row
/// length) and x holding `tokens` columns, on `backend`.
pub fn time_mul_mat(
    backend: &Backend,
    ty: ffi::ggml_type,
    k: i64,
    n: i64,
    tokens: i64,
    min_time: Duration,
) -> Result<f64> {
    check_type(ty, k)?;
    // SAFETY: plain query.
    let weight_bytes = unsafe { ffi::ggml_row_size(ty, k) } as u64 * n as u64;
    let layers = layers_to_time(weight_bytes, tokens, DENSE_LAYERS as u64) as usize;
    let ctx = new_ctx(1 + 2 * layers)?;
    // SAFETY: tensors are created in ctx, allocated on backend, filled, and
    // the graph is computed; everything is freed by Graph's Drop.
    unsafe {
        let c = ctx.as_ptr();
        let x = ffi::ggml_new_tensor_2d(c, ffi::GGML_TYPE_F32, k, tokens);
        let mut weights = Vec::with_capacity(layers);
        let mut outs = Vec::with_capacity(layers);
        for _ in 0..layers {
            let w = ffi::ggml_new_tensor_2d(c, ty, k, n);
            outs.push(ffi::ggml_mul_mat(c, w, x));
            weights.push(w);
        }
        let g = Graph::allocate_all(ctx, &outs, backend)?;
        for (i, &w) in weights.iter().enumerate() {
            fill_random(w, 1 + 16 * i as u64);
        }
        fill_random(x, 2);
        Ok(time_graph(backend, &g, 3, min_time)? / layers as f64)
    }
}

/// Dense matmuls are timed over this many weights, one after the other, as
/// the layers of a model run: a single weight of the profile's size can sit
/// in a large last-level cache, where its matmul reads faster than memory
/// allows (the CPU read 116 GB/s from a 75 MB Q4_0 weight on the H200 host
/// with 75–98 GB/s of memory bandwidth).
const DENSE_LAYERS: usize = 4;

/// Batches up to this size read their weights from memory at a rate that
/// caches distort; they are timed over [`COLD_BYTES`] of weights.
const READ_BOUND_TOKENS: i64 = 4;

/// Weights and experts read by one repetition of a read-bound matmul: more
/// than a server's last-level cache holds, so each is read from memory as a
/// model's are. Four 75 MB weights (300 MB) still read at 72 GB/s on the
/// H200's host, where R1's 3.2 GB of CPU weights decoded at 53 GB/s
/// (CHANGELOG.md, session 6).
const COLD_BYTES: u64 = 1 << 30;

/// The most weights (or layers of experts) one benchmark allocates.
const MAX_LAYERS: u64 = 64;

/// How many weights (or layers of experts) of `layer_bytes` each a matmul
/// over `tokens` columns is timed across: `at_least`, and for a read-bound
/// batch enough to make [`COLD_BYTES`].
fn layers_to_time(layer_bytes: u64, tokens: i64, at_least: u64) -> u64 {
    if tokens <= READ_BOUND_TOKENS {
        COLD_BYTES.div_ceil(layer_bytes.max(1)).clamp(at_least, MAX_LAYERS)
    } else {
        at_least
    }
}

/// Expert matmuls are timed with at least this many layers' worth of
/// experts (and [`COLD_BYTES`] for a read-bound batch) and fresh routing
/// each repetition: in a model every layer has its own experts, so the few
/// a token uses are rarely in a cache; timing the same ones over and over
/// found them there (the CPU's decode was predicted ~50% fast). The op's
/// cost depends on the experts used, not on how many exist.
const EXPERT_LAYERS: i64 = 4;

/// Seconds for a mixture-of-experts matmul: `n_expert` matrices of `k × n`,
/// `tokens` tokens each routed to `n_used` distinct random experts.
pub fn time_mul_mat_id(
    backend: &Backend,
    ty: ffi::ggml_type,
    k: i64,
    n: i64,
    (n_expert, n_used): (i64, i64),
    tokens: i64,
    min_time: Duration,
) -> Result<f64> {
    check_type(ty, k)?;
    let ctx = new_ctx(5)?;
    // SAFETY: plain query.
    let layer_bytes = unsafe { ffi::ggml_row_size(ty, k) } as u64 * (n * n_expert) as u64;
    let layers = layers_to_time(layer_bytes, tokens, EXPERT_LAYERS as u64) as i64;
    let pool = n_expert * layers;
    // SAFETY: as in time_mul_mat; ids are written as i32 within range,
    // between repetitions (the backend has synchronised after each).
    unsafe {
        let c = ctx.as_ptr();
        let w = ffi::ggml_new_tensor_3d(c, ty, k, n, pool);
        let x = ffi::ggml_new_tensor_3d(c, ffi::GGML_TYPE_F32, k, n_used, tokens);
        let ids = ffi::ggml_new_tensor_2d(c, ffi::GGML_TYPE_I32, n_used, tokens);
        let y = ffi::ggml_mul_mat_id(c, w, x, ids);
        let g = Graph::allocate(ctx, y, backend)?;
        fill_random(w, 3);
        fill_random(x, 4);
        let mut s: u64 = 0x9e3779b97f4a7c15;
        let mut idv: Vec<i32> = Vec::with_capacity((n_used * tokens) as usize);
        let mut rep = 0i64;
        time_graph_with(backend, &g, 3, min_time, || {
            // Each token routes to n_used distinct experts of one layer's
            // n_expert, every token of a repetition in the same layer, as in
            // a model's graph (the next repetition takes the next layer, so
            // its experts are cold). Spreading a batch over the layers timed
            // a batch `layers` times smaller per expert: the 512-token sample
            // priced R2's full-GPU prefill at ub 512 at 4x its measured cost.
            idv.clear();
            let layer = (rep % layers) as i32 * n_expert as i32;
            rep += 1;
            for _ in 0..tokens {
                let first = idv.len();
                while idv.len() - first < n_used as usize {
                    let e = layer + (xorshift(&mut s) % n_expert as u64) as i32;
                    if !idv[first..].contains(&e) {
                        idv.push(e);
                    }
                }
            }
            ffi::ggml_backend_tensor_set(ids, idv.as_ptr() as *const c_void, 0, idv.len() * 4);
        })
    }
}

/// Seconds for flash attention of `tokens` queries over `n_kv` cached
/// positions (F16 K/V), with `n_head` query heads, `n_head_kv` KV heads.
pub fn time_flash_attn(
    backend: &Backend,
    head_dim: i64,
    n_head: i64,
    n_head_kv: i64,
    tokens: i64,
    n_kv: i64,
    min_time: Duration,
) -> Result<f64> {
    let ctx = new_ctx(6)?;
    // SAFETY: as in time_mul_mat; the mask is zero-filled F16.
    unsafe {
        let c = ctx.as_ptr();
        let q = ffi::ggml_new_tensor_4d(c, ffi::GGML_TYPE_F32, head_dim, tokens, n_head, 1);
        let k = ffi::ggml_new_tensor_4d(c, ffi::GGML_TYPE_F16, head_dim, n_kv, n_head_kv, 1);
        let v = ffi::ggml_new_tensor_4d(c, ffi::GGML_TYPE_F16, head_dim, n_kv, n_head_kv, 1);
        let mask = ffi::ggml_new_tensor_4d(c, ffi::GGML_TYPE_F16, n_kv, tokens, 1, 1);
        let y = ffi::ggml_flash_attn_ext(c, q, k, v, mask, 1.0 / (head_dim as f32).sqrt(), 0.0, 0.0);
        let g = Graph::allocate(ctx, y, backend)?;
        fill_random(q, 5);
        fill_random(k, 6);
        fill_random(v, 7);
        let zeros = vec![0u8; ffi::ggml_nbytes(mask)];
        ffi::ggml_backend_tensor_set(mask, zeros.as_ptr() as *const c_void, 0, zeros.len());
        time_graph(backend, &g, 3, min_time)
    }
}

/// Host↔device copy bandwidths in bytes/s.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LinkBandwidth {
    pub h2d_pinned: f64,
    pub d2h_pinned: f64,
    pub h2d_pageable: f64,
    pub d2h_pageable: f64,
}

/// Measure copies of `bytes` between host memory (pinned: the device's host
/// buffer type; pageable: a plain Vec) and the device.
pub fn measure_link(device_index: usize, bytes: usize, min_time: Duration) -> Result<LinkBandwidth> {
    let backend = Backend::open(device_index)?;
    let ctx = new_ctx(2)?;
    // SAFETY: two 1-D tensors, one in the device buffer and one in the
    // device's pinned host buffer; copies stay within their sizes.
    unsafe {
        let c = ctx.as_ptr();
        let n = (bytes / 4) as i64;
        let d = ffi::ggml_new_tensor_1d(c, ffi::GGML_TYPE_F32, n);
        let h = ffi::ggml_new_tensor_1d(c, ffi::GGML_TYPE_F32, n);
        let dbuf = ffi::ggml_backend_buft_alloc_buffer(
            ffi::ggml_backend_dev_buffer_type(backend.dev),
            ffi::ggml_nbytes(d) + 4096,
        );
        // A device with no pinned host memory of its own (a remote device
        // behind ggml-rpc) copies from plain host memory: its "pinned"
        // figures are then the network path's.
        let mut host_buft = ffi::ggml_backend_dev_host_buffer_type(backend.dev);
        let cpu = ffi::ggml_backend_dev_by_type(ffi::GGML_BACKEND_DEVICE_TYPE_CPU);
        if host_buft.is_null() && !cpu.is_null() {
            host_buft = ffi::ggml_backend_dev_buffer_type(cpu);
        }
        if dbuf.is_null() || host_buft.is_null() {
            if !dbuf.is_null() {
                ffi::ggml_backend_buffer_free(dbuf);
            }
            ffi::ggml_free(c);
            return Err(EngineError::InvalidArgument(
                "the device has no pinned host buffer type".into(),
            ));
        }
        let hbuf = ffi::ggml_backend_buft_alloc_buffer(host_buft, ffi::ggml_nbytes(h) + 4096);
        let _g = Graph {
            ctx,
            buf: dbuf,
            graph: std::ptr::null_mut(),
        };
        let _h = Graph {
            ctx: new_ctx(1)?,
            buf: hbuf,
            graph: std::ptr::null_mut(),
        };
        if hbuf.is_null() {
            return Err(EngineError::InvalidArgument("pinned host allocation failed".into()));
        }
        ffi::ggml_backend_tensor_alloc(dbuf, d, ffi::ggml_backend_buffer_get_base(dbuf));
        ffi::ggml_backend_tensor_alloc(hbuf, h, ffi::ggml_backend_buffer_get_base(hbuf));
        let nb = ffi::ggml_nbytes(d);
        let mut pageable = vec![1u8; nb];
        let time = |f: &mut dyn FnMut()| {
            f();
            let t0 = Instant::now();
            let mut reps = 0;
            while reps < 3 || t0.elapsed() < min_time {
                f();
                reps += 1;
            }
            nb as f64 * reps as f64 / t0.elapsed().as_secs_f64()
        };
        Ok(LinkBandwidth {
            h2d_pinned: time(&mut || ffi::ggml_backend_tensor_copy(h, d)),
            d2h_pinned: time(&mut || ffi::ggml_backend_tensor_copy(d, h)),
            h2d_pageable: time(&mut || ffi::ggml_backend_tensor_set(d, pageable.as_ptr() as *const c_void, 0, nb)),
            d2h_pageable: time(&mut || ffi::ggml_backend_tensor_get(d, pageable.as_mut_ptr() as *mut c_void, 0, nb)),
        })
    }
}
