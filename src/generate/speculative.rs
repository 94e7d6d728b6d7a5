//! Speculative decoding with a draft model.
//!
//! Each step the draft model proposes up to `n_max` tokens, greedily and one
//! at a time; the model then evaluates its last sampled token and the draft
//! in one batch, samples every position in order exactly as plain decoding
//! would, and keeps the draft tokens up to the first one it did not sample
//! itself. The text is the same as without a draft; what changes is that
//! one batch of `n_max + 1` tokens replaces several single-token decodes,
//! which is cheap where weights are streamed or computed on the CPU (the
//! planner's verification tier).

use std::time::{Duration, Instant};

use super::{evaluate_prompt, stats, Emitter, GenerateOutput, GenerateRequest, StopReason};
use crate::engine::{BatchItem, Context, EngineError, Model, Token};

/// How the draft model drafts (llama.cpp's `--spec-draft-*` options).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftParams {
    /// Most tokens drafted per step.
    pub n_max: u32,
    /// A draft shorter than this is not checked.
    pub n_min: u32,
    /// The draft stops at a token whose probability under the draft model
    /// is below this.
    pub p_min: f32,
}

impl Default for DraftParams {
    /// llama.cpp's defaults.
    fn default() -> Self {
        DraftParams {
            n_max: 3,
            n_min: 0,
            p_min: 0.0,
        }
    }
}

/// What speculation did during one generation.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SpeculationStats {
    /// Verification batches the model evaluated.
    pub steps: usize,
    /// Draft tokens proposed and checked.
    pub drafted: usize,
    /// Draft tokens the model accepted.
    pub accepted: usize,
    /// The draft model's prompt processing, after the first token.
    pub draft_prompt_ms: f64,
    /// The draft model drafting (prompt processing excluded).
    pub draft_ms: f64,
    /// The model evaluating verification batches and sampling them.
    pub verify_ms: f64,
}

impl SpeculationStats {
    /// Accepted draft tokens over drafted ones.
    pub fn acceptance(&self) -> f64 {
        self.accepted as f64 / (self.drafted.max(1)) as f64
    }
}

/// Checks that `draft` can draft for `model`: the same vocabulary, so its
/// token ids mean the same text.
fn check_vocab(model: &Model, draft: &Model) -> Result<(), EngineError> {
    let same = model.n_vocab() == draft.n_vocab()
        && model.token_bos() == draft.token_bos()
        && model.token_eos() == draft.token_eos()
        && (0..model.n_vocab())
            .step_by((model.n_vocab() as usize / 64).max(1))
            .all(|t| model.token_to_bytes(t, true).ok() == draft.token_to_bytes(t, true).ok());
    if same {
        Ok(())
    } else {
        Err(EngineError::InvalidArgument(format!(
            "the draft model's vocabulary ({} tokens) is not the model's ({} tokens)",
            draft.n_vocab(),
            model.n_vocab()
        )))
    }
}

/// The most likely token of `logits`, and whether its probability is at
/// least `p_min` (the softmax over the whole vocabulary, a millisecond for
/// 128k tokens, is only computed when `p_min` is positive).
fn greedy(logits: &[f32], p_min: f32) -> (Token, bool) {
    let (best, max) = logits
        .iter()
        .copied()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |b, (i, l)| if l > b.1 { (i, l) } else { b });
    if p_min <= 0.0 {
        return (best as Token, true);
    }
    let sum: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    (best as Token, 1.0 / sum.max(f32::MIN_POSITIVE) >= p_min)
}

