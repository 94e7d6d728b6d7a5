//! An inference context: KV cache, compute buffers, decoding, logits and
//! embeddings.

use std::ptr::NonNull;

use super::error::{EngineError, Result};
use super::ffi;
use super::memory::{BufferType, MemoryBreakdown};
use super::model::{Model, Token};
use super::placement::{
    moe_split_trampoline, offload_trampoline, row_split_trampoline, MoeSplitPolicy, OffloadPolicy, RowSplitPolicy,
};
use super::routing::{moe_observe_trampoline, moe_route_trampoline, MoeObserver, MoeRoutePolicy};
use super::sampler::{Sampler, SamplingParams};
use super::seq0::{Batch, Seq0};

/// Whether to use flash attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum FlashAttention {
    #[default]
    Auto,
    On,
    Off,
}

/// Context parameters, mirroring llama.cpp's.
#[derive(Clone)]
pub struct ContextParams {
    /// Context length in tokens; 0 takes the model's training length.
    pub n_ctx: u32,
    /// Largest batch submitted to one `decode` call.
    pub n_batch: u32,
    /// Physical micro-batch size.
    pub n_ubatch: u32,
    /// Parallel sequences.
    pub n_seq_max: u32,
    /// Threads for single-token decode; `None` picks the physical cores.
    pub n_threads: Option<i32>,
    /// Threads for batches.
    pub n_threads_batch: Option<i32>,
    pub flash_attention: FlashAttention,
    /// Compute embeddings instead of (as well as) logits.
    pub embeddings: bool,
    /// Keep the KV cache on the GPU (with its layer).
    pub offload_kqv: bool,
    /// Let the scheduler run ops whose weights are in host memory on the GPU.
    pub op_offload: bool,
    /// KV cache element types (ggml type ids); `None` keeps F16.
    pub type_k: Option<ffi::ggml_type>,
    pub type_v: Option<ffi::ggml_type>,
    /// One KV buffer shared by all sequences.
    pub kv_unified: bool,
    /// Per-op offload decisions for host weights (patch 0002); `None` keeps
    /// upstream's batch-size threshold.
    pub offload: Option<OffloadPolicy>,
    /// Rotating device slots through which host weights of GPU ops are
    /// streamed ahead of use on a copy stream (patch 0003); 0 keeps
    /// upstream's synchronous copy per op.
    pub stream_slots: u32,
    /// With streaming, a MoE matmul that routes at most this many (token,
    /// expert) pairs copies only the experts it uses, once they are known
    /// (patch 0005); 0 always streams whole expert tensors.
    pub stream_routed_max: u32,
    /// Hybrid experts (patch 0006): how many of each token's routed experts
    /// run on the GPU, per layer and ubatch size, in layers whose experts
    /// live in host memory; the CPU computes the others at the same time.
    pub moe_split: Option<MoeSplitPolicy>,
    /// Dense row split (patch 0017): how many rows of each host feed-forward
    /// weight the GPU computes, per ubatch size, streaming only those, while
    /// the CPU computes the others at the same time.
    pub row_split: Option<RowSplitPolicy>,
    /// A split weight outside the feed-forward (the output projection,
    /// patch 0043) streams the GPU's rows in parts of at most this many
    /// bytes, each within a streaming slot; 0: one part.
    pub row_split_part_bytes: u64,
    /// Most outputs (logits rows) one ubatch may request; 0 = `n_batch`.
    /// The compute buffer holds this many rows of logits, so a context that
    /// only samples each sequence's last token can set it to `n_seq_max`.
    pub n_outputs_max: u32,
    /// Greedy sampling of sequence 0 inside the graph, on the device that
    /// computes the logits (llama.cpp's backend sampling): a decode then
    /// copies one token id per output of sequence 0 instead of its row of
    /// logits, which [`Context::sampled_token`] returns and
    /// [`Context::logits`] no longer has. At most one output of sequence 0
    /// per decode.
    pub backend_greedy: bool,
    /// Benchmark routing (patch 0050): the routed experts of every MoE
    /// layer chosen by this policy instead of the router's top-k; `None`
    /// (every user's run) keeps the model's router.
    pub moe_route: Option<MoeRoutePolicy>,
}

