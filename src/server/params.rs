//! Request fields → generation settings, with upstream's names, defaults
//! from the command line, and 400s for fields of the wrong type.

use serde_json::{Map, Value};

use super::config::ServerConfig;
use super::error::ApiError;
use super::json_schema;
use super::task::GenParams;

type Obj = Map<String, Value>;

fn wrong(key: &str, what: &str) -> ApiError {
    ApiError::bad_request(format!("\"{key}\" must be {what}"))
}

/// A number field (`null` counts as absent).
pub fn f64_field(o: &Obj, key: &str) -> Result<Option<f64>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n.as_f64().map(Some).ok_or_else(|| wrong(key, "a number")),
        Some(_) => Err(wrong(key, "a number")),
    }
}

/// An integer field (`null` counts as absent).
pub fn i64_field(o: &Obj, key: &str) -> Result<Option<i64>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Ok(Some(i)),
            (None, Some(f)) if f.fract() == 0.0 && f.abs() < 9e15 => Ok(Some(f as i64)),
            _ => Err(wrong(key, "an integer")),
        },
        Some(_) => Err(wrong(key, "an integer")),
    }
}

/// A boolean field (`null` counts as absent).
pub fn bool_field(o: &Obj, key: &str) -> Result<Option<bool>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(wrong(key, "a boolean")),
    }
}

/// A string field (`null` counts as absent).
pub fn str_field<'a>(o: &'a Obj, key: &str) -> Result<Option<&'a str>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(wrong(key, "a string")),
    }
}

fn stop_field(o: &Obj) -> Result<Vec<String>, ApiError> {
    match o.get("stop") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .map(String::from)
                    .ok_or_else(|| wrong("stop", "a string or an array of strings"))
            })
            .collect(),
        Some(_) => Err(wrong("stop", "a string or an array of strings")),
    }
}

/// Which API the request came through (field names differ a little).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/completion`.
    Native,
    /// `/v1/completions`.
    OaiCompletion,
    /// `/v1/chat/completions`.
    OaiChat,
}

fn grammar_from(o: &Obj) -> Result<Option<String>, ApiError> {
    let schema_grammar = |schema: &Value| {
        json_schema::schema_to_grammar(schema)
            .map(Some)
            .map_err(|e| ApiError::bad_request(e.to_string()))
    };
    if let Some(rf) = o.get("response_format").filter(|v| !v.is_null()) {
        let rf = rf.as_object().ok_or_else(|| wrong("response_format", "an object"))?;
        return match rf.get("type").and_then(Value::as_str) {
            Some("text") => Ok(None),
            Some("json_object") => match rf.get("schema") {
                Some(s) => schema_grammar(s),
                None => Ok(Some(json_schema::json_object_grammar())),
            },
            Some("json_schema") => {
                let js = rf.get("json_schema").and_then(Value::as_object);
                let schema = js.and_then(|j| j.get("schema")).or_else(|| rf.get("schema"));
                match schema {
                    Some(s) => schema_grammar(s),
                    None => Err(ApiError::bad_request(
                        "response_format json_schema needs json_schema.schema",
                    )),
                }
            }
            _ => Err(ApiError::bad_request(
                "response_format.type must be \"text\", \"json_object\" or \"json_schema\"",
            )),
        };
    }
    if let Some(s) = o.get("json_schema").filter(|v| !v.is_null()) {
        return schema_grammar(s);
    }
    Ok(str_field(o, "grammar")?
        .filter(|g| !g.trim().is_empty())
        .map(String::from))
}

/// Generation settings from a request body.
pub fn gen_params(o: &Obj, cfg: &ServerConfig, api: Api) -> Result<GenParams, ApiError> {
    let mut s = cfg.sampling.clone();
    if let Some(v) = f64_field(o, "temperature")? {
        s.temperature = v as f32;
    }
    if let Some(v) = i64_field(o, "top_k")? {
        s.top_k = v.clamp(0, i32::MAX as i64) as i32;
    }
    if let Some(v) = f64_field(o, "top_p")? {
        s.top_p = v as f32;
    }
    if let Some(v) = f64_field(o, "min_p")? {
        s.min_p = v as f32;
    }
    if let Some(v) = f64_field(o, "repeat_penalty")? {
        s.repeat_penalty = v as f32;
    }
    if let Some(v) = i64_field(o, "repeat_last_n")? {
        s.repeat_last_n = v.clamp(-1, i32::MAX as i64) as i32;
    }
    if let Some(v) = f64_field(o, "presence_penalty")? {
        s.presence_penalty = v as f32;
    }
    if let Some(v) = f64_field(o, "frequency_penalty")? {
        s.frequency_penalty = v as f32;
    }
    if let Some(v) = i64_field(o, "seed")? {
        s.seed = if v < 0 {
            u32::MAX
        } else {
            u32::try_from(v).map_err(|_| wrong("seed", "a 32-bit integer"))?
        };
    }
    if !(s.top_p.is_finite() && s.min_p.is_finite() && s.temperature.is_finite()) {
        return Err(ApiError::bad_request("sampling parameters must be finite"));
    }
    s.grammar = grammar_from(o)?;

    let mut n_predict = cfg.n_predict as i64;
    for key in ["n_predict", "max_tokens", "max_completion_tokens"] {
        if let Some(v) = i64_field(o, key)? {
            n_predict = v;
        }
    }
    let (mut n_probs, mut want_logprobs) = (i64_field(o, "n_probs")?.unwrap_or(0), false);
    match api {
        Api::OaiChat => {
            want_logprobs = bool_field(o, "logprobs")?.unwrap_or(false);
            if want_logprobs {
                n_probs = i64_field(o, "top_logprobs")?.unwrap_or(0);
            }
        }
        Api::OaiCompletion => {
            if let Some(v) = o.get("logprobs").filter(|v| !v.is_null()) {
                n_probs = match v {
                    Value::Bool(b) => i64::from(*b),
                    _ => i64_field(o, "logprobs")?.unwrap_or(0),
                };
                want_logprobs = true;
            }
        }
        Api::Native => {}
    }
    if !(0..=100).contains(&n_probs) {
        return Err(wrong("n_probs / top_logprobs", "between 0 and 100"));
    }
    if let Some(n) = i64_field(o, "n")? {
        if n != 1 {
            return Err(ApiError::bad_request(
                "only one completion choice is allowed (n must be 1)",
            ));
        }
    }
    Ok(GenParams {
        n_predict: n_predict.clamp(-1, i32::MAX as i64) as i32,
        sampling: s,
        stop: stop_field(o)?,
        n_probs: n_probs as usize,
        want_logprobs,
        cache_prompt: bool_field(o, "cache_prompt")?.unwrap_or(cfg.cache_prompt),
        ignore_eos: bool_field(o, "ignore_eos")?.unwrap_or(cfg.ignore_eos),
        special: cfg.special,
        id_slot: i64_field(o, "id_slot")?.unwrap_or(-1).clamp(-1, i32::MAX as i64) as i32,
    })
}

/// Whether the request asks for a stream.
pub fn wants_stream(o: &Obj) -> Result<bool, ApiError> {
    Ok(bool_field(o, "stream")?.unwrap_or(false))
}
