//! GGUF inspection, validation and writing, in pure Rust.
//!
//! * [`GgufFile::open`] reads only the header, metadata and tensor directory
//!   of a file and validates every tensor's extent against the file size;
//!   malformed input yields a [`GgufError`] naming the file and the problem.
//! * [`GgufWriter`] streams a new file: header and directory first, then
//!   each tensor's bytes in order, without holding the model in memory.
//! * [`ModelInfo`] derives hyper-parameters and a classified tensor list
//!   from a parsed file, for memory planning.
//! * [`validate`] checks the hyper-parameters llama.cpp trusts (layer,
//!   expert and head counts, head sizes, the vocabulary, the types of
//!   scalar keys) against its limits and the file's tensors.
//! * [`types`] has the ggml type table and size helpers, including the CUDA
//!   allocation-padding rule ([`cuda_alloc_size`]).

pub mod error;
pub mod model_info;
pub mod reader;
pub mod tied_output;
pub mod types;
pub mod validate;
pub mod value;
pub mod writer;

pub use error::{GgufError, GgufErrorKind, GgufWriteError};
pub use model_info::{parse_layer, ModelInfo, ModelInfoError, ModelTensor, TensorRole};
pub use reader::{GgufFile, TensorInfo, DEFAULT_ALIGNMENT};
pub use types::{cuda_alloc_size, n_elements, nbytes, row_size, GgmlType, SizeError};
pub use validate::{validate, HparamError, HparamProblem, Subject};
pub use value::{GgufArray, GgufValue, GgufValueType};
pub use writer::{encode_value, GgufWriter, PlannedTensor, TensorDataWriter, TensorSink};

use std::path::Path;

/// Error from [`inspect`]: the file is malformed, or its metadata does not
/// describe a model.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The file could not be read or is malformed.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// A hyper-parameter is out of llama.cpp's limits or disagrees with the
    /// tensors.
    #[error(transparent)]
    Hparams(#[from] HparamError),
    /// The metadata lacks required hyper-parameters.
    #[error(transparent)]
    Model(#[from] ModelInfoError),
}

/// Opens `path`, validates its header and tensor directory against the file
/// size and its hyper-parameters against llama.cpp's limits ([`validate`]),
/// and derives its [`ModelInfo`]. This is the one-call entry point for
/// inspecting a real model file (and what the real-model tests exercise).
pub fn inspect(path: &Path) -> Result<(GgufFile, ModelInfo), InspectError> {
    let file = GgufFile::open(path)?;
    validate(&file)?;
    let info = ModelInfo::from_gguf(&file)?;
    Ok((file, info))
}