impl Default for ContextParams {
    fn default() -> Self {
        ContextParams {
            n_ctx: 4096,
            n_batch: 2048,
            n_ubatch: 512,
            n_seq_max: 1,
            n_threads: None,
            n_threads_batch: None,
            flash_attention: FlashAttention::Auto,
            embeddings: false,
            offload_kqv: true,
            op_offload: true,
            type_k: None,
            type_v: None,
            kv_unified: true,
            offload: None,
            stream_slots: 0,
            stream_routed_max: 0,
            moe_split: None,
            row_split: None,
            row_split_part_bytes: 0,
            n_outputs_max: 0,
            backend_greedy: false,
            moe_route: None,
        }
    }
}

impl std::fmt::Debug for ContextParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContextParams")
            .field("n_ctx", &self.n_ctx)
            .field("n_batch", &self.n_batch)
            .field("n_ubatch", &self.n_ubatch)
            .field("n_seq_max", &self.n_seq_max)
            .field("flash_attention", &self.flash_attention)
            .field("embeddings", &self.embeddings)
            .field("offload", &self.offload.as_ref().map(|_| "custom"))
            .field("stream_slots", &self.stream_slots)
            .field("stream_routed_max", &self.stream_routed_max)
            .field("moe_split", &self.moe_split.as_ref().map(|_| "custom"))
            .field("row_split", &self.row_split.as_ref().map(|_| "custom"))
            .field("backend_greedy", &self.backend_greedy)
            .field("moe_route", &self.moe_route.as_ref().map(|_| "custom"))
            .finish_non_exhaustive()
    }
}

/// Callbacks installed into a `llama_context_params`; they must live as
/// long as the context.
pub(crate) type ContextCallbacks = (
    Option<Box<OffloadPolicy>>,
    Option<Box<MoeSplitPolicy>>,
    Option<Box<RowSplitPolicy>>,
    Option<Box<MoeRoutePolicy>>,
);

impl ContextParams {
    /// Write these parameters into llama.cpp's `cp`. The returned callbacks
    /// are pointed to by `cp` and must outlive the context made from it.
    pub(crate) fn write_c(&self, cp: &mut ffi::llama_context_params) -> ContextCallbacks {
        cp.n_ctx = self.n_ctx;
        cp.n_batch = self.n_batch;
        cp.n_ubatch = self.n_ubatch.min(self.n_batch);
        cp.n_seq_max = self.n_seq_max;
        let threads = self.n_threads.unwrap_or_else(default_threads);
        cp.n_threads = threads;
        cp.n_threads_batch = self.n_threads_batch.unwrap_or(threads);
        cp.flash_attn_type = match self.flash_attention {
            FlashAttention::Auto => ffi::LLAMA_FLASH_ATTN_TYPE_AUTO,
            FlashAttention::On => ffi::LLAMA_FLASH_ATTN_TYPE_ENABLED,
            FlashAttention::Off => ffi::LLAMA_FLASH_ATTN_TYPE_DISABLED,
        };
        cp.embeddings = self.embeddings;
        cp.offload_kqv = self.offload_kqv;
        cp.op_offload = self.op_offload;
        cp.kv_unified = self.kv_unified;
        // A sliding-window layer keeps its window, as llama-server's does
        // (common's default) and as the plan sizes it; llama.cpp's own
        // default keeps the whole context there.
        cp.swa_full = false;
        if let Some(t) = self.type_k {
            cp.type_k = t;
        }
        if let Some(t) = self.type_v {
            cp.type_v = t;
        }
        cp.n_stream_slots = self.stream_slots.min(i32::MAX as u32) as i32;
        cp.n_stream_routed_max = self.stream_routed_max.min(i32::MAX as u32) as i32;
        cp.n_outputs_max = self.n_outputs_max;
        cp.row_split_part_size = usize::try_from(self.row_split_part_bytes).unwrap_or(usize::MAX);
        let offload = self.offload.clone().map(Box::new);
        if let Some(pol) = &offload {
            cp.offload_cb = Some(offload_trampoline);
            cp.offload_cb_user_data = &**pol as *const OffloadPolicy as *mut std::ffi::c_void;
        }
        let moe_split = self.moe_split.clone().map(Box::new);
        if let Some(pol) = &moe_split {
            cp.moe_split_cb = Some(moe_split_trampoline);
            cp.moe_split_cb_user_data = &**pol as *const MoeSplitPolicy as *mut std::ffi::c_void;
        }
        let row_split = self.row_split.clone().map(Box::new);
        if let Some(pol) = &row_split {
            cp.row_split_cb = Some(row_split_trampoline);
            cp.row_split_cb_user_data = &**pol as *const RowSplitPolicy as *mut std::ffi::c_void;
        }
        let moe_route = self.moe_route.clone().map(Box::new);
        if let Some(pol) = &moe_route {
            cp.moe_route_cb = Some(moe_route_trampoline);
            cp.moe_route_cb_user_data = &**pol as *const MoeRoutePolicy as *mut std::ffi::c_void;
        }
        (offload, moe_split, row_split, moe_route)
    }

