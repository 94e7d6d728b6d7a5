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

/// The first index of the largest logit: greedy sampling. Per block of 64
/// the maximum is taken lane by lane (which the compiler vectorises), and
/// only the first block holding the overall maximum is searched, so a
/// 150k-entry vocabulary costs microseconds, not the ~0.1 ms of an indexed
/// scan, which showed in full-GPU decode at ~250 tokens/s (issue 16).
pub fn argmax(v: &[f32]) -> Token {
    const BLOCK: usize = 64;
    const LANES: usize = 16;
    let block_max = |b: &[f32]| {
        let mut m = [f32::NEG_INFINITY; LANES];
        let mut chunks = b.chunks_exact(LANES);
        for c in &mut chunks {
            for (m, &x) in m.iter_mut().zip(c) {
                *m = if x > *m { x } else { *m };
            }
        }
        let tail = chunks
            .remainder()
            .iter()
            .fold(f32::NEG_INFINITY, |a, &x| if x > a { x } else { a });
        m.iter().fold(tail, |a, &x| if x > a { x } else { a })
    };
    let mut best = (0, f32::NEG_INFINITY);
    for (bi, b) in v.chunks(BLOCK).enumerate() {
        let m = block_max(b);
        if m > best.1 {
            best = (bi, m);
        }
    }
    let start = best.0 * BLOCK;
    let offset = v[start..].iter().position(|&x| x == best.1).unwrap_or(0);
    (start + offset) as Token
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_maximum_wins_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    }

    /// The blocked search gives the indexed scan's answer on vocabulary-sized
    /// inputs: maxima in any block, at any lane, in a partial last block, and
    /// ties across blocks.
    #[test]
    fn the_blocked_argmax_agrees_with_a_scan() {
        let scan = |v: &[f32]| {
            let mut best = 0;
            for (i, &x) in v.iter().enumerate() {
                if x > v[best] {
                    best = i;
                }
            }
            best as Token
        };
        let mut s: u64 = 0x9e3779b97f4a7c15;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for n in [1usize, 15, 16, 63, 64, 65, 1000, 151_936] {
            for _ in 0..20 {
                let mut v: Vec<f32> = (0..n).map(|_| (next() % 2000) as f32 / 100.0 - 10.0).collect();
                assert_eq!(argmax(&v), scan(&v), "n {n}");
                // A tie between two blocks: the earlier one wins.
                let (a, b) = ((next() as usize) % n, (next() as usize) % n);
                v[a] = 50.0;
                v[b] = 50.0;
                assert_eq!(argmax(&v), scan(&v), "n {n}, ties at {a} and {b}");
            }
        }
        assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), 0);
    }
}
