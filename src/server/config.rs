//! The server's configuration, built from llama-server flags, `LLAMA_ARG_*`
//! variables and pipeshard's own options (see [`super::args`]).

use std::path::PathBuf;

use crate::engine::{FlashAttention, SamplingParams};

/// Everything `pipeshard-server` needs to start.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// GGUF model; `None` takes the default model (fetched on first use).
    pub model: Option<PathBuf>,
    /// Names the model answers to (`-a`); the first is reported as its id.
    pub alias: Vec<String>,
    pub host: String,
    pub port: u16,
    /// Total context over all slots (`-c`; 0: the model's training length).
    pub n_ctx: u32,
    /// Parallel slots (`-np`).
    pub n_parallel: u32,
    pub n_batch: u32,
    pub n_ubatch: u32,
    /// `-ngl` (negative: all layers).
    pub n_gpu_layers: i32,
    pub flash_attention: FlashAttention,
    pub threads: Option<i32>,
    pub threads_batch: Option<i32>,
    /// KV cache types by ggml name (`-ctk`/`-ctv`), e.g. "q8_0".
    pub cache_type_k: Option<String>,
    pub cache_type_v: Option<String>,
    pub kv_offload: bool,
    pub op_offload: bool,
    pub kv_unified: bool,
    pub use_mmap: bool,
    /// `--repack` / `--no-repack`: repack CPU weights into faster layouts.
    pub repack: bool,
    /// `-ot` / `--cpu-moe` / `--n-cpu-moe`: (tensor regex, buffer type name).
    pub tensor_overrides: Vec<(String, String)>,
    /// Accepted API keys; empty: no authentication.
    pub api_keys: Vec<String>,
    pub endpoint_metrics: bool,
    pub endpoint_slots: bool,
    /// Allow `POST /props`.
    pub endpoint_props: bool,
    /// `--jinja` / `--no-jinja`; `None`: Jinja only when llama.cpp's built-in
    /// templates do not recognise the model's template.
    pub jinja: Option<bool>,
    /// `--chat-template` / `--chat-template-file`: a built-in name or a Jinja source.
    pub chat_template: Option<String>,
    /// Extra variables for Jinja templates (`--chat-template-kwargs`).
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    pub mmproj: Option<PathBuf>,
    pub mmproj_offload: bool,
    /// Serve `/embedding` and `/v1/embeddings`.
    pub embeddings: bool,
    /// Normalisation for OpenAI embeddings (upstream's `--embd-normalize`).
    pub embd_normalize: i32,
    /// Default for requests' `cache_prompt`.
    pub cache_prompt: bool,
    /// Server read/write timeout in seconds (`-to`).
    pub timeout_s: u64,
    /// Default `n_predict` (-1: until the slot's context is full).
    pub n_predict: i32,
    /// Default sampling for requests that leave fields out.
    pub sampling: SamplingParams,
    /// Keep generating past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Output special tokens as text (`-sp`).
    pub special: bool,
    /// Prefix for every route (`--api-prefix`).
    pub api_prefix: String,
    /// Largest accepted request body in bytes (pipeshard's `--max-body-size`).
    pub max_body_bytes: usize,
    /// Directory that `image_url` may name local files in (pipeshard's
    /// `--media-dir`); None refuses local paths.
    pub media_dir: Option<PathBuf>,
    pub log_disable: bool,
    pub verbosity: u8,
    /// pipeshard: VRAM budget in bytes (`--vram-budget`); stored for the planner.
    pub vram_budget: Option<u64>,
    /// pipeshard: machine profile file (`--profile`); stored for the planner.
    pub profile: Option<PathBuf>,
    /// pipeshard: placement plan file (`--plan`); stored for the planner.
    pub plan: Option<PathBuf>,
    /// pipeshard: device slots for streamed weights (`--stream-slots`).
    pub stream_slots: u32,
    /// pipeshard: routed experts per token the GPU computes in decode
    /// (`--hybrid-experts`); None: the plan's choice.
    pub hybrid_gpu_experts: Option<u32>,
    /// upstream `--fit`, stored for the planner.
    pub fit: Option<String>,
    /// Directory with ggml backend modules.
    pub backend_dir: Option<PathBuf>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            model: None,
            alias: Vec::new(),
            host: "127.0.0.1".into(),
            port: 8080,
            n_ctx: 0,
            n_parallel: 4,
            n_batch: 2048,
            n_ubatch: 512,
            n_gpu_layers: -1,
            flash_attention: FlashAttention::Auto,
            threads: None,
            threads_batch: None,
            cache_type_k: None,
            cache_type_v: None,
            kv_offload: true,
            op_offload: true,
            kv_unified: true,
            use_mmap: true,
            repack: true,
            tensor_overrides: Vec::new(),
            api_keys: Vec::new(),
            endpoint_metrics: false,
            endpoint_slots: true,
            endpoint_props: false,
            jinja: None,
            chat_template: None,
            chat_template_kwargs: serde_json::Map::new(),
            mmproj: None,
            mmproj_offload: true,
            embeddings: false,
            embd_normalize: 2,
            cache_prompt: true,
            timeout_s: 3600,
            n_predict: -1,
            sampling: SamplingParams::default(),
            ignore_eos: false,
            special: false,
            api_prefix: String::new(),
            max_body_bytes: 64 << 20,
            media_dir: None,
            log_disable: false,
            verbosity: 0,
            vram_budget: None,
            profile: None,
            plan: None,
            stream_slots: crate::plan::DEFAULT_STREAM_SLOTS,
            hybrid_gpu_experts: None,
            fit: None,
            backend_dir: None,
        }
    }
}