    /// The parameters `cp` holds, as far as these fields describe them.
    pub(crate) fn from_c(cp: &ffi::llama_context_params) -> ContextParams {
        ContextParams {
            n_ctx: cp.n_ctx,
            n_batch: cp.n_batch,
            n_ubatch: cp.n_ubatch,
            n_seq_max: cp.n_seq_max,
            n_threads: Some(cp.n_threads),
            n_threads_batch: Some(cp.n_threads_batch),
            flash_attention: match cp.flash_attn_type {
                ffi::LLAMA_FLASH_ATTN_TYPE_ENABLED => FlashAttention::On,
                ffi::LLAMA_FLASH_ATTN_TYPE_DISABLED => FlashAttention::Off,
                _ => FlashAttention::Auto,
            },
            embeddings: cp.embeddings,
            offload_kqv: cp.offload_kqv,
            op_offload: cp.op_offload,
            type_k: Some(cp.type_k),
            type_v: Some(cp.type_v),
            kv_unified: cp.kv_unified,
            offload: None,
            stream_slots: cp.n_stream_slots.max(0) as u32,
            stream_routed_max: cp.n_stream_routed_max.max(0) as u32,
            moe_split: None,
            row_split: None,
            row_split_part_bytes: cp.row_split_part_size as u64,
            n_outputs_max: cp.n_outputs_max,
            backend_greedy: false,
            moe_route: None,
        }
    }
}

/// Physical cores, as a sensible default thread count.
pub fn default_threads() -> i32 {
    std::thread::available_parallelism()
        .map_or(4, |n| n.get() as i32)
        .clamp(1, 64)
}

/// A llama.cpp context bound to a model.
pub struct Context<'m> {
    ptr: NonNull<ffi::llama_context>,
    model: &'m Model,
    batch: Batch,
    embeddings: bool,
    // Boxed so its address stays fixed while the scheduler holds it.
    _offload: Option<Box<OffloadPolicy>>,
    _moe_split: Option<Box<MoeSplitPolicy>>,
    _row_split: Option<Box<RowSplitPolicy>>,
    _moe_route: Option<Box<MoeRoutePolicy>>,
    // Boxed twice so that the pointer llama.cpp holds is thin and fixed.
    moe_observer: Option<Box<MoeObserver>>,
    // The streaming slots and routed threshold it was made with, which
    // `rebuild_graphs` sets again.
    stream: (u32, u32),
    // The greedy chain of backend sampling; a field, so it is freed after
    // the context (in `drop`), which refers to it.
    greedy: Option<Sampler>,
}

// SAFETY: a llama_context may move between threads; it is not shared (no Sync).
unsafe impl Send for Context<'_> {}

impl Drop for Context<'_> {
    fn drop(&mut self) {
        // SAFETY: created in `new` and freed once (the batch after it).
        unsafe { ffi::llama_free(self.ptr.as_ptr()) };
    }
}

