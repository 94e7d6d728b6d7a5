//! Sequence 0 of a llama.cpp context at the raw level: its tokens decoded
//! through a token batch, the greedy token of an output, and going back to
//! a depth it held ([`Seq0::mark`], [`Seq0::rewind`]). One implementation
//! behind an owned [`super::Context`]'s decoding and a borrowed context's
//! ([`ContextRef`], the server's, decoding for the decode split tuned
//! before its first request).
//!
//! Going back: a KV cache drops the cells past the depth (a sliding
//! window's too: it holds the window and a ubatch, padded to 256 cells,
//! and a few steps past the depth reuse cells that left the window). A
//! recurrent state (Mamba, Gated-DeltaNet: `qwen35moe`, `qwen3next`) holds
//! no earlier position, so llama.cpp refuses to drop part of it: for such a
//! memory the mark keeps that part of the state in host memory (llama.cpp's
//! state API, `LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`), and the rewind puts it
//! back before dropping the attention's cells.

use std::marker::PhantomData;
use std::ptr::NonNull;

use super::error::{EngineError, Result};
use super::ffi;
use super::migrate::ContextRef;
use super::model::Token;
use super::sampler::argmax;

/// A token batch of llama.cpp's with one sequence id per token, freed when
/// it drops.
pub(super) struct Batch {
    raw: ffi::llama_batch,
    cap: usize,
}

impl Batch {
    /// Room for `cap` tokens (at least 1), each of up to `n_seq` sequences.
    pub(super) fn new(cap: usize, n_seq: u32) -> Batch {
        let cap = cap.clamp(1, i32::MAX as usize);
        // SAFETY: allocates the arrays of `cap` tokens; freed in Drop.
        let raw = unsafe { ffi::llama_batch_init(cap as i32, 0, n_seq.max(1) as i32) };
        Batch { raw, cap }
    }

    pub(super) fn cap(&self) -> usize {
        self.cap
    }

    /// Write token `i` (below [`Batch::cap`]) of sequence `seq`.
    pub(super) fn set(&mut self, i: usize, token: Token, pos: i32, seq: i32, logits: bool) {
        assert!(i < self.cap, "token {i} of a batch of {}", self.cap);
        // SAFETY: every array holds `cap` entries and `seq_id[i]` at least
        // one id (llama_batch_init).
        unsafe {
            *self.raw.token.add(i) = token;
            *self.raw.pos.add(i) = pos;
            *self.raw.n_seq_id.add(i) = 1;
            *(*self.raw.seq_id.add(i)) = seq;
            *self.raw.logits.add(i) = i8::from(logits);
        }
    }

    /// Decode the first `n` tokens written (at most [`Batch::cap`]).
    pub(super) fn decode(&mut self, ctx: *mut ffi::llama_context, n: usize) -> Result<()> {
        self.raw.n_tokens = n.min(self.cap) as i32;
        // SAFETY: a live context, used by nobody else during the call; the
        // batch's first `n` tokens are written.
        let rc = unsafe { ffi::llama_decode(ctx, self.raw) };
        if rc != 0 {
            return Err(EngineError::Decode { code: rc });
        }
        Ok(())
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // SAFETY: made by llama_batch_init in `Batch::new`, freed once.
        unsafe { ffi::llama_batch_free(self.raw) };
    }
}

/// The batch a [`Seq0`] decodes through: the owned context's, or one of its
/// own for a borrowed context.
enum BatchSlot<'a> {
    Borrowed(&'a mut Batch),
    Owned(Batch),
}

/// Sequence 0 of a context, borrowed exclusively.
pub struct Seq0<'a> {
    ctx: NonNull<ffi::llama_context>,
    batch: BatchSlot<'a>,
    /// The context samples sequence 0 greedily on its backend
    /// ([`super::ContextParams::backend_greedy`]).
    sampled: bool,
    _borrow: PhantomData<&'a mut ffi::llama_context>,
}

/// Sequence 0 as it was at a depth, to go back to ([`Seq0::rewind`]).
pub struct Seq0Mark {
    depth: i32,
    /// The recurrent state, which dropping cells cannot take back, where
    /// the memory has one.
    partial: Option<Vec<u8>>,
}

impl Seq0Mark {
    /// Positions held at the mark: the next token goes at this one.
    pub fn depth(&self) -> u32 {
        self.depth.max(0) as u32
    }
}

