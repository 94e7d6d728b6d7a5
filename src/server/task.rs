//! What a request asks the slot worker for, and what comes back.

use tokio::sync::mpsc::UnboundedSender;

use crate::engine::{SamplingParams, Token};

/// Generation settings of one request, after defaults are applied.
#[derive(Debug, Clone)]
pub struct GenParams {
    /// Tokens to generate at most (-1: until the slot's context is full).
    pub n_predict: i32,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// How many most likely tokens to report per generated token (0: none).
    pub n_probs: usize,
    /// Report log-probabilities (OpenAI `logprobs`) even with `n_probs == 0`.
    pub want_logprobs: bool,
    /// Reuse the KV cache of the slot's previous prompt.
    pub cache_prompt: bool,
    pub ignore_eos: bool,
    /// Render special tokens as text.
    pub special: bool,
    /// Slot to run on (-1: any).
    pub id_slot: i32,
}

/// One generation job for the worker.
pub struct GenJob {
    pub prompt: Vec<Token>,
    pub params: GenParams,
    /// Where results go; dropping the receiver cancels the job.
    pub events: UnboundedSender<Event>,
}

/// A token alternative with its log-probability.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TokenLogprob {
    pub id: Token,
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

/// One generated token with its probabilities.
#[derive(Debug, Clone)]
pub struct TokenProbs {
    pub chosen: TokenLogprob,
    pub top: Vec<TokenLogprob>,
}

/// Why generation ended, in upstream's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopType {
    /// End-of-generation token.
    Eos,
    /// `n_predict` or the context limit.
    Limit,
    /// A stop string.
    Word,
}

impl StopType {
    /// Upstream's `stop_type` string.
    pub fn as_str(self) -> &'static str {
        match self {
            StopType::Eos => "eos",
            StopType::Limit => "limit",
            StopType::Word => "word",
        }
    }
    /// OpenAI's `finish_reason`.
    pub fn finish_reason(self) -> &'static str {
        match self {
            StopType::Limit => "length",
            _ => "stop",
        }
    }
}

/// Counts and timings of a finished job.
#[derive(Debug, Clone)]
pub struct Final {
    pub id_slot: usize,
    pub stop_type: StopType,
    pub stopping_word: String,
    /// Prompt tokens in total.
    pub n_prompt: usize,
    /// Prompt tokens taken from the cache.
    pub n_cached: usize,
    pub n_predicted: usize,
    pub prompt_ms: f64,
    pub predicted_ms: f64,
}

impl Final {
    /// Upstream's `timings` object.
    pub fn timings(&self) -> serde_json::Value {
        let prompt_n = self.n_prompt - self.n_cached;
        let per = |n: usize, ms: f64| if n > 0 { ms / n as f64 } else { 0.0 };
        let rate = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
        serde_json::json!({
            "cache_n": self.n_cached,
            "prompt_n": prompt_n,
            "prompt_ms": self.prompt_ms,
            "prompt_per_token_ms": per(prompt_n, self.prompt_ms),
            "prompt_per_second": rate(prompt_n, self.prompt_ms),
            "predicted_n": self.n_predicted,
            "predicted_ms": self.predicted_ms,
            "predicted_per_token_ms": per(self.n_predicted, self.predicted_ms),
            "predicted_per_second": rate(self.n_predicted, self.predicted_ms),
        })
    }
}

/// What the worker sends back for a job.
#[derive(Debug, Clone)]
pub enum Event {
    /// New text (possibly empty when only probabilities are new).
    Chunk {
        text: String,
        tokens: Vec<Token>,
        probs: Vec<TokenProbs>,
    },
    /// The job ended.
    Done(Final),
    /// The job failed: a 4xx for a request that cannot be served as
    /// asked, a 5xx otherwise.
    Error(super::error::ApiError),
}