/// Generate from a fresh sequence 0 of `ctx` with `draft` proposing tokens;
/// otherwise as [`super::generate`], with the same text for the same
/// request.
pub fn generate_speculative(
    ctx: &mut Context<'_>,
    draft: &mut Context<'_>,
    params: &DraftParams,
    req: &GenerateRequest,
    on_text: impl FnMut(&str) -> bool,
) -> Result<(GenerateOutput, SpeculationStats), EngineError> {
    let model = ctx.model();
    check_vocab(model, draft.model())?;
    let n_ctx = ctx.n_ctx().min(draft.n_ctx()) as usize;
    draft.clear();
    let (mut sampler, prompt) = evaluate_prompt(ctx, req, n_ctx)?;
    let mut out = Emitter::new(model, req.n_predict, req.ignore_eos, &req.stop, on_text);
    let mut spec = SpeculationStats::default();
    // Every token so far; the model's cache holds all but the last, the
    // draft's the first `draft_past`.
    let mut history: Vec<Token> = req.prompt.clone();
    let mut draft_past = 0usize;
    let mut sampled = sampler.sample(ctx, -1);
    let ttft = prompt.started.elapsed();
    let t_first = Instant::now();
    let max_batch = ctx.n_batch().min(draft.n_batch()) as usize;
    let stop = 'generation: loop {
        if let Some(stop) = out.push(sampled)? {
            break stop;
        }
        history.push(sampled);
        // `sampled` goes at `pos`, the draft after it.
        let pos = history.len() - 1;
        if pos + 1 >= n_ctx {
            break StopReason::ContextFull;
        }
        let room = (n_ctx - 1 - pos)
            .min(req.n_predict.saturating_sub(out.len()))
            .min(max_batch - 1)
            .min(params.n_max as usize);
        let mut drafted: Vec<Token> = Vec::new();
        if room > 0 {
            let t = Instant::now();
            draft.decode_tokens(&history[draft_past..], draft_past as i32, true)?;
            let caught_up = t.elapsed();
            if draft_past == 0 {
                spec.draft_prompt_ms = caught_up.as_secs_f64() * 1e3;
            } else {
                spec.draft_ms += caught_up.as_secs_f64() * 1e3;
            }
            draft_past = history.len();
            let t = Instant::now();
            loop {
                let (token, sure) = greedy(draft.logits(-1)?, params.p_min);
                if !sure {
                    break;
                }
                drafted.push(token);
                if drafted.len() == room {
                    break;
                }
                draft.decode_tokens(&[token], draft_past as i32, true)?;
                draft_past += 1;
            }
            if drafted.len() < params.n_min as usize {
                drafted.clear();
            }
            spec.draft_ms += t.elapsed().as_secs_f64() * 1e3;
        }

        let t = Instant::now();
        let items: Vec<BatchItem> = std::iter::once(sampled)
            .chain(drafted.iter().copied())
            .enumerate()
            .map(|(i, token)| BatchItem {
                token,
                pos: (pos + i) as i32,
                seq: 0,
                logits: true,
            })
            .collect();
        ctx.decode_batch(&items)?;
        spec.steps += 1;
        spec.drafted += drafted.len();
        let mut accepted = 0;
        for i in 0..items.len() {
            let token = sampler.sample(ctx, i as i32);
            if drafted.get(i) != Some(&token) {
                sampled = token;
                break;
            }
            accepted += 1;
            spec.accepted += 1;
            if let Some(stop) = out.push(token)? {
                spec.verify_ms += t.elapsed().as_secs_f64() * 1e3;
                break 'generation stop;
            }
            history.push(token);
        }
        // Forget the rejected draft tokens in both caches.
        draft_past = draft_past.min(history.len());
        let kept = ctx.seq0().seq_rm((pos + 1 + accepted) as i32, -1) && draft.seq0().seq_rm(draft_past as i32, -1);
        if !kept {
            return Err(EngineError::SeqState(
                "the cache cannot drop the rejected draft tokens (a recurrent state keeps no earlier position): decode without a draft model".into(),
            ));
        }
        spec.verify_ms += t.elapsed().as_secs_f64() * 1e3;
    };
    let decode: Duration = t_first.elapsed();
    let (text, tokens) = out.finish(stop);
    let stats = stats(&prompt, tokens.len(), ttft, decode, stop);
    Ok((GenerateOutput { text, tokens, stats }, spec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_largest_logit_and_checks_its_probability() {
        // Probabilities 0.25, 0.5, 0.25.
        let logits = [0.0, 2.0f32.ln(), 0.0];
        assert_eq!(greedy(&logits, 0.0), (1, true));
        assert_eq!(greedy(&logits, 0.49), (1, true));
        assert_eq!(greedy(&logits, 0.51), (1, false));
    }
}