impl<'m> Context<'m> {
    /// Create a context. This allocates the KV cache and reserves compute buffers.
    pub fn new(model: &'m Model, params: ContextParams) -> Result<Context<'m>> {
        if params.n_ubatch == 0 || params.n_batch == 0 || params.n_seq_max == 0 {
            return Err(EngineError::InvalidArgument(
                "batch sizes and n_seq_max must be positive".into(),
            ));
        }
        // SAFETY: default params are plain data.
        let mut cp = unsafe { ffi::llama_context_default_params() };
        let (offload, moe_split, row_split, moe_route) = params.write_c(&mut cp);
        cp.no_perf = false;
        let greedy = params
            .backend_greedy
            .then(|| Sampler::new(model, &SamplingParams::greedy()))
            .transpose()?;
        let mut configs: Vec<ffi::llama_sampler_seq_config> = greedy
            .iter()
            .map(|g| ffi::llama_sampler_seq_config {
                seq_id: 0,
                sampler: g.as_ptr(),
            })
            .collect();
        if !configs.is_empty() {
            // read during llama_init_from_model only
            cp.samplers = configs.as_mut_ptr();
            cp.n_samplers = configs.len();
        }
        // SAFETY: model is valid for 'm, which the context cannot outlive.
        let raw = unsafe { ffi::llama_init_from_model(model.as_ptr(), cp) };
        drop(configs);
        let ptr = NonNull::new(raw).ok_or(EngineError::ContextCreate {
            n_ctx: params.n_ctx,
            n_batch: params.n_batch,
            n_ubatch: params.n_ubatch,
        })?;
        // SAFETY: plain query on the new context.
        let batch_cap = unsafe { ffi::llama_n_batch(ptr.as_ptr()) } as usize;
        // n_seq_max ids per token, so that multi-sequence tokens fit.
        let batch = Batch::new(batch_cap, params.n_seq_max);
        Ok(Context {
            ptr,
            model,
            batch,
            embeddings: params.embeddings,
            _offload: offload,
            _moe_split: moe_split,
            _row_split: row_split,
            _moe_route: moe_route,
            moe_observer: None,
            stream: (params.stream_slots, params.stream_routed_max),
            greedy,
        })
    }

    /// The model this context runs.
    pub fn model(&self) -> &'m Model {
        self.model
    }

    /// Hand `observer` the routed experts every MoE layer computed with,
    /// after each ubatch (patch 0050); `None` stops. Each observed ubatch
    /// waits for its computation and copies its ids back, and a change
    /// rebuilds the graphs: for measuring outside timed runs.
    pub fn set_moe_observer(&mut self, observer: Option<MoeObserver>) {
        let observer = observer.map(Box::new);
        let (cb, user) = match &observer {
            Some(o) => (
                Some(moe_observe_trampoline as unsafe extern "C" fn(_, _, _, _, _, _, _, _)),
                &**o as *const MoeObserver as *mut std::ffi::c_void,
            ),
            None => (None, std::ptr::null_mut()),
        };
        // SAFETY: the observer is boxed in self, replaced only here after
        // llama.cpp points at the new one, and freed after the context.
        unsafe { ffi::llama_set_moe_observer(self.ptr.as_ptr(), cb, user) };
        self.moe_observer = observer;
    }

    /// Context length.
    pub fn n_ctx(&self) -> u32 {
        // SAFETY: plain query.
        unsafe { ffi::llama_n_ctx(self.ptr.as_ptr()) }
    }

    /// Largest batch per `decode` call.
    pub fn n_batch(&self) -> u32 {
        self.batch.cap() as u32
    }

    /// Micro-batch size.
    pub fn n_ubatch(&self) -> u32 {
        // SAFETY: plain query.
        unsafe { ffi::llama_n_ubatch(self.ptr.as_ptr()) }
    }

