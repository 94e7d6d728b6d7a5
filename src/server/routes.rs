//! The router: every endpoint, the API-key check, the body limit and the
//! JSON body extractor that answers bad bodies in upstream's error shape.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{Map, Value};

use super::error::ApiError;
use super::state::AppState;
use super::{api_native as native, api_openai as oai};

/// A request body that must be a JSON object.
pub struct JsonBody(pub Map<String, Value>);

#[axum::async_trait]
impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::too_large(format!("request body too large: {}", e.body_text()))
            } else {
                ApiError::bad_request(e.body_text())
            }
        })?;
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(Value::Object(m)) => Ok(JsonBody(m)),
            Ok(_) => Err(ApiError::bad_request("the request body must be a JSON object")),
            Err(e) => Err(ApiError::bad_request(format!("invalid JSON in the request body: {e}"))),
        }
    }
}

/// Endpoints that stay open with `--api-key`, as upstream.
const PUBLIC: &[&str] = &["/health", "/v1/health", "/models", "/v1/models", "/api/tags"];

async fn auth(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let keys = &st.config.api_keys;
    let path = req.uri().path();
    let path = path.strip_prefix(st.config.api_prefix.as_str()).unwrap_or(path);
    if keys.is_empty() || req.method() == Method::OPTIONS || PUBLIC.contains(&path) {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| req.headers().get("x-api-key").and_then(|v| v.to_str().ok()))
        .map(str::trim);
    match given {
        Some(k) if keys.iter().any(|key| key == k) => next.run(req).await,
        _ => ApiError::unauthorized().into_response(),
    }
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(format!("File Not Found: {} {}", req.method(), req.uri().path()))
}

/// All routes, with the state, auth and body limit applied.
pub fn router(state: Arc<AppState>) -> Router {
    let api = Router::new()
        .route("/health", get(native::health))
        .route("/v1/health", get(native::health))
        .route("/models", get(oai::models))
        .route("/v1/models", get(oai::models))
        .route("/completion", post(native::completion))
        .route("/completions", post(native::completion))
        .route("/v1/completions", post(oai::completions))
        .route("/chat/completions", post(oai::chat_completions))
        .route("/v1/chat/completions", post(oai::chat_completions))
        .route("/tokenize", post(native::tokenize))
        .route("/detokenize", post(native::detokenize))
        .route("/apply-template", post(native::apply_template))
        .route("/props", get(native::props).post(native::set_props))
        .route("/slots", get(native::slots))
        .route("/metrics", get(native::metrics))
        .route("/embedding", post(native::embedding))
        .route("/embeddings", post(native::embedding))
        .route("/v1/embeddings", post(oai::embeddings))
        .fallback(not_found);
    let prefix = state.config.api_prefix.clone();
    let api = if prefix.is_empty() {
        api
    } else {
        Router::new().nest(&prefix, api).fallback(not_found)
    };
    api.layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .with_state(state)
}
