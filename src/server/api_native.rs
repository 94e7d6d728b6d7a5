//! llama-server's own endpoints: `/health`, `/completion`, `/tokenize`,
//! `/detokenize`, `/apply-template`, `/props`, `/slots`, `/metrics`,
//! `/embedding`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::api_openai::{chat_prompt, embedding_inputs};
use super::completion::{collect, event_stream, native_probs, sse_frame, sse_response, submit, tokenize_prompt};
use super::embedding::normalize;
use super::error::ApiError;
use super::params::{bool_field, gen_params, i64_field, str_field, wants_stream, Api};
use super::routes::JsonBody;
use super::state::{AppState, Ready};
use super::task::{Event, Final, GenParams};

type S = State<Arc<AppState>>;

/// `GET /health`: 503 while loading, then `{"status":"ok"}`.
pub async fn health(State(st): S) -> Response {
    match st.ready() {
        Ok(_) => Json(json!({"status": "ok"})).into_response(),
        Err(e) => e.into_response(),
    }
}

fn generation_settings(ready: &Ready, p: &GenParams) -> Value {
    let s = &p.sampling;
    json!({
        "n_ctx": ready.scheduler.n_ctx_slot,
        "n_predict": p.n_predict,
        "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p,
        "repeat_penalty": s.repeat_penalty, "repeat_last_n": s.repeat_last_n,
        "presence_penalty": s.presence_penalty, "frequency_penalty": s.frequency_penalty,
        "seed": s.seed, "stop": p.stop, "n_probs": p.n_probs, "ignore_eos": p.ignore_eos,
        "cache_prompt": p.cache_prompt, "grammar": s.grammar.clone().unwrap_or_default(),
        "stream": false,
    })
}

fn final_fields(v: &mut Value, fin: &Final, model: &str) {
    v["id_slot"] = json!(fin.id_slot);
    v["stop"] = json!(true);
    v["model"] = json!(model);
    v["tokens_predicted"] = json!(fin.n_predicted);
    v["tokens_evaluated"] = json!(fin.n_prompt);
    v["tokens_cached"] = json!(fin.n_cached);
    v["truncated"] = json!(false);
    v["stop_type"] = json!(fin.stop_type.as_str());
    v["stopping_word"] = json!(fin.stopping_word);
    v["timings"] = fin.timings();
}

