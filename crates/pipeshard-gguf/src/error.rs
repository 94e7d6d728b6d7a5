//! Errors for reading and writing GGUF files.

use std::path::{Path, PathBuf};

use super::types::{GgmlType, SizeError};

/// A GGUF file could not be read, or is malformed.
///
/// The message names the file and what exactly was wrong with it, e.g.
/// `model.gguf: tensor 'blk.3.attn_q.weight' data ends at byte 9000 but the
/// file has 8192 bytes`.
#[derive(Debug, thiserror::Error)]
#[error("{}: {kind}", path.display())]
pub struct GgufError {
    path: PathBuf,
    kind: GgufErrorKind,
}

impl GgufError {
    /// Builds an error for `path`.
    pub fn new(path: impl Into<PathBuf>, kind: GgufErrorKind) -> Self {
        GgufError {
            path: path.into(),
            kind,
        }
    }

    /// The file the error is about.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What was wrong.
    pub fn kind(&self) -> &GgufErrorKind {
        &self.kind
    }

    /// Consumes the error, returning what was wrong.
    pub fn into_kind(self) -> GgufErrorKind {
        self.kind
    }
}

/// What was wrong with a GGUF file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufErrorKind {
    /// The file could not be opened or read.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\"")]
    BadMagic {
        /// The bytes found instead.
        found: [u8; 4],
    },
    /// Only GGUF versions 2 and 3 are supported.
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    /// The file ends in the middle of a structure.
    #[error("file is truncated: it ends at byte {file_size} while reading {what} at byte {offset}")]
    Truncated {
        /// What was being read.
        what: String,
        /// Where that read started.
        offset: u64,
        /// The file size.
        file_size: u64,
    },
    /// A count in the header cannot possibly fit in the rest of the file.
    #[error("{what} is {count}, which cannot fit in the {remaining} bytes left in the file")]
    ImplausibleCount {
        /// What was counted (`"tensor count"`, `"array length of 'k'"`, …).
        what: String,
        /// The count read.
        count: u64,
        /// Bytes left in the file after the count.
        remaining: u64,
    },
    /// A string or key is not valid UTF-8.
    #[error("{what} is not valid UTF-8")]
    InvalidUtf8 {
        /// What the string was.
        what: String,
    },
    /// A metadata key is the empty string.
    #[error("metadata key #{index} is empty")]
    EmptyKey {
        /// The key's position.
        index: u64,
    },
    /// A metadata key appears twice.
    #[error("duplicate metadata key '{0}'")]
    DuplicateKey(String),
    /// A metadata value has an unknown type tag.
    #[error("metadata key '{key}' has unknown value type {type_id}")]
    UnknownValueType {
        /// The key.
        key: String,
        /// The tag read.
        type_id: u32,
    },
    /// An array contains arrays.
    #[error("metadata key '{key}' is a nested array, which is not supported")]
    NestedArray {
        /// The key.
        key: String,
    },
    /// `general.alignment` is not a non-zero power of two `u32`.
    #[error("general.alignment must be a non-zero power-of-two u32, got {0}")]
    BadAlignment(String),
    /// A tensor name is 64 bytes or longer (ggml's `GGML_MAX_NAME`).
    #[error("tensor #{index} has a name of {len} bytes; ggml allows at most 63")]
    TensorNameTooLong {
        /// The tensor's position.
        index: u64,
        /// The name length.
        len: u64,
    },
    /// A tensor name appears twice.
    #[error("duplicate tensor name '{0}'")]
    DuplicateTensor(String),
    /// A tensor has zero or more than four dimensions.
    #[error("tensor '{tensor}' has {n_dims} dimensions; 1 to 4 are supported")]
    BadRank {
        /// The tensor.
        tensor: String,
        /// The dimension count read.
        n_dims: u32,
    },
    /// A dimension is zero or does not fit in a signed 64-bit integer.
    #[error("tensor '{tensor}' dimension {index} is {value}, which is not a valid size")]
    BadDim {
        /// The tensor.
        tensor: String,
        /// Which dimension.
        index: usize,
        /// The value read.
        value: u64,
    },
    /// A tensor uses an unknown or removed ggml type id.
    #[error("tensor '{tensor}' has unknown ggml type id {type_id}")]
    UnknownGgmlType {
        /// The tensor.
        tensor: String,
        /// The type id read.
        type_id: u32,
    },
    /// A tensor's shape is incompatible with its type, or its size overflows.
    #[error("tensor '{tensor}' of type {ty} and shape {dims:?}: {source}")]
    BadShape {
        /// The tensor.
        tensor: String,
        /// Its type.
        ty: GgmlType,
        /// Its shape.
        dims: Vec<u64>,
        /// Why its size cannot be computed.
        source: SizeError,
    },
    /// A tensor's data offset is not a multiple of the alignment.
    #[error("tensor '{tensor}' data offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedOffset {
        /// The tensor.
        tensor: String,
        /// Its offset relative to the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// Two tensors' data regions overlap.
    #[error("tensors '{first}' and '{second}' have overlapping data")]
    OverlappingTensors {
        /// The tensor with the lower offset.
        first: String,
        /// The tensor whose data starts inside the first one's.
        second: String,
    },
    /// A tensor's data extends past the end of the file.
    #[error("tensor '{tensor}' data ends at byte {end} but the file has {file_size} bytes")]
    DataOutOfBounds {
        /// The tensor.
        tensor: String,
        /// Absolute end offset of its data (saturated at `u64::MAX`).
        end: u64,
        /// The file size.
        file_size: u64,
    },
}