    /// Its sequence 0, decoded through its batch ([`Seq0`]).
    pub fn seq0(&mut self) -> Seq0<'_> {
        let sampled = self.greedy.is_some();
        Seq0::new(self.ptr, &mut self.batch, sampled)
    }

    /// Decode a run of tokens of sequence 0 starting at position `pos`,
    /// split into `n_batch` chunks. Logits are kept for the last token only
    /// when `logits_last` is set.
    pub fn decode_tokens(&mut self, tokens: &[Token], pos: i32, logits_last: bool) -> Result<()> {
        self.seq0().decode(tokens, pos, logits_last)
    }

    /// Decode one batch of tokens from any sequences (at most `n_batch`).
    pub fn decode_batch(&mut self, items: &[BatchItem]) -> Result<()> {
        if items.is_empty() {
            return Ok(());
        }
        if items.len() > self.batch.cap() {
            return Err(EngineError::InvalidArgument(format!(
                "batch of {} tokens exceeds n_batch {}",
                items.len(),
                self.batch.cap()
            )));
        }
        let n_vocab = self.model.n_vocab();
        if let Some(bad) = items.iter().find(|it| it.token < 0 || it.token >= n_vocab) {
            return Err(EngineError::TokenOutOfRange {
                token: bad.token,
                n_vocab,
            });
        }
        for (i, it) in items.iter().enumerate() {
            self.batch.set(i, it.token, it.pos, it.seq, it.logits);
        }
        self.batch.decode(self.ptr.as_ptr(), items.len())
    }

    /// Logits of the `i`-th output of the last batch (-1: the last one).
    pub fn logits(&mut self, i: i32) -> Result<&[f32]> {
        let n_vocab = self.model.n_vocab() as usize;
        // SAFETY: llama.cpp returns NULL for invalid indices, otherwise a
        // pointer to n_vocab floats valid until the next decode.
        unsafe {
            let p = ffi::llama_get_logits_ith(self.ptr.as_ptr(), i);
            if p.is_null() {
                return Err(EngineError::InvalidArgument(format!("no logits for output {i}")));
            }
            Ok(std::slice::from_raw_parts(p, n_vocab))
        }
    }

    /// The greedy token of the `i`-th output of the last batch (-1: the
    /// last one): backend sampling's where the context has it
    /// ([`Context::sampled_token`]), else the host's [`super::argmax`] of the
    /// logits.
    pub fn greedy_token(&mut self, i: i32) -> Result<Token> {
        self.seq0()
            .greedy(i)
            .ok_or_else(|| EngineError::InvalidArgument(format!("no logits for output {i}")))
    }

    /// The token that backend sampling ([`ContextParams::backend_greedy`])
    /// chose for the `i`-th output of the last batch (-1: the last one);
    /// `None` where it did not run (not asked for, or the device that
    /// computes the logits cannot run it: the logits are there instead).
    pub fn sampled_token(&mut self, i: i32) -> Option<Token> {
        self.seq0().sampled(i)
    }

    /// Pooled embedding of a sequence (or the last token's, without pooling).
    pub fn embeddings(&mut self, seq: i32) -> Result<Vec<f32>> {
        if !self.embeddings {
            return Err(EngineError::NoEmbeddings);
        }
        let n = self.model.n_embd() as usize;
        // SAFETY: as for logits; pointers cover n_embd floats or are NULL.
        unsafe {
            let mut p = ffi::llama_get_embeddings_seq(self.ptr.as_ptr(), seq);
            if p.is_null() {
                p = ffi::llama_get_embeddings_ith(self.ptr.as_ptr(), -1);
            }
            if p.is_null() {
                return Err(EngineError::NoEmbeddings);
            }
            Ok(std::slice::from_raw_parts(p, n).to_vec())
        }
    }

    /// Free the compute buffers and weight-streaming slots until the next
    /// decode, which reserves them again (patch 0004). A vision encoder can
    /// use the device memory meanwhile.
    pub fn release_compute(&mut self) {
        // SAFETY: valid context; llama.cpp synchronises before freeing.
        unsafe { ffi::llama_release_compute(self.ptr.as_ptr()) };
    }

    /// Change the context's largest ubatch (patch 0033): its compute
    /// buffers are freed now and reserved for the new size at the next
    /// decode, or at once with [`Context::reserve_compute`]. Larger batches
    /// are split into ubatches of this size. Fails for a context whose
    /// attention is not causal.
    pub fn set_ubatch(&mut self, n_ubatch: u32) -> Result<()> {
        // SAFETY: valid context; llama.cpp synchronises before freeing.
        if unsafe { ffi::llama_set_n_ubatch(self.ptr.as_ptr(), n_ubatch) } {
            Ok(())
        } else {
            Err(EngineError::Ubatch(format!(
                "the ubatch of this context cannot change to {n_ubatch} (its attention is not causal)"
            )))
        }
    }

    /// Reserve the compute buffers (and streaming slots) now rather than
    /// at the next decode; fails when they cannot be allocated.
    pub fn reserve_compute(&mut self) -> Result<()> {
        // SAFETY: valid context.
        if unsafe { ffi::llama_reserve_compute(self.ptr.as_ptr()) } {
            Ok(())
        } else {
            Err(EngineError::Ubatch("the compute buffers could not be reserved".into()))
        }
    }

    /// llama.cpp's own timing of this context since the last
    /// [`Context::reset_perf`]: each decode from its start to the
    /// synchronisation that ends it, without the caller's time in between.
    pub fn perf(&self) -> Perf {
        // SAFETY: valid context; plain data returned by value.
        let d = unsafe { ffi::llama_perf_context(self.ptr.as_ptr()) };
        Perf {
            prompt_ms: d.t_p_eval_ms,
            prompt_tokens: d.n_p_eval.max(0) as u32,
            decode_ms: d.t_eval_ms,
            decode_tokens: d.n_eval.max(0) as u32,
            graphs_reused: d.n_reused.max(0) as u32,
        }
    }

    /// Start llama.cpp's timing ([`Context::perf`]) afresh.
    pub fn reset_perf(&mut self) {
        // SAFETY: valid context.
        unsafe { ffi::llama_perf_context_reset(self.ptr.as_ptr()) };
    }

    /// Decodes since the context was made (or its timing was reset) that ran
    /// the previous ubatch's graph again instead of building one (llama.cpp's
    /// graph reuse).
    pub fn graphs_reused(&self) -> u32 {
        self.perf().graphs_reused
    }

    /// End graph reuse: the next decode builds and splits its graph again
    /// and reserves the compute buffers again in place (patch 0023's
    /// `llama_set_stream_slots` with the context's own slots, which keeps
    /// the buffers allocated; they only grow). What the per-op callbacks
    /// (offload, hybrid experts, row split) answer is read at graph build,
    /// so a graph made before they changed would keep the old decisions.
    pub fn rebuild_graphs(&mut self) {
        let (slots, routed_max) = self.stream;
        self.context_ref().set_stream_slots(slots, routed_max);
    }

    /// The streaming slots and routed-expert threshold it was made with
    /// ([`ContextParams::stream_slots`], [`ContextParams::stream_routed_max`]),
    /// which [`Context::rebuild_graphs`] sets again.
    pub fn stream_params(&self) -> (u32, u32) {
        self.stream
    }

    /// Forget all sequences.
    pub fn clear(&mut self) {
        // SAFETY: valid context.
        unsafe { ffi::llama_memory_clear(ffi::llama_get_memory(self.ptr.as_ptr()), true) };
    }

    /// Highest position stored for a sequence, or -1.
    pub fn seq_pos_max(&self, seq: i32) -> i32 {
        // SAFETY: valid context.
        unsafe { ffi::llama_memory_seq_pos_max(ffi::llama_get_memory(self.ptr.as_ptr()), seq) }
    }

    /// Device bytes this context and its model hold in llama.cpp's buffers
    /// (weights, KV cache, compute), from [`Context::memory_breakdown`].
    pub fn device_bytes(&self) -> u64 {
        self.memory_breakdown()
            .iter()
            .filter(|m| !m.is_host)
            .map(|m| m.total())
            .sum()
    }

    /// Memory per buffer type used by this context and its model (patch 0001).
    pub fn memory_breakdown(&self) -> Vec<MemoryBreakdown> {
        let mut entries = vec![ffi::llama_memory_breakdown_entry::default(); 16];
        // SAFETY: entries holds 16 writable elements.
        let n = unsafe { ffi::llama_get_memory_breakdown_c(self.ptr.as_ptr(), entries.as_mut_ptr(), 16) };
        if n as usize > entries.len() {
            entries = vec![ffi::llama_memory_breakdown_entry::default(); n as usize];
            // SAFETY: as above, with room for all n.
            unsafe { ffi::llama_get_memory_breakdown_c(self.ptr.as_ptr(), entries.as_mut_ptr(), n) };
        }
        entries.truncate(n.max(0) as usize);
        entries
            .into_iter()
            .map(|e| {
                let b = BufferType(e.buft);
                MemoryBreakdown {
                    buffer_type: b.name(),
                    is_host: b.is_host(),
                    device: b.device_index(),
                    model: e.model as u64,
                    context: e.context as u64,
                    compute: e.compute as u64,
                }
            })
            .collect()
    }

    pub(crate) fn as_ptr(&self) -> *mut ffi::llama_context {
        self.ptr.as_ptr()
    }
}

/// llama.cpp's timing of a context (`llama_perf_context`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Perf {
    /// Batches of more than one token: milliseconds and tokens.
    pub prompt_ms: f64,
    pub prompt_tokens: u32,
    /// Single-token decodes: milliseconds and tokens.
    pub decode_ms: f64,
    pub decode_tokens: u32,
    /// Decodes that reused the previous compute graph.
    pub graphs_reused: u32,
}

/// One token of a multi-sequence batch.
#[derive(Debug, Clone, Copy)]
pub struct BatchItem {
    pub token: Token,
    pub pos: i32,
    pub seq: i32,
    /// Keep this token's logits.
    pub logits: bool,
}