/// `POST /completion` (and `/completions`): upstream's native completion.
pub async fn completion(State(st): S, JsonBody(body): JsonBody) -> Result<Response, ApiError> {
    let ready = st.ready()?;
    let prompt_v = body
        .get("prompt")
        .cloned()
        .ok_or_else(|| ApiError::bad_request("\"prompt\" is required"))?;
    let params = gen_params(&body, &st.config, Api::Native)?;
    let stream = wants_stream(&body)?;
    let model = ready.model_id.clone();
    // Several prompts (an array of strings or of token arrays) give several results.
    let multi = matches!(&prompt_v, Value::Array(a) if a.len() > 1 && a.iter().all(|p| p.is_string() || p.is_array()));
    if multi {
        if stream {
            return Err(ApiError::bad_request(
                "streaming several prompts at once is not supported",
            ));
        }
        let Value::Array(prompts) = &prompt_v else {
            return Err(ApiError::bad_request("bad prompt"));
        };
        let mut rxs = Vec::new();
        for (i, p) in prompts.iter().enumerate() {
            let toks = tokenize_prompt(&ready.model, p, true)?;
            rxs.push((i, prompt_text(p), submit(ready, toks, params.clone())?));
        }
        let mut out = Vec::new();
        for (i, ptext, rx) in rxs {
            let c = collect(rx).await?;
            let mut v = json!({"index": i, "content": c.text, "tokens": [], "prompt": ptext,
                "generation_settings": generation_settings(ready, &params)});
            final_fields(&mut v, &c.fin, &model);
            out.push(v);
        }
        return Ok(Json(Value::Array(out)).into_response());
    }
    let single = match &prompt_v {
        Value::Array(a) if a.len() == 1 && (a[0].is_string() || a[0].is_array()) => a[0].clone(),
        other => other.clone(),
    };
    let toks = tokenize_prompt(&ready.model, &single, true)?;
    let n_probs = params.n_probs;
    let settings = generation_settings(ready, &params);
    let rx = submit(ready, toks, params)?;
    let ptext = prompt_text(&single);
    if stream {
        let mut n_pred = 0usize;
        let s = event_stream(rx, move |ev| match ev {
            Event::Chunk { text, tokens, probs } => {
                n_pred += tokens.len();
                let mut v = json!({"index": 0, "content": text, "tokens": tokens, "stop": false,
                    "id_slot": -1, "tokens_predicted": n_pred});
                if n_probs > 0 {
                    v["completion_probabilities"] = probs.iter().map(native_probs).collect();
                }
                (sse_frame(&v), false)
            }
            Event::Done(fin) => {
                let mut v = json!({"index": 0, "content": "", "tokens": [], "prompt": ptext,
                    "generation_settings": settings});
                final_fields(&mut v, &fin, &model);
                (sse_frame(&v), true)
            }
            Event::Error(e) => (sse_frame(&e.to_json()), true),
        });
        return Ok(sse_response(s));
    }
    let c = collect(rx).await?;
    let mut v = json!({"index": 0, "content": c.text, "tokens": [], "prompt": ptext,
        "generation_settings": settings});
    if n_probs > 0 {
        v["completion_probabilities"] = c.probs.iter().map(native_probs).collect();
    }
    final_fields(&mut v, &c.fin, &model);
    Ok(Json(v).into_response())
}

fn prompt_text(p: &Value) -> Value {
    match p {
        Value::String(s) => json!(s),
        other => other.clone(),
    }
}

/// `POST /tokenize`: `{content, add_special?, parse_special?, with_pieces?}`.
pub async fn tokenize(State(st): S, JsonBody(body): JsonBody) -> Result<Json<Value>, ApiError> {
    let ready = st.ready()?;
    let content = str_field(&body, "content")?.unwrap_or_default();
    let add_special = bool_field(&body, "add_special")?.unwrap_or(false);
    let parse_special = bool_field(&body, "parse_special")?.unwrap_or(true);
    let with_pieces = bool_field(&body, "with_pieces")?.unwrap_or(false);
    let toks = ready
        .model
        .tokenize(content, add_special, parse_special)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    if !with_pieces {
        return Ok(Json(json!({"tokens": toks})));
    }
    let pieces: Vec<Value> = toks
        .iter()
        .map(|&t| {
            let b = ready.model.token_to_bytes(t, true).unwrap_or_default();
            let piece = match String::from_utf8(b) {
                Ok(s) => json!(s),
                Err(e) => json!(e.into_bytes()),
            };
            json!({"id": t, "piece": piece})
        })
        .collect();
    Ok(Json(json!({"tokens": pieces})))
}

/// `POST /detokenize`: `{tokens}` → `{content}`.
pub async fn detokenize(State(st): S, JsonBody(body): JsonBody) -> Result<Json<Value>, ApiError> {
    let ready = st.ready()?;
    let toks: Vec<i32> = match body.get("tokens") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_i64().and_then(|t| i32::try_from(t).ok()))
            .collect::<Option<_>>()
            .ok_or_else(|| ApiError::bad_request("\"tokens\" must be an array of token ids"))?,
        Some(_) => return Err(ApiError::bad_request("\"tokens\" must be an array of token ids")),
    };
    let content = ready
        .model
        .detokenize(&toks, false, true)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok(Json(json!({"content": content})))
}

/// `POST /apply-template`: `{messages}` → `{prompt}`.
pub async fn apply_template(State(st): S, JsonBody(body): JsonBody) -> Result<Json<Value>, ApiError> {
    let ready = st.ready()?;
    let prompt = chat_prompt(&st, ready, &body)?;
    Ok(Json(json!({"prompt": prompt})))
}