/// A GGUF file could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufWriteError {
    /// Writing to the output failed.
    #[error("I/O error while writing GGUF: {0}")]
    Io(#[from] std::io::Error),
    /// A metadata key was added twice.
    #[error("duplicate metadata key '{0}'")]
    DuplicateKey(String),
    /// A metadata key is empty.
    #[error("metadata keys must not be empty")]
    EmptyKey,
    /// A tensor was declared twice.
    #[error("duplicate tensor name '{0}'")]
    DuplicateTensor(String),
    /// A tensor name is empty or 64 bytes or longer.
    #[error("tensor name '{0}' must be 1 to 63 bytes long")]
    BadTensorName(String),
    /// A tensor's shape is incompatible with its type.
    #[error("tensor '{tensor}' of type {ty} and shape {dims:?}: {source}")]
    BadShape {
        /// The tensor.
        tensor: String,
        /// Its type.
        ty: GgmlType,
        /// Its shape.
        dims: Vec<u64>,
        /// Why its size cannot be computed.
        source: SizeError,
    },
    /// A dimension is zero.
    #[error("tensor '{tensor}' has a zero dimension in {dims:?}")]
    ZeroDim {
        /// The tensor.
        tensor: String,
        /// Its shape.
        dims: Vec<u64>,
    },
    /// `general.alignment` was set to something other than a power-of-two `u32`.
    #[error("alignment must be a non-zero power of two, got {0}")]
    BadAlignment(u64),
    /// Tensor data was written for a tensor other than the next one declared.
    #[error("expected data for tensor '{expected}', got data for '{got}'")]
    OutOfOrder {
        /// The next tensor in declaration order.
        expected: String,
        /// The tensor the caller named.
        got: String,
    },
    /// More bytes were written for a tensor than its declared size.
    #[error("tensor '{tensor}' is {expected} bytes but {got} bytes were written for it")]
    SizeMismatch {
        /// The tensor.
        tensor: String,
        /// Its declared size.
        expected: u64,
        /// Bytes received.
        got: u64,
    },
    /// Data was written after every tensor was complete.
    #[error("all declared tensors have been written already")]
    NoMoreTensors,
    /// The writer was finished before every tensor had its data.
    #[error("tensor '{tensor}' (and {remaining} after it) never received its data")]
    Incomplete {
        /// The first incomplete tensor.
        tensor: String,
        /// How many tensors follow it.
        remaining: usize,
    },
}
