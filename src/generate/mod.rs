//! Text generation on top of the engine: prompt processing, sampling,
//! streaming and timings.

mod speculative;

use std::time::Instant;

pub use speculative::{generate_speculative, DraftParams, SpeculationStats};

use crate::engine::{Context, EngineError, Model, Sampler, SamplingParams, Token};

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Tokens of the prompt (already templated and tokenized).
    pub prompt: Vec<Token>,
    /// Tokens to generate at most; generation also ends at an end-of-generation token.
    pub n_predict: usize,
    pub sampling: SamplingParams,
    /// Stop when the generated text contains one of these strings.
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens (llama.cpp's `--ignore-eos`).
    pub ignore_eos: bool,
}

impl GenerateRequest {
    /// `n_predict` tokens after `prompt`, drawn with `sampling`, with no stop
    /// strings and ending at an end-of-generation token.
    pub fn new(prompt: Vec<Token>, n_predict: usize, sampling: SamplingParams) -> Self {
        GenerateRequest {
            prompt,
            n_predict,
            sampling,
            stop: Vec::new(),
            ignore_eos: false,
        }
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// An end-of-generation token.
    Eos,
    /// `n_predict` tokens were produced.
    Length,
    /// A stop string was produced.
    StopString,
    /// The context is full.
    ContextFull,
    /// The consumer asked to stop.
    Cancelled,
}

/// Timings and counts, as llama.cpp reports them.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GenerateStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Prompt processing until the first generated token is sampled.
    pub ttft_ms: f64,
    pub prompt_tokens_per_s: f64,
    /// Decode time for the tokens after the first.
    pub decode_ms: f64,
    pub decode_tokens_per_s: f64,
    pub stop: StopReason,
}

/// The full result of a generation.
#[derive(Debug, Clone)]
pub struct GenerateOutput {
    pub text: String,
    pub tokens: Vec<Token>,
    pub stats: GenerateStats,
}

/// Assembles token bytes into valid UTF-8 pieces for streaming.
#[derive(Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Add bytes; returns the longest valid UTF-8 text now complete.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        match std::str::from_utf8(&self.pending) {
            Ok(s) => {
                let s = s.to_string();
                self.pending.clear();
                s
            }
            Err(e) => {
                let valid = e.valid_up_to();
                // An invalid sequence (not just an incomplete one) is emitted lossily.
                let cut = if e.error_len().is_some() {
                    self.pending.len()
                } else {
                    valid
                };
                let s = String::from_utf8_lossy(&self.pending[..cut]).into_owned();
                self.pending.drain(..cut);
                s
            }
        }
    }

    /// Whatever is left, lossily.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

/// A prompt already evaluated into sequence 0 of a context, with the
/// logits of its last position kept: where [`generate_from`] continues.
#[derive(Debug, Clone, Copy)]
pub struct EvaluatedPrompt {
    /// The position after the prompt.
    pub n_past: i32,
    /// Prompt tokens (or positions), for the statistics.
    pub n_tokens: usize,
    /// When prompt processing started; TTFT is measured from here.
    pub started: Instant,
}

/// Generate from a fresh sequence 0 of `ctx`. `on_text` gets each new piece
/// of text; returning `false` stops generation.
pub fn generate(
    ctx: &mut Context<'_>,
    req: &GenerateRequest,
    on_text: impl FnMut(&str) -> bool,
) -> Result<GenerateOutput, EngineError> {
    generate_between(ctx, req, on_text, &mut |_| {})
}

/// [`generate`], calling `between` with the context before each decode
/// after the prompt's: where no graph runs, so that a live re-plan can
/// move weights there.
pub fn generate_between(
    ctx: &mut Context<'_>,
    req: &GenerateRequest,
    on_text: impl FnMut(&str) -> bool,
    between: &mut dyn FnMut(&mut Context<'_>),
) -> Result<GenerateOutput, EngineError> {
    let n_ctx = ctx.n_ctx() as usize;
    let (sampler, prompt) = evaluate_prompt(ctx, req, n_ctx)?;
    let out = Emitter::new(ctx.model(), req.n_predict, req.ignore_eos, &req.stop, on_text);
    continue_generation(ctx, sampler, prompt, out, between)
}

/// Check that `req`'s prompt is not empty and leaves room in `n_ctx`
/// tokens, then evaluate it into a cleared sequence 0 of `ctx`: the sampler
/// (which has seen the prompt) and where generation continues.
fn evaluate_prompt(
    ctx: &mut Context<'_>,
    req: &GenerateRequest,
    n_ctx: usize,
) -> Result<(Sampler, EvaluatedPrompt), EngineError> {
    if req.prompt.is_empty() {
        return Err(EngineError::InvalidArgument("the prompt is empty".into()));
    }
    if req.prompt.len() >= n_ctx {
        return Err(EngineError::ContextOverflow {
            n_tokens: req.prompt.len(),
            n_ctx: n_ctx as u32,
        });
    }
    let mut sampler = Sampler::new(ctx.model(), &req.sampling)?;
    ctx.clear();
    let started = Instant::now();
    ctx.decode_tokens(&req.prompt, 0, true)?;
    for &t in &req.prompt {
        sampler.accept(t);
    }
    let prompt = EvaluatedPrompt {
        n_past: req.prompt.len() as i32,
        n_tokens: req.prompt.len(),
        started,
    };
    Ok((sampler, prompt))
}

/// Generate after a prompt that something else evaluated into sequence 0
/// of `ctx` (e.g. a multimodal prompt); otherwise as [`generate`].
pub fn generate_from(
    ctx: &mut Context<'_>,
    prompt: EvaluatedPrompt,
    n_predict: usize,
    sampling: &SamplingParams,
    stop: &[String],
    on_text: impl FnMut(&str) -> bool,
) -> Result<GenerateOutput, EngineError> {
    let sampler = Sampler::new(ctx.model(), sampling)?;
    let out = Emitter::new(ctx.model(), n_predict, false, stop, on_text);
    continue_generation(ctx, sampler, prompt, out, &mut |_| {})
}

/// Collects generated tokens into text: streams each new piece to the
/// consumer and decides when generation ends (end of generation, a stop
/// string, `n_predict`, cancellation).
pub(crate) struct Emitter<'a, F: FnMut(&str) -> bool> {
    model: &'a Model,
    n_predict: usize,
    ignore_eos: bool,
    stops: &'a [String],
    on_text: F,
    text: String,
    tokens: Vec<Token>,
    utf8: Utf8Stream,
}

