//! pipeshard: run GGUF models under a hard VRAM budget, as fast as the
//! machine allows, with the same math as full-GPU execution.
//!
//! The crate is layered:
//! - [`engine`]: the safe FFI layer over our patched llama.cpp (all `unsafe`
//!   lives there);
//! - [`gguf`]: reading, validating and writing GGUF files without loading them
//!   (the `pipeshard-gguf` crate);
//! - [`profile`]: measured speeds of this machine (CPU, GPU, link);
//! - [`plan`]: the cost model and optimizer that place each weight per token tier;
//! - [`launch`]: the one path from options and parameters to a checked plan,
//!   and the process's budget check after loading;
//! - [`generate`]: prompt processing, sampling and streaming on an engine context;
//! - [`bench`]: side-by-side runs of pipeshard and upstream placement policies;
//! - [`results`]: the results summary's rows, made from benchmark outputs and rendered;
//! - [`server_hook`]: llama.cpp's own server with pipeshard's plan installed at load;
//! - [`default_model`]: the default model, fetched from PyPI on first use.
//!
//! The developer tools (synthetic models, the GGUF and HTTP fuzzers) are the
//! `pipeshard-devtools` crate beside this one.

pub mod bench;
pub mod default_model;
pub mod engine;
pub mod generate;
pub mod launch;
pub mod logging;
pub mod plan;
pub mod profile;
pub mod progress;
pub mod results;
pub mod server_hook;

pub use pipeshard_gguf as gguf;
