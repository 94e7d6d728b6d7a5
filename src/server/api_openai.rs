//! The OpenAI-compatible API: `/v1/models`, `/v1/completions`,
//! `/v1/chat/completions`, `/v1/embeddings`.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use crate::engine::{media_marker, Token};

use super::chat_template::content_text;
use super::completion::{
    chat_logprobs, collect, completion_logprobs, event_stream, sse_frame, sse_response, submit, tokenize_prompt,
};
use super::embedding::normalize;
use super::error::ApiError;
use super::params::{bool_field, gen_params, str_field, wants_stream, Api};
use super::routes::JsonBody;
use super::state::{AppState, Ready};
use super::task::{Event, Final};
use super::vision::image_bytes;

type S = State<Arc<AppState>>;

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn new_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{prefix}-{:08x}{:06x}", nanos, N.fetch_add(1, Ordering::Relaxed))
}

fn usage(n_prompt: usize, n_pred: usize) -> Value {
    json!({"prompt_tokens": n_prompt, "completion_tokens": n_pred, "total_tokens": n_prompt + n_pred})
}

/// The end of an OpenAI stream: the usage chunk (an empty chunk of the
/// endpoint's shape, when `stream_options.include_usage` asked for it), then `[DONE]`.
fn push_stream_end(out: &mut String, usage_chunk: Option<Value>, fin: &Final) {
    if let Some(mut u) = usage_chunk {
        u["usage"] = usage(fin.n_prompt, fin.n_predicted);
        out.push_str(&sse_frame(&u));
    }
    out.push_str("data: [DONE]\n\n");
}

/// `GET /v1/models` (and `/models`).
pub async fn models(State(st): S) -> Result<Json<Value>, ApiError> {
    let ready = st.ready()?;
    let m = &ready.model;
    let meta = json!({
        "n_vocab": m.n_vocab(), "n_ctx_train": m.n_ctx_train(), "n_embd": m.n_embd(),
        "n_params": m.n_params(), "size": m.size_bytes(),
    });
    Ok(Json(json!({
        "object": "list",
        "data": [{"id": ready.model_id, "object": "model", "created": ready.created, "owned_by": "llamacpp", "meta": meta}],
        "models": [{"name": ready.model_id, "model": ready.model_id, "modified_at": "", "size": "", "digest": "",
            "type": "model", "description": "", "tags": [""], "capabilities": ["completion"], "parameters": "",
            "details": {"parent_model": "", "format": "gguf", "family": "", "families": [""], "parameter_size": "", "quantization_level": ""}}],
    })))
}

/// Render a chat request's `messages` with the model's template.
pub fn chat_prompt(st: &AppState, ready: &Ready, body: &Map<String, Value>) -> Result<String, ApiError> {
    chat_prompt_media(st, ready, body).map(|(p, _)| p)
}

