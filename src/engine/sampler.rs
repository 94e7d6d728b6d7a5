//! Token sampling: a llama.cpp sampler chain built from familiar parameters.

use std::ffi::CString;
use std::ptr::NonNull;

use super::context::Context;
use super::error::{EngineError, Result};
use super::ffi;
use super::model::{Model, Token};

/// Sampling parameters, with llama.cpp's defaults.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// 0 or below selects greedy decoding.
    pub temperature: f32,
    /// 0 disables.
    pub top_k: i32,
    /// 1.0 disables.
    pub top_p: f32,
    /// 0.0 disables.
    pub min_p: f32,
    /// 1.0 disables.
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub repeat_last_n: i32,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    /// Random seed; `u32::MAX` picks a random one.
    pub seed: u32,
    /// A GBNF grammar that constrains the output.
    pub grammar: Option<String>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: u32::MAX,
            grammar: None,
        }
    }
}

impl SamplingParams {
    /// Always pick the most likely token.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    }
}

/// A sampler chain.
pub struct Sampler {
    ptr: NonNull<ffi::llama_sampler>,
}

// SAFETY: a sampler chain is owned by one user at a time.
unsafe impl Send for Sampler {}

impl Drop for Sampler {
    fn drop(&mut self) {
        // SAFETY: the chain owns its members and is freed once.
        unsafe { ffi::llama_sampler_free(self.ptr.as_ptr()) };
    }
}

impl Sampler {
    /// Build the chain in upstream's order: penalties, top-k, top-p, min-p,
    /// temperature, then a seeded draw (or greedy when temperature <= 0).
    pub fn new(model: &Model, p: &SamplingParams) -> Result<Sampler> {
        for (name, v) in [("top_p", p.top_p), ("min_p", p.min_p)] {
            if !(0.0..=1.0).contains(&v) {
                return Err(EngineError::InvalidArgument(format!(
                    "{name} must be within [0, 1], got {v}"
                )));
            }
        }
        if p.repeat_penalty.is_nan() || p.repeat_penalty <= 0.0 || !p.temperature.is_finite() {
            return Err(EngineError::InvalidArgument(
                "repeat_penalty must be > 0 and temperature finite".into(),
            ));
        }
        // SAFETY: chain creation and adding freshly created samplers, which
        // the chain takes ownership of.
        unsafe {
            let mut cp = ffi::llama_sampler_chain_default_params();
            cp.no_perf = true;
            let chain = NonNull::new(ffi::llama_sampler_chain_init(cp))
                .ok_or_else(|| EngineError::InvalidArgument("sampler chain".into()))?;
            let s = Sampler { ptr: chain };
            let vocab = ffi::llama_model_get_vocab(model.as_ptr());
            if let Some(g) = &p.grammar {
                let gs = CString::new(g.as_str()).map_err(|_| EngineError::NulInText)?;
                let root = CString::new("root").unwrap();
                let gsmpl = ffi::llama_sampler_init_grammar(vocab, gs.as_ptr(), root.as_ptr());
                if gsmpl.is_null() {
                    return Err(EngineError::InvalidArgument("the grammar failed to parse".into()));
                }
                ffi::llama_sampler_chain_add(chain.as_ptr(), gsmpl);
            }
            if p.repeat_penalty != 1.0 || p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
                ffi::llama_sampler_chain_add(
                    chain.as_ptr(),
                    ffi::llama_sampler_init_penalties(
                        model.n_vocab(),
                        p.repeat_last_n,
                        p.repeat_penalty,
                        p.frequency_penalty,
                        p.presence_penalty,
                    ),
                );
            }
            if p.temperature <= 0.0 {
                ffi::llama_sampler_chain_add(chain.as_ptr(), ffi::llama_sampler_init_greedy());
            } else {
                if p.top_k > 0 {
                    ffi::llama_sampler_chain_add(chain.as_ptr(), ffi::llama_sampler_init_top_k(p.top_k));
                }
                if p.top_p < 1.0 {
                    ffi::llama_sampler_chain_add(chain.as_ptr(), ffi::llama_sampler_init_top_p(p.top_p, 1));
                }
                if p.min_p > 0.0 {
                    ffi::llama_sampler_chain_add(chain.as_ptr(), ffi::llama_sampler_init_min_p(p.min_p, 1));
                }
                ffi::llama_sampler_chain_add(chain.as_ptr(), ffi::llama_sampler_init_temp(p.temperature));
                ffi::llama_sampler_chain_add(chain.as_ptr(), ffi::llama_sampler_init_dist(p.seed));
            }
            Ok(s)
        }
    }

    /// Sample from the `idx`-th output of the last decode (-1: the last) and
    /// accept the token into the chain's state.
    pub fn sample(&mut self, ctx: &mut Context<'_>, idx: i32) -> Token {
        // SAFETY: ctx is valid; llama_sampler_sample also accepts the token.
        unsafe { ffi::llama_sampler_sample(self.ptr.as_ptr(), ctx.as_ptr(), idx) }
    }

    /// The chain, for llama.cpp calls that take it (backend sampling).
    pub(crate) fn as_ptr(&self) -> *mut ffi::llama_sampler {
        self.ptr.as_ptr()
    }

    /// Feed a token (e.g. from the prompt) to the chain's history.
    pub fn accept(&mut self, token: Token) {
        // SAFETY: valid chain.
        unsafe { ffi::llama_sampler_accept(self.ptr.as_ptr(), token) };
    }

    /// Reset the chain's state (penalty history, grammar, RNG stays seeded).
    pub fn reset(&mut self) {
        // SAFETY: valid chain.
        unsafe { ffi::llama_sampler_reset(self.ptr.as_ptr()) };
    }
}
