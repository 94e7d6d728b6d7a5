//! pipeshard's developer tools, kept out of the product library:
//! - [`synth`]: random-weight GGUFs with real model shapes;
//! - [`fuzz`]: structure-aware GGUF mutation, each case loaded in a child
//!   process, and ([`fuzz::http`]) the server's HTTP fuzzer and soak trials.
//!
//! The tools read and write models through [`gguf`], whose types their
//! results and errors carry.

pub use pipeshard_gguf as gguf;

pub mod fuzz;
pub mod synth;
