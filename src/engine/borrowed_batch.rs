//! Several sequences decoding together in a borrowed context
//! ([`ContextRef`]): the server's context holds one sequence per slot, and
//! pipeshard times the ubatch its slots decode together (one token of each)
//! between two of its batches ([`crate::launch::tune_batch`]).

use super::error::{EngineError, Result};
use super::ffi;
use super::migrate::ContextRef;
use super::model::Token;
use super::seq0::Batch;

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
        unsafe { ffi::llama_memory_seq_cp(ffi::llama_get_memory(self.raw().as_ptr()), src, dst, -1, -1) };
        true
    }

    /// Remove positions `[p0, p1)` (-1: open end) of sequence `seq`; false
    /// where the memory cannot (a recurrent state drops none but all of its
    /// positions) or the sequence is out of range.
    pub fn seq_rm(&mut self, seq: i32, p0: i32, p1: i32) -> bool {
        if !(0..self.n_seq_max() as i32).contains(&seq) {
            return false;
        }
        // SAFETY: a live context, used by nobody else during the call; a
        // sequence within n_seq_max.
        unsafe { ffi::llama_memory_seq_rm(ffi::llama_get_memory(self.raw().as_ptr()), seq, p0, p1) }
    }

    /// Decode one token of each sequence `0..tokens.len()`, `tokens[s]` at
    /// position `pos`, in one ubatch with every one's logits, and wait for
    /// them.
    pub fn decode_each_seq(&mut self, tokens: &[Token], pos: i32) -> Result<()> {
        let n = tokens.len();
        let (n_ctx, n_vocab) = (self.n_ctx_seq(), self.n_vocab());
        if n == 0 || n > self.n_seq_max() as usize || pos < 0 || pos as u32 >= n_ctx {
            return Err(EngineError::ContextOverflow {
                n_tokens: pos.max(0) as usize + 1,
                n_ctx,
            });
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t < 0 || t >= n_vocab) {
            return Err(EngineError::TokenOutOfRange { token: bad, n_vocab });
        }
        let mut batch = Batch::new(n, 1);
        for (s, &t) in tokens.iter().enumerate() {
            batch.set(s, t, pos, s as i32, true);
        }
        batch.decode(self.raw().as_ptr(), n)?;
        // SAFETY: a live context, used by nobody else during the call.
        unsafe { ffi::llama_synchronize(self.raw().as_ptr()) };
        Ok(())
    }
}