impl<'a> Seq0<'a> {
    /// Sequence 0 of `ctx`, decoded through `batch`.
    pub(super) fn new(ctx: NonNull<ffi::llama_context>, batch: &'a mut Batch, sampled: bool) -> Seq0<'a> {
        Seq0 {
            ctx,
            batch: BatchSlot::Borrowed(batch),
            sampled,
            _borrow: PhantomData,
        }
    }

    fn raw(&self) -> *mut ffi::llama_context {
        self.ctx.as_ptr()
    }

    fn memory(&self) -> ffi::llama_memory_t {
        // SAFETY: a live context; plain query.
        unsafe { ffi::llama_get_memory(self.raw()) }
    }

    fn model(&self) -> *const ffi::llama_model {
        // SAFETY: a live context; the model outlives it.
        unsafe { ffi::llama_get_model(self.raw()) }
    }

    /// The whole context, for what it does beside sequence 0's decoding
    /// (its graphs rebuilt, [`ContextRef::set_stream_slots`]).
    pub fn context(&mut self) -> ContextRef<'_> {
        // SAFETY: the context is live and borrowed exclusively by self,
        // which the returned borrow holds.
        unsafe { ContextRef::from_raw(self.raw()) }.expect("a Seq0 holds a non-null context")
    }

    /// Cells of one sequence's KV stream.
    pub fn n_ctx_seq(&self) -> u32 {
        n_ctx_seq(self.ctx)
    }

    /// Tokens of the model's vocabulary.
    pub fn n_vocab(&self) -> i32 {
        n_vocab(self.ctx)
    }

    /// Decode `tokens` from position `pos`, in batches of the context's
    /// `n_batch`; the last token's logits are kept where `logits_last` is
    /// set. Returns without waiting for the computation.
    pub fn decode(&mut self, tokens: &[Token], pos: i32, logits_last: bool) -> Result<()> {
        let n_ctx = self.n_ctx_seq();
        if pos < 0 || pos as usize + tokens.len() > n_ctx as usize {
            return Err(EngineError::ContextOverflow {
                n_tokens: pos.max(0) as usize + tokens.len(),
                n_ctx,
            });
        }
        let n_vocab = self.n_vocab();
        if let Some(&bad) = tokens.iter().find(|&&t| t < 0 || t >= n_vocab) {
            return Err(EngineError::TokenOutOfRange { token: bad, n_vocab });
        }
        let ctx = self.raw();
        let batch = match &mut self.batch {
            BatchSlot::Borrowed(b) => &mut **b,
            BatchSlot::Owned(b) => b,
        };
        let (cap, n) = (batch.cap(), tokens.len());
        for (c, chunk) in tokens.chunks(cap).enumerate() {
            let first = c * cap;
            for (i, &t) in chunk.iter().enumerate() {
                let last = first + i + 1 == n;
                batch.set(i, t, pos + (first + i) as i32, 0, logits_last && last);
            }
            batch.decode(ctx, chunk.len())?;
        }
        Ok(())
    }

    /// Wait for the decodes' work.
    pub fn synchronize(&mut self) {
        // SAFETY: a live context.
        unsafe { ffi::llama_synchronize(self.raw()) };
    }

    /// The token that the context's greedy backend sampling chose for the
    /// `i`-th output of the last batch (-1: the last one), waited for;
    /// `None` where it did not run.
    pub fn sampled(&mut self, i: i32) -> Option<Token> {
        if !self.sampled {
            return None;
        }
        // SAFETY: a live context; LLAMA_TOKEN_NULL for an output without one.
        let t = unsafe { ffi::llama_get_sampled_token_ith(self.raw(), i) };
        (t != ffi::LLAMA_TOKEN_NULL).then_some(t)
    }

    /// The greedy token of the `i`-th output of the last batch (-1: the
    /// last one), waited for: backend sampling's where the context has it,
    /// else the [`argmax`] of the logits; `None` where the output has
    /// neither.
    pub fn greedy(&mut self, i: i32) -> Option<Token> {
        if let Some(t) = self.sampled(i) {
            return Some(t);
        }
        logits_argmax(self.ctx, i)
    }

    /// Remove positions `[p0, p1)` (-1: open end); false where the memory
    /// cannot (a recurrent state drops none but all of its positions).
    pub fn seq_rm(&mut self, p0: i32, p1: i32) -> bool {
        // SAFETY: a live context, used by nobody else during the call.
        unsafe { ffi::llama_memory_seq_rm(self.memory(), 0, p0, p1) }
    }

    /// Highest position held, or -1.
    pub fn pos_max(&self) -> i32 {
        // SAFETY: a live context; plain query of its memory.
        unsafe { ffi::llama_memory_seq_pos_max(self.memory(), 0) }
    }

    /// Whether part of the memory cannot go back by dropping cells: a
    /// recurrent state, alone or beside attention.
    fn has_recurrent_state(&self) -> bool {
        let m = self.model();
        // SAFETY: a live model; plain queries.
        unsafe { ffi::llama_model_is_recurrent(m) || ffi::llama_model_is_hybrid(m) }
    }

