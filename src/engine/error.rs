//! Errors raised by the safe engine layer.

use std::path::PathBuf;

/// Everything that can go wrong between Rust and llama.cpp.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("model file {path} does not exist")]
    ModelMissing { path: PathBuf },
    #[error("{path} is not a usable GGUF model: {reason}")]
    InvalidModel { path: PathBuf, reason: String },
    #[error("llama.cpp failed to load the model {path} (see the log above for its reason)")]
    ModelLoad { path: PathBuf },
    #[error("model loading was cancelled")]
    LoadCancelled,
    #[error("llama.cpp failed to create a context (n_ctx={n_ctx}, n_batch={n_batch}, n_ubatch={n_ubatch})")]
    ContextCreate { n_ctx: u32, n_batch: u32, n_ubatch: u32 },
    #[error("no ggml backend could be loaded from {searched}; pass --backend-dir or set PIPESHARD_BACKEND_DIR")]
    NoBackend { searched: String },
    #[error("tokenization of {len} bytes failed")]
    Tokenize { len: usize },
    #[error("text contains an interior NUL byte")]
    NulInText,
    #[error("token {token} is out of range for a vocabulary of {n_vocab} tokens")]
    TokenOutOfRange { token: i32, n_vocab: i32 },
    #[error("the prompt has {n_tokens} tokens but the context only holds {n_ctx}")]
    ContextOverflow { n_tokens: usize, n_ctx: u32 },
    #[error("llama_decode failed with code {code}{}", decode_reason(*code))]
    Decode { code: i32 },
    #[error("the model has no chat template; pass one explicitly")]
    NoChatTemplate,
    #[error("the chat template could not be applied (unsupported template?)")]
    ChatTemplate,
    #[error("embeddings are not available: the context was not created with embeddings on")]
    NoEmbeddings,
    #[error("cannot load the multimodal projector {path}: {reason}")]
    ProjectorLoad { path: PathBuf, reason: String },
    #[error("cannot read the image {what}: {reason}")]
    Image { what: String, reason: String },
    #[error("evaluating the multimodal prompt failed: {0}")]
    VisionEval(String),
    #[error("the model has no weight named {name:?}")]
    UnknownWeight { name: String },
    #[error("cannot move the weight {name}: {reason}{}", moved_before(*done))]
    WeightMove { name: String, done: usize, reason: String },
    #[error(
        "allocating {bytes} bytes of {buffer_type} for the weight {name} failed, so none of the weights bound \
         there moved{}", moved_before(*done)
    )]
    WeightAlloc {
        name: String,
        buffer_type: String,
        bytes: u64,
        done: usize,
    },
    #[error(
        "{moved} weights moved, but the compute buffers for their new placement cannot be allocated; \
         move more weights off the device (or use fewer streaming slots) before the next decode"
    )]
    ComputeReserve { moved: usize },
    #[error("staging the weight {name} failed: {reason}")]
    WeightStage { name: String, reason: String },
    #[error("no weights are staged")]
    NothingStaged,
    #[error("{0}")]
    InvalidArgument(String),
    #[error("--rpc {endpoint}: {reason}")]
    Rpc { endpoint: String, reason: String },
    #[error("{0}")]
    Ubatch(String),
    #[error("sequence 0: {0}")]
    SeqState(String),
}

fn moved_before(done: usize) -> String {
    if done == 0 {
        String::new()
    } else {
        format!(" ({done} weights moved to the host before it stay there)")
    }
}

fn decode_reason(code: i32) -> &'static str {
    match code {
        1 => ": no KV slot for the batch (context full)",
        2 => ": aborted",
        -1 => ": invalid batch",
        _ => "",
    }
}

/// Result alias for the engine layer.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