impl<'a, F: FnMut(&str) -> bool> Emitter<'a, F> {
    pub(crate) fn new(model: &'a Model, n_predict: usize, ignore_eos: bool, stops: &'a [String], on_text: F) -> Self {
        Emitter {
            model,
            n_predict,
            ignore_eos,
            stops,
            on_text,
            text: String::new(),
            tokens: Vec::new(),
            utf8: Utf8Stream::default(),
        }
    }

    /// Take a sampled token; returns why generation ends with it, if it does.
    pub(crate) fn push(&mut self, token: Token) -> Result<Option<StopReason>, EngineError> {
        if !self.ignore_eos && self.model.is_eog(token) {
            return Ok(Some(StopReason::Eos));
        }
        self.tokens.push(token);
        let piece = self.utf8.push(&self.model.token_to_bytes(token, false)?);
        if !piece.is_empty() {
            self.text.push_str(&piece);
            if let Some(cut) = find_stop(&self.text, self.stops) {
                self.text.truncate(cut);
                return Ok(Some(StopReason::StopString));
            }
            if !(self.on_text)(&piece) {
                return Ok(Some(StopReason::Cancelled));
            }
        }
        if self.tokens.len() >= self.n_predict {
            return Ok(Some(StopReason::Length));
        }
        Ok(None)
    }

    /// Tokens taken so far.
    pub(crate) fn len(&self) -> usize {
        self.tokens.len()
    }

    /// The text and tokens, with what the UTF-8 stream still held.
    pub(crate) fn finish(mut self, stop: StopReason) -> (String, Vec<Token>) {
        let rest = self.utf8.finish();
        if !rest.is_empty() && stop != StopReason::StopString {
            self.text.push_str(&rest);
            (self.on_text)(&rest);
        }
        (self.text, self.tokens)
    }
}

/// The statistics of a generation that sampled its first token `ttft`
/// after `prompt.started` and finished the others `decode` after that.
pub(crate) fn stats(
    prompt: &EvaluatedPrompt,
    n_generated: usize,
    ttft: std::time::Duration,
    decode: std::time::Duration,
    stop: StopReason,
) -> GenerateStats {
    let decoded = n_generated.saturating_sub(1);
    GenerateStats {
        prompt_tokens: prompt.n_tokens,
        generated_tokens: n_generated,
        ttft_ms: ttft.as_secs_f64() * 1e3,
        prompt_tokens_per_s: prompt.n_tokens as f64 / ttft.as_secs_f64().max(1e-9),
        decode_ms: decode.as_secs_f64() * 1e3,
        decode_tokens_per_s: if decoded > 0 {
            decoded as f64 / decode.as_secs_f64().max(1e-9)
        } else {
            0.0
        },
        stop,
    }
}

fn continue_generation<F: FnMut(&str) -> bool>(
    ctx: &mut Context<'_>,
    mut sampler: Sampler,
    prompt: EvaluatedPrompt,
    mut out: Emitter<'_, F>,
    between: &mut dyn FnMut(&mut Context<'_>),
) -> Result<GenerateOutput, EngineError> {
    let n_ctx = ctx.n_ctx() as usize;
    let mut pos = prompt.n_past;
    let mut sampled = sampler.sample(ctx, -1);
    let ttft = prompt.started.elapsed();
    let t_first = Instant::now();
    let stop = loop {
        if let Some(stop) = out.push(sampled)? {
            break stop;
        }
        if pos as usize + 1 >= n_ctx {
            break StopReason::ContextFull;
        }
        between(ctx);
        ctx.decode_tokens(&[sampled], pos, true)?;
        pos += 1;
        sampled = sampler.sample(ctx, -1);
    };
    let decode = t_first.elapsed();
    let (text, tokens) = out.finish(stop);
    let stats = stats(&prompt, tokens.len(), ttft, decode, stop);
    Ok(GenerateOutput { text, tokens, stats })
}

/// Byte offset where the first stop string starts, if any.
pub fn find_stop(text: &str, stops: &[String]) -> Option<usize> {
    stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()))
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_stream_holds_back_partial_characters() {
        let mut s = Utf8Stream::default();
        let bytes = "é€".as_bytes();
        assert_eq!(s.push(&bytes[..1]), "");
        assert_eq!(s.push(&bytes[1..3]), "é");
        assert_eq!(s.push(&bytes[3..]), "€");
        assert_eq!(s.finish(), "");
    }

    #[test]
    fn utf8_stream_flushes_invalid_bytes() {
        let mut s = Utf8Stream::default();
        assert_eq!(s.push(&[0xff, b'a']), "\u{fffd}a");
    }

    #[test]
    fn stop_strings_cut_at_the_earliest() {
        let stops = vec!["\n\n".to_string(), "END".to_string()];
        assert_eq!(find_stop("abc END x\n\n", &stops), Some(4));
        assert_eq!(find_stop("abc", &stops), None);
        assert_eq!(find_stop("abc", &[String::new()]), None);
    }
}
