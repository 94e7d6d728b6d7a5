//! Embeddings per output token and per sequence, without fallbacks, so
//! callers can pool themselves (the server's mean pooling).

use super::context::Context;
use super::ffi;

impl Context<'_> {
    /// Whether llama.cpp pools embeddings per sequence in this context (the
    /// model's or the context's pooling type is not "none").
    pub fn is_pooled(&self) -> bool {
        // SAFETY: plain query on a valid context.
        unsafe { ffi::llama_pooling_type(self.as_ptr()) != ffi::LLAMA_POOLING_TYPE_NONE }
    }

    /// Embedding of the `i`-th output of the last batch, for contexts created
    /// with embeddings on and no pooling; `None` when llama.cpp has none.
    pub fn output_embedding(&mut self, i: i32) -> Option<Vec<f32>> {
        if self.is_pooled() {
            return None;
        }
        let n = self.model().n_embd() as usize;
        // SAFETY: llama.cpp returns NULL for invalid indices or no embeddings,
        // otherwise a pointer to n_embd floats valid until the next decode.
        unsafe {
            let p = ffi::llama_get_embeddings_ith(self.as_ptr(), i);
            (!p.is_null()).then(|| std::slice::from_raw_parts(p, n).to_vec())
        }
    }

    /// Pooled embedding of a sequence in the last batch; `None` without pooling.
    pub fn sequence_embedding(&mut self, seq: i32) -> Option<Vec<f32>> {
        if !self.is_pooled() {
            return None;
        }
        let n = self.model().n_embd() as usize;
        // SAFETY: as above; NULL when the sequence has no pooled embedding.
        unsafe {
            let p = ffi::llama_get_embeddings_seq(self.as_ptr(), seq);
            (!p.is_null()).then(|| std::slice::from_raw_parts(p, n).to_vec())
        }
    }
}
