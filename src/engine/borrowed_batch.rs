//! Several sequences decoding together in a borrowed context
//! ([`ContextRef`]): the server's context holds one sequence per slot, and
//! pipeshard times the ubatch its slots decode together (one token of each)
//! between two of its batches ([`crate::launch::tune_batch`]).

use super::error::{EngineError, Result};
use super::ffi;
use super::migrate::ContextRef;
use super::model::Token;
use super::sampler::argmax;

/// A token batch of llama.cpp's, freed when it drops.
struct Batch(ffi::llama_batch);

impl Drop for Batch {
    fn drop(&mut self) {
        // SAFETY: made by llama_batch_init in `decode_each_seq`, freed once.
        unsafe { ffi::llama_batch_free(self.0) };
    }
}

impl ContextRef<'_> {
    /// Copy every cell of sequence `src` to sequence `dst` (in another KV
    /// stream, the whole stream is copied at the next decode); false where
    /// the memory cannot.
    pub fn seq_cp(&mut self, src: i32, dst: i32) -> bool {
        let n = self.n_seq_max() as i32;
        if !(0..n).contains(&src) || !(0..n).contains(&dst) {
            return false;
        }
        // SAFETY: a live context, used by nobody else during the call;
        // both sequences within n_seq_max; the whole range, which a copy
        // across streams needs.
        unsafe { ffi::llama_memory_seq_cp(ffi::llama_get_memory(self.raw()), src, dst, -1, -1) };
        true
    }

    /// Decode one token of each sequence `0..tokens.len()`, `tokens[s]` at
    /// position `pos`, in one ubatch with every one's logits, and wait for
    /// them.
    pub fn decode_each_seq(&mut self, tokens: &[Token], pos: i32) -> Result<()> {
        let n = tokens.len();
        let n_ctx = self.n_ctx_seq();
        if n == 0 || n > self.n_seq_max() as usize || pos < 0 || pos as u32 >= n_ctx {
            return Err(EngineError::ContextOverflow {
                n_tokens: pos.max(0) as usize + 1,
                n_ctx,
            });
        }
        let n_vocab = self.n_vocab();
        if let Some(&bad) = tokens.iter().find(|&&t| t < 0 || t >= n_vocab) {
            return Err(EngineError::TokenOutOfRange { token: bad, n_vocab });
        }
        // SAFETY: a batch of `n` tokens with one sequence id each.
        let mut batch = Batch(unsafe { ffi::llama_batch_init(n as i32, 0, 1) });
        // SAFETY: `n` tokens written into a batch of `n`; a live context,
        // used by nobody else during the calls; waits for the decode's work.
        unsafe {
            for (s, &t) in tokens.iter().enumerate() {
                *batch.0.token.add(s) = t;
                *batch.0.pos.add(s) = pos;
                *batch.0.n_seq_id.add(s) = 1;
                *(*batch.0.seq_id.add(s)) = s as i32;
                *batch.0.logits.add(s) = 1;
            }
            batch.0.n_tokens = n as i32;
            let rc = ffi::llama_decode(self.raw(), batch.0);
            if rc != 0 {
                return Err(EngineError::Decode { code: rc });
            }
            ffi::llama_synchronize(self.raw());
        }
        Ok(())
    }

    /// The greedy token of output `i` of the last decode, where it has
    /// logits (a context that samples on the backend may have none).
    pub fn greedy_ith(&mut self, i: i32) -> Option<Token> {
        let n_vocab = self.n_vocab().max(0) as usize;
        // SAFETY: NULL for an output without logits, else n_vocab floats
        // valid until the next decode.
        unsafe {
            let p = ffi::llama_get_logits_ith(self.raw(), i);
            (!p.is_null()).then(|| argmax(std::slice::from_raw_parts(p, n_vocab)))
        }
    }
}