    /// Mark the sequence as it is now, to go back to it after decoding past
    /// it ([`Seq0::rewind`]). Waits for the decodes' work.
    pub fn mark(&mut self) -> Result<Seq0Mark> {
        let partial = if self.has_recurrent_state() {
            let flags = ffi::LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY;
            // SAFETY: a live context; the size query writes nothing.
            let size = unsafe { ffi::llama_state_seq_get_size_ext(self.raw(), 0, flags) };
            let mut state = vec![0u8; size];
            // SAFETY: `state` holds `size` writable bytes.
            let n = unsafe { ffi::llama_state_seq_get_data_ext(self.raw(), state.as_mut_ptr(), size, 0, flags) };
            if n == 0 {
                return Err(EngineError::SeqState(
                    "llama.cpp could not copy its recurrent state".into(),
                ));
            }
            state.truncate(n);
            Some(state)
        } else {
            self.synchronize();
            None
        };
        Ok(Seq0Mark {
            depth: self.pos_max() + 1,
            partial,
        })
    }

    /// Go back to `mark`: the positions decoded after it removed, and the
    /// state that removing them cannot restore put back. Fails, with the
    /// reason, where the sequence cannot be as it was.
    pub fn rewind(&mut self, mark: &Seq0Mark) -> Result<()> {
        // A KV cache: its cells up to the mark, as they were.
        if self.seq_rm(mark.depth, -1) && self.pos_max() == mark.depth - 1 {
            return Ok(());
        }
        let Some(state) = &mark.partial else {
            return Err(EngineError::SeqState(format!(
                "the context's memory cannot go back to position {} (it cannot drop the positions after it, and nothing of its state was kept)",
                mark.depth
            )));
        };
        let flags = ffi::LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY;
        // SAFETY: `state` is what llama_state_seq_get_data_ext wrote for
        // sequence 0 of this context with the same flags.
        let n = unsafe { ffi::llama_state_seq_set_data_ext(self.raw(), state.as_ptr(), state.len(), 0, flags) };
        if n == 0 {
            return Err(EngineError::SeqState(
                "llama.cpp could not restore its recurrent state".into(),
            ));
        }
        // The recurrent state is at the mark again; the attention's cells
        // after it go.
        if !(self.seq_rm(mark.depth, -1) && self.pos_max() == mark.depth - 1) {
            return Err(EngineError::SeqState(format!(
                "after its state was restored it holds positions up to {}, not {}",
                self.pos_max(),
                mark.depth - 1
            )));
        }
        Ok(())
    }
}

/// Cells of one sequence's KV stream of `ctx`.
fn n_ctx_seq(ctx: NonNull<ffi::llama_context>) -> u32 {
    // SAFETY: a live context; plain query.
    unsafe { ffi::llama_n_ctx_seq(ctx.as_ptr()) }
}

/// Tokens of the vocabulary of `ctx`'s model.
fn n_vocab(ctx: NonNull<ffi::llama_context>) -> i32 {
    // SAFETY: a live context, whose model and vocabulary outlive it; plain
    // queries.
    unsafe { ffi::llama_vocab_n_tokens(ffi::llama_model_get_vocab(ffi::llama_get_model(ctx.as_ptr()))) }
}

/// The [`argmax`] of the logits of `ctx`'s `i`-th output of the last batch
/// (-1: the last one), waited for; `None` where it has none.
fn logits_argmax(ctx: NonNull<ffi::llama_context>, i: i32) -> Option<Token> {
    let n = n_vocab(ctx).max(0) as usize;
    // SAFETY: NULL for an output without logits, else n_vocab floats valid
    // until the next decode.
    unsafe {
        let p = ffi::llama_get_logits_ith(ctx.as_ptr(), i);
        (!p.is_null()).then(|| argmax(std::slice::from_raw_parts(p, n)))
    }
}

impl ContextRef<'_> {
    /// Cells of one sequence's KV stream.
    pub fn n_ctx_seq(&self) -> u32 {
        n_ctx_seq(self.raw())
    }

    /// Tokens of the model's vocabulary.
    pub fn n_vocab(&self) -> i32 {
        n_vocab(self.raw())
    }

    /// The greedy token of output `i` of the last decode, the argmax of its
    /// logits, where it has logits (a context that samples on the backend
    /// may have none).
    pub fn greedy_ith(&mut self, i: i32) -> Option<Token> {
        logits_argmax(self.raw(), i)
    }

    /// Its sequence 0, decoded through a batch of the context's `n_batch`
    /// tokens; the greedy token is the logits' (backend sampling here is
    /// upstream's, not necessarily greedy).
    pub fn seq0(&mut self) -> Seq0<'_> {
        let ctx = self.raw();
        // SAFETY: a live context; plain query.
        let cap = unsafe { ffi::llama_n_batch(ctx.as_ptr()) } as usize;
        Seq0 {
            ctx,
            batch: BatchSlot::Owned(Batch::new(cap, 1)),
            sampled: false,
            _borrow: PhantomData,
        }
    }
}
