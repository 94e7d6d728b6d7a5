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
        let graph = ffi::ggml_new_graph(ctx.as_ptr());
        ffi::ggml_build_forward_expand(graph, out);
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
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
            })
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
    // The fastest repetition, not the mean: a shared machine preempts us at
    // random, which only ever makes a repetition slower.
    // SAFETY: graph and backend are valid; ggml_backend_graph_compute
    // returns after the backend has synchronised.
    unsafe {
        let st = ffi::ggml_backend_graph_compute(backend.ptr.as_ptr(), g.graph);
        if st != ffi::GGML_STATUS_SUCCESS {
            return Err(EngineError::InvalidArgument(format!("graph compute failed: {st}")));
        }
        let t0 = Instant::now();
        let mut reps = 0u32;
        let mut best = f64::INFINITY;
        while reps < min_reps || t0.elapsed() < min_time {
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
    let ctx = new_ctx(4)?;
    // SAFETY: tensors are created in ctx, allocated on backend, filled, and
    // the graph is computed; everything is freed by Graph's Drop.
    unsafe {
        let c = ctx.as_ptr();
        let w = ffi::ggml_new_tensor_2d(c, ty, k, n);
        let x = ffi::ggml_new_tensor_2d(c, ffi::GGML_TYPE_F32, k, tokens);
        let y = ffi::ggml_mul_mat(c, w, x);
        let g = Graph::allocate(ctx, y, backend)?;
        fill_random(w, 1);
        fill_random(x, 2);
        time_graph(backend, &g, 3, min_time)
    }
}

/// Seconds for a mixture-of-experts matmul: `n_expert` matrices of `k × n`,
/// `tokens` tokens each routed to `n_used` experts (spread evenly).
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
    // SAFETY: as in time_mul_mat; ids are written as i32 within range.
    unsafe {
        let c = ctx.as_ptr();
        let w = ffi::ggml_new_tensor_3d(c, ty, k, n, n_expert);
        let x = ffi::ggml_new_tensor_3d(c, ffi::GGML_TYPE_F32, k, n_used, tokens);
        let ids = ffi::ggml_new_tensor_2d(c, ffi::GGML_TYPE_I32, n_used, tokens);
        let y = ffi::ggml_mul_mat_id(c, w, x, ids);
        let g = Graph::allocate(ctx, y, backend)?;
        fill_random(w, 3);
        fill_random(x, 4);
        let mut idv: Vec<i32> = Vec::with_capacity((n_used * tokens) as usize);
        let mut s: u64 = 0x9e3779b97f4a7c15;
        for _ in 0..tokens {
            let mut chosen = Vec::with_capacity(n_used as usize);
            while chosen.len() < n_used as usize {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let e = (s % n_expert as u64) as i32;
                if !chosen.contains(&e) {
                    chosen.push(e);
                }
            }
            idv.extend(chosen);
        }
        ffi::ggml_backend_tensor_set(ids, idv.as_ptr() as *const c_void, 0, idv.len() * 4);
        time_graph(backend, &g, 3, min_time)
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
        let host_buft = ffi::ggml_backend_dev_host_buffer_type(backend.dev);
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
