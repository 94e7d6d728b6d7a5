//! Decoding in a borrowed context ([`ContextRef`]): the server's context,
//! which upstream owns, decodes tokens of sequence 0 for pipeshard's own
//! measurement between two of its batches (the decode split tuned before
//! the first request, [`crate::launch::tune::tune_served`]).

use super::error::{EngineError, Result};
use super::ffi;
use super::migrate::ContextRef;
use super::model::Token;
use super::sampler::argmax;

/// A token batch of llama.cpp's, freed when it drops.
struct Batch(ffi::llama_batch);

impl Drop for Batch {
    fn drop(&mut self) {
        // SAFETY: made by llama_batch_init in `decode_seq0`, freed once.
        unsafe { ffi::llama_batch_free(self.0) };
    }
}

impl ContextRef<'_> {
    /// Cells of one sequence's KV stream.
    pub fn n_ctx_seq(&self) -> u32 {
        // SAFETY: a live context; plain query.
        unsafe { ffi::llama_n_ctx_seq(self.raw()) }
    }

    /// Tokens of the model's vocabulary.
    pub fn n_vocab(&self) -> i32 {
        // SAFETY: a live model and its vocabulary; plain query.
        unsafe { ffi::llama_vocab_n_tokens(ffi::llama_model_get_vocab(self.model())) }
    }

    /// Remove positions `[p0, p1)` of sequence `seq` (-1: open end).
    pub fn seq_rm(&mut self, seq: i32, p0: i32, p1: i32) -> bool {
        // SAFETY: a live context, used by nobody else during the call.
        unsafe { ffi::llama_memory_seq_rm(ffi::llama_get_memory(self.raw()), seq, p0, p1) }
    }

    /// Decode `tokens` of sequence 0 from position `pos`, in batches of the
    /// context's `n_batch`, with the last token's logits, and wait for them.
    pub fn decode_seq0(&mut self, tokens: &[Token], pos: i32) -> Result<()> {
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
        // SAFETY: a live context; plain query.
        let cap = (unsafe { ffi::llama_n_batch(self.raw()) } as usize).max(1);
        // SAFETY: a batch of `cap` tokens with one sequence id each.
        let mut batch = Batch(unsafe { ffi::llama_batch_init(cap as i32, 0, 1) });
        let n = tokens.len();
        for (c, chunk) in tokens.chunks(cap).enumerate() {
            let first = c * cap;
            // SAFETY: the chunk holds at most `cap` tokens, the batch's size.
            unsafe {
                for (i, &t) in chunk.iter().enumerate() {
                    *batch.0.token.add(i) = t;
                    *batch.0.pos.add(i) = pos + (first + i) as i32;
                    *batch.0.n_seq_id.add(i) = 1;
                    *(*batch.0.seq_id.add(i)) = 0;
                    *batch.0.logits.add(i) = i8::from(first + i + 1 == n);
                }
                batch.0.n_tokens = chunk.len() as i32;
                let rc = ffi::llama_decode(self.raw(), batch.0);
                if rc != 0 {
                    return Err(EngineError::Decode { code: rc });
                }
            }
        }
        // SAFETY: a live context; waits for the decode's work.
        unsafe { ffi::llama_synchronize(self.raw()) };
        Ok(())
    }

    /// The greedy token of the last decode's last output, where it has
    /// logits (a context that samples on the backend may have none).
    pub fn greedy_last(&mut self) -> Option<Token> {
        let n_vocab = self.n_vocab().max(0) as usize;
        // SAFETY: NULL for an output without logits, else n_vocab floats
        // valid until the next decode.
        unsafe {
            let p = ffi::llama_get_logits_ith(self.raw(), -1);
            (!p.is_null()).then(|| argmax(std::slice::from_raw_parts(p, n_vocab)))
        }
    }
}
