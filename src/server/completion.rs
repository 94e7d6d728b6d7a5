//! Running a generation for a request: tokenized prompt in, a stream of
//! [`Event`]s or the collected result out, plus the SSE response helper.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::engine::{Model, Sampler, Token};

use super::error::ApiError;
use super::scheduler::Submission;
use super::state::Ready;
use super::task::{Event, Final, GenJob, GenParams, TokenLogprob, TokenProbs};

/// Tokenize a prompt given as a string, a token array, or a mix.
pub fn tokenize_prompt(model: &Model, prompt: &Value, add_special: bool) -> Result<Vec<Token>, ApiError> {
    let tok = |s: &str, special: bool| {
        model
            .tokenize(s, special, true)
            .map_err(|e| ApiError::bad_request(format!("cannot tokenize the prompt: {e}")))
    };
    match prompt {
        Value::String(s) => tok(s, add_special),
        Value::Array(parts) => {
            let mut out = Vec::new();
            for (i, p) in parts.iter().enumerate() {
                match p {
                    Value::Number(n) => {
                        let t = n
                            .as_i64()
                            .filter(|&t| t >= 0 && t < model.n_vocab() as i64)
                            .ok_or_else(|| {
                                ApiError::bad_request(format!("prompt token {n} is not in the vocabulary"))
                            })?;
                        out.push(t as Token);
                    }
                    Value::String(s) => out.extend(tok(s, add_special && i == 0)?),
                    _ => return Err(ApiError::bad_request("prompt entries must be strings or token ids")),
                }
            }
            Ok(out)
        }
        _ => Err(ApiError::bad_request("\"prompt\" must be a string or an array")),
    }
}

/// Check a prompt against the slot context and queue it; events come back
/// on the returned receiver (dropping it cancels the job).
pub fn submit(ready: &Ready, prompt: Vec<Token>, params: GenParams) -> Result<UnboundedReceiver<Event>, ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::bad_request("the prompt is empty"));
    }
    let n_ctx = ready.scheduler.n_ctx_slot;
    if prompt.len() >= n_ctx as usize {
        return Err(ApiError::context_exceeded(prompt.len(), n_ctx));
    }
    let sampler = Sampler::new(&ready.model, &params.sampling).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let (tx, rx) = unbounded_channel();
    ready
        .scheduler
        .submit(Submission {
            job: GenJob {
                prompt,
                params,
                events: tx,
            },
            sampler,
        })
        .map_err(ApiError::internal)?;
    Ok(rx)
}

/// A finished generation.
#[derive(Debug)]
pub struct Collected {
    pub text: String,
    pub tokens: Vec<Token>,
    pub probs: Vec<TokenProbs>,
    pub fin: Final,
}

/// Wait for a job to finish.
pub async fn collect(mut rx: UnboundedReceiver<Event>) -> Result<Collected, ApiError> {
    let (mut text, mut tokens, mut probs) = (String::new(), Vec::new(), Vec::new());
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Chunk {
                text: t,
                tokens: tk,
                probs: p,
            } => {
                text.push_str(&t);
                tokens.extend(tk);
                probs.extend(p);
            }
            Event::Done(fin) => {
                return Ok(Collected {
                    text,
                    tokens,
                    probs,
                    fin,
                })
            }
            Event::Error(e) => return Err(e),
        }
    }
    Err(ApiError::internal("the inference worker stopped"))
}

/// One `data: ...` SSE frame.
pub fn sse_frame(v: &Value) -> String {
    format!("data: {v}\n\n")
}

/// A `text/event-stream` response from a stream of frames.
pub fn sse_response<S>(stream: S) -> Response
where
    S: Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
{
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

/// Stream events through `f`, which turns each into SSE text (empty: skip)
/// and says whether the stream ends after it; `tail` is appended at the end
/// of a successful stream.
pub fn event_stream<F>(rx: UnboundedReceiver<Event>, mut f: F) -> impl Stream<Item = Result<Bytes, Infallible>> + Send
where
    F: FnMut(Event) -> (String, bool) + Send + 'static,
{
    use futures_util::StreamExt;
    futures_util::stream::unfold(rx, |mut rx| async move {
        let ev = rx.recv().await;
        Some((ev, rx))
    })
    .scan(false, move |ended, ev| {
        let out = if *ended {
            None
        } else {
            let (text, end) = match ev {
                Some(ev) => f(ev),
                None => (
                    sse_frame(&ApiError::internal("the inference worker stopped").to_json()),
                    true,
                ),
            };
            *ended = end;
            Some(text)
        };
        std::future::ready(out)
    })
    .filter(|t| std::future::ready(!t.is_empty()))
    .map(|t| Ok(Bytes::from(t)))
}

/// Upstream's per-token probability object (`completion_probabilities`).
pub fn native_probs(p: &TokenProbs) -> Value {
    let one = |t: &TokenLogprob| json!({"id": t.id, "token": t.token, "bytes": t.bytes, "logprob": t.logprob});
    let mut v = one(&p.chosen);
    v["top_logprobs"] = Value::Array(p.top.iter().map(one).collect());
    v
}

/// OpenAI chat `logprobs.content` entries.
pub fn chat_logprobs(ps: &[TokenProbs]) -> Value {
    let one = |t: &TokenLogprob| json!({"token": t.token, "logprob": t.logprob, "bytes": t.bytes});
    json!({"content": ps.iter().map(|p| {
        let mut v = one(&p.chosen);
        v["top_logprobs"] = Value::Array(p.top.iter().map(one).collect());
        v
    }).collect::<Vec<_>>()})
}

/// OpenAI legacy completion `logprobs` object.
pub fn completion_logprobs(ps: &[TokenProbs], text_start: usize) -> Value {
    let mut offset = text_start;
    let mut offsets = Vec::new();
    for p in ps {
        offsets.push(offset);
        offset += p.chosen.token.len();
    }
    json!({
        "tokens": ps.iter().map(|p| p.chosen.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": ps.iter().map(|p| p.chosen.logprob).collect::<Vec<_>>(),
        "top_logprobs": ps.iter().map(|p| {
            p.top.iter().map(|t| (t.token.clone(), json!(t.logprob))).collect::<serde_json::Map<_, _>>()
        }).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}