/// Render a chat request's `messages`; each image part becomes a media
/// marker in the text, and its bytes are returned in order.
pub fn chat_prompt_media(
    st: &AppState,
    ready: &Ready,
    body: &Map<String, Value>,
) -> Result<(String, Vec<Vec<u8>>), ApiError> {
    let mut images = Vec::new();
    let msgs = match body.get("messages") {
        Some(Value::Array(m)) => m,
        Some(_) => return Err(ApiError::bad_request("\"messages\" must be an array")),
        None => return Err(ApiError::bad_request("\"messages\" is required")),
    };
    let template = ready.template.as_ref().map_err(|e| ApiError::internal(e.clone()))?;
    let mut out = Vec::with_capacity(msgs.len());
    for m in msgs {
        let Value::Object(o) = m else {
            return Err(ApiError::bad_request("each message must be an object"));
        };
        match o.get("role") {
            Some(Value::String(_)) => {}
            _ => return Err(ApiError::bad_request("each message needs a string \"role\"")),
        }
        let mut o = o.clone();
        match o.get("content") {
            None | Some(Value::Null) | Some(Value::String(_)) => {}
            Some(Value::Array(parts)) => {
                let mut parts = parts.clone();
                let mut has_media = false;
                for p in parts.iter_mut() {
                    let ty = p.get("type").and_then(Value::as_str).unwrap_or("text");
                    match ty {
                        "text" => {}
                        "image_url" if ready.vision.is_some() => {
                            let url = match p.get("image_url") {
                                Some(Value::String(u)) => u.as_str(),
                                Some(o) => o.get("url").and_then(Value::as_str).unwrap_or_default(),
                                None => "",
                            };
                            if url.is_empty() {
                                return Err(ApiError::bad_request("image_url part without a \"url\""));
                            }
                            images.push(image_bytes(
                                url,
                                ready.vision.as_ref().and_then(|v| v.media_dir.as_deref()),
                            )?);
                            *p = json!({"type": "text", "text": media_marker()});
                            has_media = true;
                        }
                        "image_url" | "input_image" | "input_audio" | "image" | "audio" => {
                            let msg = if ready.vision.is_some() {
                                "only image_url content parts are supported for media input"
                            } else {
                                "image input is not supported: this server was started without --mmproj"
                            };
                            return Err(ApiError::bad_request(msg));
                        }
                        other => {
                            return Err(ApiError::bad_request(format!(
                                "unsupported content part type {other:?}"
                            )))
                        }
                    }
                }
                if !template.is_jinja() || has_media {
                    let text = content_text(&Value::Array(parts));
                    o.insert("content".into(), Value::String(text));
                } else {
                    o.insert("content".into(), Value::Array(parts));
                }
            }
            Some(_) => {
                return Err(ApiError::bad_request(
                    "message \"content\" must be a string or an array",
                ))
            }
        }
        out.push(Value::Object(o));
    }
    if !template.is_jinja() {
        for m in &mut out {
            if let Some(c) = m.get("content").cloned() {
                m["content"] = Value::String(content_text(&c));
            }
        }
    }
    let mut extra = st.config.chat_template_kwargs.clone();
    if let Some(Value::Object(kw)) = body.get("chat_template_kwargs") {
        extra.extend(kw.clone());
    }
    for key in ["tools", "tool_choice"] {
        if let Some(v) = body.get(key).filter(|v| !v.is_null()) {
            extra.insert(key.into(), v.clone());
        }
    }
    let add_gen = bool_field(body, "add_generation_prompt")?.unwrap_or(true);
    let prompt = template
        .render(&out, add_gen, &extra)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok((prompt, images))
}

