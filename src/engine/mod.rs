//! The safe layer over llama.cpp. Every `unsafe` block of pipeshard lives in
//! this module; everything above it uses these types.
//!
//! ```no_run
//! use pipeshard::engine::{Context, ContextParams, Model, ModelParams};
//! # fn main() -> Result<(), pipeshard::engine::EngineError> {
//! let model = Model::load("model.gguf".as_ref(), ModelParams::default())?;
//! let mut ctx = Context::new(&model, ContextParams::default())?;
//! let tokens = model.tokenize("Hello", true, false)?;
//! ctx.decode_tokens(&tokens, 0, true)?;
//! # Ok(()) }
//! ```

mod backend;
mod borrowed_batch;
mod context;
mod cuda_limits;
mod error;
pub mod ffi;
mod fit;
mod memory;
mod memory_sampler;
mod migrate;
mod model;
pub mod nvml;
pub mod opbench;
mod output_embeddings;
mod placement;
mod routing;
mod rpc;
mod sampler;
mod seq0;
mod server;
mod vision;

pub use backend::{
    cpu_features, device_free_bytes, first_device, has_gpu, init, init_keep_log, list_devices, process_bytes_at_init,
    Device, DeviceKind,
};
pub use context::{default_threads, BatchItem, Context, ContextParams, FlashAttention, Perf};
pub use error::{EngineError, Result};
pub use fit::{fit_params, Fitted};
pub use memory::{
    buffer_types, device_buffer_types, dry_run_device_bytes, weight_bytes_streamed, BufferType, MemoryBreakdown,
};
pub use memory_sampler::{
    current_rss, heap_in_use, nvml_cards, process_device_bytes, Card, MemoryPeaks, MemorySampler, MemorySource,
};
pub use migrate::{
    cancel_staged, commit_staged, migrate_weights, migrate_weights_to, move_weights, residence_buffer_types,
    stage_state, stage_weights, stage_weights_to, ContextRef, MigrationReport, Residence, StageState, WeightMove,
};
pub use model::{apply_chat_template, check_model_file, ChatMessage, Model, ModelParams, Token};
pub use placement::{
    stream_schedule, MoeSplitPolicy, Offload, OffloadPolicy, OffloadQuery, OpKind, RowSplitPolicy, StreamStep,
    TensorPlacement,
};
pub use routing::{MoeIds, MoeObserver, MoeRoutePolicy, MoeRouteQuery};
pub use rpc::add_rpc_servers;
pub use sampler::{argmax, Sampler, SamplingParams};
pub use seq0::{Seq0, Seq0Mark};
pub use server::{
    run_llama_server, set_media_release_compute, wake_server_loop, LoadDecision, LoadHook, LoadRequest, LoadRole,
    LoopHook, ProjectorHook, ProjectorParams, ReportText, ServerHooks, ServerReports,
};
pub use vision::{
    encoder_peak, media_marker, Bitmap, EncodeGate, EncoderPeak, PeakImage, VisionEval, VisionOptions, VisionProjector,
};