/// `GET /props`.
pub async fn props(State(st): S) -> Result<Json<Value>, ApiError> {
    let ready = st.ready()?;
    let defaults = gen_params(&Default::default(), &st.config, Api::Native)?;
    let m = &ready.model;
    Ok(Json(json!({
        "default_generation_settings": {
            "id": 0, "id_task": -1, "n_ctx": ready.scheduler.n_ctx_slot, "speculative": false,
            "is_processing": false, "params": generation_settings(ready, &defaults),
        },
        "total_slots": ready.scheduler.n_parallel,
        "model_alias": ready.model_id,
        "model_path": m.path().display().to_string(),
        "chat_template": ready.template.as_ref().map(|t| t.source().to_string()).unwrap_or_default(),
        "bos_token": m.token_bos().and_then(|t| m.token_to_bytes(t, true).ok()).map(|b| String::from_utf8_lossy(&b).into_owned()),
        "eos_token": m.token_eos().and_then(|t| m.token_to_bytes(t, true).ok()).map(|b| String::from_utf8_lossy(&b).into_owned()),
        "modalities": {"vision": false, "audio": false},
        "is_sleeping": false,
        "build_info": format!("pipeshard {}", env!("CARGO_PKG_VERSION")),
        "pipeshard": {
            "vram_budget_bytes": st.config.vram_budget,
            "profile": st.config.profile,
            "plan": st.config.plan,
        },
    })))
}

/// `POST /props`: only with `--props`; settings are accepted and ignored.
pub async fn set_props(State(st): S, JsonBody(_body): JsonBody) -> Result<Json<Value>, ApiError> {
    if !st.config.endpoint_props {
        return Err(ApiError::not_supported(
            "This server does not support changing global properties. Start it with `--props`",
        ));
    }
    st.ready()?;
    Ok(Json(json!({"success": true})))
}

/// `GET /slots` (on unless `--no-slots`).
pub async fn slots(State(st): S) -> Result<Json<Value>, ApiError> {
    if !st.config.endpoint_slots {
        return Err(ApiError::not_supported("This server does not support slots endpoint."));
    }
    let ready = st.ready()?;
    let v = ready.scheduler.slots.lock().map(|g| g.clone()).unwrap_or_default();
    Ok(Json(serde_json::to_value(v).unwrap_or_default()))
}

/// `GET /metrics` (with `--metrics`): Prometheus text.
pub async fn metrics(State(st): S) -> Result<Response, ApiError> {
    if !st.config.endpoint_metrics {
        return Err(ApiError::not_supported(
            "This server does not support metrics endpoint.",
        ));
    }
    st.ready()?;
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(),
    )
        .into_response())
}

/// `POST /embedding` (with `--embeddings`): `{content}` → `[{index, embedding: [[...]]}]`.
pub async fn embedding(State(st): S, JsonBody(body): JsonBody) -> Result<Json<Value>, ApiError> {
    let ready = st.ready()?;
    let embedder = ready.embedder.as_ref().ok_or_else(|| {
        ApiError::not_supported("This server does not support embeddings. Start it with `--embeddings`")
    })?;
    let input = body
        .get("content")
        .or_else(|| body.get("input"))
        .cloned()
        .unwrap_or(Value::Null);
    let inputs = embedding_inputs(ready, &input, embedder.n_ctx)?;
    let norm = i64_field(&body, "embd_normalize")?.map_or(st.config.embd_normalize, |n| n.clamp(-1, 64) as i32);
    let vecs = embedder.embed(inputs).await.map_err(ApiError::internal)?;
    let out: Vec<Value> = vecs
        .into_iter()
        .enumerate()
        .map(|(i, mut v)| {
            normalize(&mut v, norm);
            json!({"index": i, "embedding": [v]})
        })
        .collect();
    Ok(Json(Value::Array(out)))
}
