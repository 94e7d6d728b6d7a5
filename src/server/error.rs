//! Errors: HTTP errors in upstream's JSON shape, and errors that stop the server.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// An error answered to a client as
/// `{"error":{"code":N,"message":"...","type":"..."}}`, as llama-server does.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
}

impl ApiError {
    /// 400 `invalid_request_error`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: message.into(),
        }
    }
    /// 401 `authentication_error`.
    pub fn unauthorized() -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            kind: "authentication_error",
            message: "Invalid API Key".into(),
        }
    }
    /// 404 `not_found_error`.
    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            kind: "not_found_error",
            message: message.into(),
        }
    }
    /// 413, for bodies over the limit.
    pub fn too_large(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            kind: "invalid_request_error",
            message: message.into(),
        }
    }
    /// 500 `server_error`.
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "server_error",
            message: message.into(),
        }
    }
    /// 501 `not_supported_error`.
    pub fn not_supported(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::NOT_IMPLEMENTED,
            kind: "not_supported_error",
            message: message.into(),
        }
    }
    /// 503 `unavailable_error`, while the model loads.
    pub fn loading() -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "unavailable_error",
            message: "Loading model".into(),
        }
    }
    /// 400 `exceed_context_size_error`.
    pub fn context_exceeded(n_prompt: usize, n_ctx: u32) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "exceed_context_size_error",
            message: format!(
                "the request exceeds the available context size ({n_prompt} prompt tokens, {n_ctx} per slot), try increasing it"
            ),
        }
    }

    /// The JSON body.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"error": {"code": self.status.as_u16(), "message": self.message, "type": self.kind}})
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.status)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.to_json())).into_response()
    }
}

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Args(#[from] super::args::ArgsError),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("loading the model failed: {0}")]
    Load(String),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}