fn chat_tokens(ready: &Ready, prompt: &str) -> Result<Vec<Token>, ApiError> {
    let m = &ready.model;
    let bos_text = m
        .token_bos()
        .and_then(|t| m.token_to_bytes(t, true).ok())
        .unwrap_or_default();
    let add_bos = m.add_bos() && (bos_text.is_empty() || !prompt.as_bytes().starts_with(&bos_text));
    m.tokenize(prompt, add_bos, true)
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

fn include_usage(body: &Map<String, Value>) -> bool {
    body.get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(State(st): S, JsonBody(body): JsonBody) -> Result<Response, ApiError> {
    let ready = st.ready()?;
    let params = gen_params(&body, &st.config, Api::OaiChat)?;
    let stream = wants_stream(&body)?;
    let want_logprobs = params.want_logprobs;
    let (prompt, images) = chat_prompt_media(&st, ready, &body)?;
    let (rx, n_prompt) = match (&ready.vision, images.is_empty()) {
        (Some(v), false) => {
            // Served one at a time by the vision worker; the prompt size
            // (text and image positions) is only known there.
            (v.submit(prompt, images, params)?, 0)
        }
        _ => {
            let toks = chat_tokens(ready, &prompt)?;
            let n = toks.len();
            (submit(ready, toks, params)?, n)
        }
    };
    let (id, created, model) = (new_id("chatcmpl"), now(), ready.model_id.clone());
    if stream {
        let with_usage = include_usage(&body);
        let chunk = move |choices: Value| {
            json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "system_fingerprint": "pipeshard", "choices": choices})
        };
        let mut first = true;
        let s = event_stream(rx, move |ev| {
            let mut out = String::new();
            if first {
                first = false;
                out.push_str(&sse_frame(&chunk(
                    json!([{"index": 0, "delta": {"role": "assistant", "content": null},
                    "logprobs": null, "finish_reason": null}]),
                )));
            }
            match ev {
                Event::Chunk { text, probs, .. } => {
                    let lp = if want_logprobs {
                        chat_logprobs(&probs)
                    } else {
                        Value::Null
                    };
                    out.push_str(&sse_frame(&chunk(json!([{"index": 0, "delta": {"content": text},
                        "logprobs": lp, "finish_reason": null}]))));
                    (out, false)
                }
                Event::Done(fin) => {
                    let mut last = chunk(json!([{"index": 0, "delta": {}, "logprobs": null,
                        "finish_reason": fin.stop_type.finish_reason()}]));
                    last["timings"] = fin.timings();
                    out.push_str(&sse_frame(&last));
                    push_stream_end(&mut out, with_usage.then(|| chunk(json!([]))), &fin);
                    (out, true)
                }
                Event::Error(e) => {
                    out.push_str(&sse_frame(&e.to_json()));
                    (out, true)
                }
            }
        });
        return Ok(sse_response(s));
    }
    let c = collect(rx).await?;
    let lp = if want_logprobs {
        chat_logprobs(&c.probs)
    } else {
        Value::Null
    };
    Ok(Json(json!({
        "id": id, "object": "chat.completion", "created": created, "model": model,
        "system_fingerprint": "pipeshard",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": c.text},
            "logprobs": lp, "finish_reason": c.fin.stop_type.finish_reason()}],
        "usage": usage(n_prompt.max(c.fin.n_prompt), c.fin.n_predicted),
        "timings": c.fin.timings(),
    }))
    .into_response())
}

/// `POST /v1/completions`.
pub async fn completions(State(st): S, JsonBody(body): JsonBody) -> Result<Response, ApiError> {
    let ready = st.ready()?;
    let params = gen_params(&body, &st.config, Api::OaiCompletion)?;
    let stream = wants_stream(&body)?;
    let prompt = body
        .get("prompt")
        .cloned()
        .ok_or_else(|| ApiError::bad_request("\"prompt\" is required"))?;
    let prompt = match prompt {
        Value::Array(a) if a.len() == 1 && (a[0].is_string() || a[0].is_array()) => a[0].clone(),
        Value::Array(a) if a.iter().any(|p| p.is_string()) && a.len() > 1 => {
            return Err(ApiError::bad_request(
                "only one prompt per request is supported on /v1/completions",
            ))
        }
        other => other,
    };
    let toks = tokenize_prompt(&ready.model, &prompt, true)?;
    let n_prompt = toks.len();
    let want_logprobs = params.want_logprobs;
    let echo = bool_field(&body, "echo")?.unwrap_or(false);
    let echo_text = if echo {
        prompt.as_str().unwrap_or_default().to_string()
    } else {
        String::new()
    };
    let rx = submit(ready, toks, params)?;
    let (id, created, model) = (new_id("cmpl"), now(), ready.model_id.clone());
    if stream {
        let with_usage = include_usage(&body);
        let chunk = move |choices: Value| {
            json!({"id": id, "object": "text_completion", "created": created, "model": model,
                "system_fingerprint": "pipeshard", "choices": choices})
        };
        let mut offset = echo_text.len();
        let mut pending_echo = echo_text;
        let s = event_stream(rx, move |ev| match ev {
            Event::Chunk { text, probs, .. } => {
                let lp = if want_logprobs {
                    completion_logprobs(&probs, offset)
                } else {
                    Value::Null
                };
                offset += text.len();
                let text = std::mem::take(&mut pending_echo) + &text;
                (
                    sse_frame(&chunk(
                        json!([{"index": 0, "text": text, "logprobs": lp, "finish_reason": null}]),
                    )),
                    false,
                )
            }
            Event::Done(fin) => {
                let mut out = sse_frame(&chunk(json!([{"index": 0, "text": std::mem::take(&mut pending_echo),
                    "logprobs": null, "finish_reason": fin.stop_type.finish_reason()}])));
                push_stream_end(&mut out, with_usage.then(|| chunk(json!([]))), &fin);
                (out, true)
            }
            Event::Error(e) => (sse_frame(&e.to_json()), true),
        });
        return Ok(sse_response(s));
    }
    let c = collect(rx).await?;
    let lp = if want_logprobs {
        completion_logprobs(&c.probs, echo_text.len())
    } else {
        Value::Null
    };
    Ok(Json(json!({
        "id": id, "object": "text_completion", "created": created, "model": model,
        "system_fingerprint": "pipeshard",
        "choices": [{"index": 0, "text": echo_text + &c.text, "logprobs": lp,
            "finish_reason": c.fin.stop_type.finish_reason()}],
        "usage": usage(n_prompt, c.fin.n_predicted),
        "timings": c.fin.timings(),
    }))
    .into_response())
}

/// Inputs of an embedding request: a string, an array of strings, a token
/// array, or an array of token arrays.
pub fn embedding_inputs(ready: &Ready, input: &Value, n_ctx: u32) -> Result<Vec<Vec<Token>>, ApiError> {
    let model = &ready.model;
    let one = |v: &Value| -> Result<Vec<Token>, ApiError> {
        let t = tokenize_prompt(model, v, true)?;
        if t.is_empty() {
            return Err(ApiError::bad_request("input is empty"));
        }
        if t.len() > n_ctx as usize {
            return Err(ApiError::context_exceeded(t.len(), n_ctx));
        }
        Ok(t)
    };
    match input {
        Value::String(_) => Ok(vec![one(input)?]),
        Value::Array(a) if a.iter().all(Value::is_number) && !a.is_empty() => Ok(vec![one(input)?]),
        Value::Array(a) if !a.is_empty() => a.iter().map(one).collect(),
        _ => Err(ApiError::bad_request(
            "\"input\" must be a string, an array of strings, or token arrays",
        )),
    }
}

fn base64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n =
            (u32::from(c[0]) << 16) | (u32::from(*c.get(1).unwrap_or(&0)) << 8) | u32::from(*c.get(2).unwrap_or(&0));
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= c.len() {
                out.push(T[((n >> shift) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `POST /v1/embeddings` (with `--embeddings`); normalised as upstream does.
pub async fn embeddings(State(st): S, JsonBody(body): JsonBody) -> Result<Json<Value>, ApiError> {
    let ready = st.ready()?;
    let embedder = ready.embedder.as_ref().ok_or_else(|| {
        ApiError::not_supported("This server does not support embeddings. Start it with `--embeddings`")
    })?;
    let input = body
        .get("input")
        .or_else(|| body.get("content"))
        .cloned()
        .unwrap_or(Value::Null);
    let inputs = embedding_inputs(ready, &input, embedder.n_ctx)?;
    let n_tokens: usize = inputs.iter().map(Vec::len).sum();
    let b64 = match str_field(&body, "encoding_format")? {
        None | Some("float") => false,
        Some("base64") => true,
        Some(f) => return Err(ApiError::bad_request(format!("unsupported encoding_format {f:?}"))),
    };
    let vecs = embedder.embed(inputs).await.map_err(ApiError::internal)?;
    let data: Vec<Value> = vecs
        .into_iter()
        .enumerate()
        .map(|(i, mut v)| {
            normalize(&mut v, st.config.embd_normalize);
            let emb = if b64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64(&bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": emb})
        })
        .collect();
    Ok(Json(json!({
        "object": "list", "data": data, "model": ready.model_id,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    })))
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_rfc4648() {
        assert_eq!(super::base64(b""), "");
        assert_eq!(super::base64(b"f"), "Zg==");
        assert_eq!(super::base64(b"fo"), "Zm8=");
        assert_eq!(super::base64(b"foobar"), "Zm9vYmFy");
    }
}
