//! Reading the header, metadata and tensor directory of a GGUF file.
//!
//! Only the front of the file is read (through a buffered reader); tensor
//! data is never touched, but every tensor's extent is checked against the
//! file size. Every count and length read from the file is bounded by the
//! bytes actually left in it before anything is allocated, so a corrupt or
//! hostile file produces a [`GgufError`], never a panic or a huge allocation.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, ErrorKind, Read};
use std::path::{Path, PathBuf};

use super::error::{GgufError, GgufErrorKind};
use super::types::{nbytes, GgmlType};
use super::value::{GgufArray, GgufValue, GgufValueType};

/// Alignment of the data section and of each tensor when the file does not
/// set `general.alignment` (`GGUF_DEFAULT_ALIGNMENT`).
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// The magic bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";

/// Longest tensor name ggml accepts, in bytes (`GGML_MAX_NAME - 1`).
pub const MAX_TENSOR_NAME_LEN: usize = 63;

/// Upper bound on the size of the header region (metadata and tensor
/// directory) that the reader is willing to parse, whatever the file size.
/// Real models use a few tens of MiB at most (mostly the tokenizer).
pub const MAX_HEADER_BYTES: u64 = 1 << 32;

/// Metadata key holding the data alignment.
pub const KEY_ALIGNMENT: &str = "general.alignment";

/// Metadata key holding the architecture name.
pub const KEY_ARCHITECTURE: &str = "general.architecture";

/// One entry of the tensor directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Shape, innermost (row length, ggml's `ne[0]`) first.
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
    /// Absolute offset of the data in the file.
    pub file_offset: u64,
    /// Exact size of the data in bytes (`ggml_nbytes`).
    pub nbytes: u64,
}

impl TensorInfo {
    /// Number of elements (the product of the dimensions).
    pub fn n_elements(&self) -> u64 {
        // Checked when the file was read: nbytes did not overflow, and the
        // element count is at most nbytes * block size / type size.
        self.dims.iter().product()
    }
}

/// The parsed front matter of a GGUF file: version, metadata and tensor
/// directory. Tensor data is not loaded.
#[derive(Debug, Clone)]
pub struct GgufFile {
    path: PathBuf,
    version: u32,
    file_size: u64,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, GgufValue)>,
    kv_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl GgufFile {
    /// Opens `path` and reads its header, metadata and tensor directory,
    /// validating everything against the file size.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let err = |kind: GgufErrorKind| GgufError::new(path, kind);
        let file = File::open(path).map_err(|e| err(e.into()))?;
        let file_size = file.metadata().map_err(|e| err(e.into()))?.len();
        GgufFile::from_reader(BufReader::with_capacity(1 << 20, file), file_size, path)
    }

    /// Parses GGUF front matter from any reader positioned at the start of
    /// the file. `file_size` is the total size of the file, used to bound
    /// counts and to check tensor extents; `path` is only used in errors.
    pub fn from_reader<R: Read>(reader: R, file_size: u64, path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        parse(reader, file_size, path).map_err(|kind| GgufError::new(path, kind))
    }

    /// The file this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Total file size in bytes.
    pub fn file_size(&self) -> u64 {
        self.file_size
    }

    /// Alignment of the data section and of each tensor's data.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// All metadata, in file order.
    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.kv_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// The string value of `key`, if present and a string.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(GgufValue::as_str)
    }

    /// The value of `key` as `u64`, if present and a non-negative integer of
    /// any width.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(GgufValue::as_u64)
    }

    /// The value of `key` as `f32`, if present and a float.
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key).and_then(GgufValue::as_f32)
    }

    /// The value of `key` as a bool, if present and a bool.
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key).and_then(GgufValue::as_bool)
    }

    /// The array value of `key`, if present and an array.
    pub fn get_array(&self, key: &str) -> Option<&GgufArray> {
        self.get(key).and_then(GgufValue::as_array)
    }

    /// The string-array value of `key`, if present and an array of strings.
    pub fn get_str_array(&self, key: &str) -> Option<&[String]> {
        match self.get_array(key)? {
            GgufArray::String(v) => Some(v),
            _ => None,
        }
    }

    /// The number of elements of the array value of `key`, if it is an array.
    pub fn get_array_len(&self, key: &str) -> Option<usize> {
        self.get_array(key).map(GgufArray::len)
    }

    /// `general.architecture`, if present.
    pub fn architecture(&self) -> Option<&str> {
        self.get_str(KEY_ARCHITECTURE)
    }

    /// The tensor directory, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// Sum of all tensors' data sizes, without alignment padding.
    pub fn tensor_data_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.nbytes).sum()
    }
}

/// A reader that tracks its position and knows the file size, so that every
/// length can be bounded before allocating and truncation can be reported
/// with an offset.
struct Source<R> {
    inner: R,
    pos: u64,
    file_size: u64,
}

impl<R: Read> Source<R> {
    /// Bytes left in the file, capped by the header limit.
    fn remaining(&self) -> u64 {
        let limit = self.file_size.min(MAX_HEADER_BYTES);
        limit.saturating_sub(self.pos)
    }

    fn fill(&mut self, buf: &mut [u8], what: &dyn Fn() -> String) -> Result<(), GgufErrorKind> {
        match self.inner.read_exact(buf) {
            Ok(()) => {
                self.pos += buf.len() as u64;
                Ok(())
            }
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => Err(GgufErrorKind::Truncated {
                what: what(),
                offset: self.pos,
                file_size: self.file_size,
            }),
            Err(e) => Err(GgufErrorKind::Io(e)),
        }
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufErrorKind> {
        let mut b = [0u8; N];
        self.fill(&mut b, what)?;
        Ok(b)
    }

    fn u8(&mut self, what: &dyn Fn() -> String) -> Result<u8, GgufErrorKind> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u16(&mut self, what: &dyn Fn() -> String) -> Result<u16, GgufErrorKind> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufErrorKind> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufErrorKind> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Checks that `count` items of at least `min_size` bytes each can fit in
    /// the rest of the file.
    fn check_count(&self, count: u64, min_size: u64, what: &dyn Fn() -> String) -> Result<usize, GgufErrorKind> {
        let remaining = self.remaining();
        let fits = count.checked_mul(min_size).is_some_and(|need| need <= remaining);
        match (fits, usize::try_from(count)) {
            (true, Ok(n)) => Ok(n),
            _ => Err(GgufErrorKind::ImplausibleCount {
                what: what(),
                count,
                remaining,
            }),
        }
    }

    /// Reads a length-prefixed byte string.
    fn bytes(&mut self, what: &dyn Fn() -> String) -> Result<Vec<u8>, GgufErrorKind> {
        let len = self.u64(&|| format!("length of {}", what()))?;
        let n = self.check_count(len, 1, &|| format!("length of {}", what()))?;
        let mut buf = vec![0u8; n];
        self.fill(&mut buf, what)?;
        Ok(buf)
    }

    /// Reads a length-prefixed string; invalid UTF-8 is replaced (values
    /// such as vocabulary entries are kept even if a converter mangled them).
    fn string_lossy(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufErrorKind> {
        let b = self.bytes(what)?;
        Ok(match String::from_utf8(b) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }
}

fn parse<R: Read>(reader: R, file_size: u64, path: &Path) -> Result<GgufFile, GgufErrorKind> {
    let mut src = Source {
        inner: reader,
        pos: 0,
        file_size,
    };

    let magic = src.array::<4>(&|| "the magic".into())?;
    if magic != GGUF_MAGIC {
        return Err(GgufErrorKind::BadMagic { found: magic });
    }
    let version = src.u32(&|| "the version".into())?;
    if version != 2 && version != 3 {
        return Err(GgufErrorKind::UnsupportedVersion(version));
    }
    let n_tensors = src.u64(&|| "the tensor count".into())?;
    let n_kv = src.u64(&|| "the metadata count".into())?;

    // Smallest encodings: a KV is a 1-byte key (8+1), a tag (4) and a 1-byte
    // value; a tensor info is a 1-byte name (8+1), n_dims (4), one dim (8),
    // a type (4) and an offset (8).
    const MIN_KV: u64 = 8 + 1 + 4 + 1;
    const MIN_TENSOR_INFO: u64 = 8 + 1 + 4 + 8 + 4 + 8;
    let n_kv = src.check_count(n_kv, MIN_KV, &|| "the metadata count".into())?;
    let n_tensors = src.check_count(n_tensors, MIN_TENSOR_INFO, &|| "the tensor count".into())?;
    let min_total = (n_kv as u64) * MIN_KV + (n_tensors as u64) * MIN_TENSOR_INFO;
    if min_total > src.remaining() {
        return Err(GgufErrorKind::ImplausibleCount {
            what: format!("{n_kv} metadata entries plus the tensor count"),
            count: n_tensors as u64,
            remaining: src.remaining(),
        });
    }

    let mut metadata = Vec::with_capacity(n_kv);
    let mut kv_index = HashMap::with_capacity(n_kv);
    for i in 0..n_kv as u64 {
        let key_bytes = src.bytes(&|| format!("metadata key #{i}"))?;
        if key_bytes.is_empty() {
            return Err(GgufErrorKind::EmptyKey { index: i });
        }
        let key = String::from_utf8(key_bytes).map_err(|_| GgufErrorKind::InvalidUtf8 {
            what: format!("metadata key #{i}"),
        })?;
        if kv_index.contains_key(&key) {
            return Err(GgufErrorKind::DuplicateKey(key));
        }
        let value = read_value(&mut src, &key)?;
        kv_index.insert(key.clone(), metadata.len());
        metadata.push((key, value));
    }

    let alignment = match kv_index.get(KEY_ALIGNMENT).map(|&i| &metadata[i].1) {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() && a <= u64::from(u32::MAX) => a,
            _ => return Err(GgufErrorKind::BadAlignment(format!("{v:?}"))),
        },
    };

    struct RawInfo {
        name: String,
        dims: Vec<u64>,
        ty: GgmlType,
        offset: u64,
        nbytes: u64,
    }
    let mut raw = Vec::with_capacity(n_tensors);
    let mut tensor_index = HashMap::with_capacity(n_tensors);
    for i in 0..n_tensors as u64 {
        let name_bytes = src.bytes(&|| format!("the name of tensor #{i}"))?;
        if name_bytes.len() > MAX_TENSOR_NAME_LEN {
            return Err(GgufErrorKind::TensorNameTooLong {
                index: i,
                len: name_bytes.len() as u64,
            });
        }
        let name = String::from_utf8(name_bytes).map_err(|_| GgufErrorKind::InvalidUtf8 {
            what: format!("the name of tensor #{i}"),
        })?;
        let n_dims = src.u32(&|| format!("the rank of tensor '{name}'"))?;
        if n_dims == 0 || n_dims > 4 {
            return Err(GgufErrorKind::BadRank { tensor: name, n_dims });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims as usize {
            let v = src.u64(&|| format!("dimension {d} of tensor '{name}'"))?;
            if v == 0 || v > i64::MAX as u64 {
                return Err(GgufErrorKind::BadDim {
                    tensor: name,
                    index: d,
                    value: v,
                });
            }
            dims.push(v);
        }
        let type_id = src.u32(&|| format!("the type of tensor '{name}'"))?;
        let Some(ty) = GgmlType::from_id(type_id) else {
            return Err(GgufErrorKind::UnknownGgmlType { tensor: name, type_id });
        };
        let offset = src.u64(&|| format!("the data offset of tensor '{name}'"))?;
        let size = match nbytes(ty, &dims) {
            Ok(s) => s,
            Err(source) => {
                return Err(GgufErrorKind::BadShape {
                    tensor: name,
                    ty,
                    dims,
                    source,
                })
            }
        };
        if offset % alignment != 0 {
            return Err(GgufErrorKind::MisalignedOffset {
                tensor: name,
                offset,
                alignment,
            });
        }
        if tensor_index.contains_key(&name) {
            return Err(GgufErrorKind::DuplicateTensor(name));
        }
        tensor_index.insert(name.clone(), raw.len());
        raw.push(RawInfo {
            name,
            dims,
            ty,
            offset,
            nbytes: size,
        });
    }

    // The data section starts at the end of the directory, aligned up.
    let data_offset = src.pos.checked_next_multiple_of(alignment).unwrap_or(u64::MAX);

    let mut tensors = Vec::with_capacity(raw.len());
    for r in raw {
        let file_offset = data_offset.checked_add(r.offset);
        let end = file_offset.and_then(|o| o.checked_add(r.nbytes));
        match (file_offset, end) {
            (Some(file_offset), Some(end)) if end <= file_size => tensors.push(TensorInfo {
                name: r.name,
                dims: r.dims,
                ty: r.ty,
                offset: r.offset,
                file_offset,
                nbytes: r.nbytes,
            }),
            _ => {
                return Err(GgufErrorKind::DataOutOfBounds {
                    tensor: r.name,
                    end: end.unwrap_or(u64::MAX),
                    file_size,
                })
            }
        }
    }

    // No two tensors may share bytes.
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        if pair[0].offset + pair[0].nbytes > pair[1].offset {
            return Err(GgufErrorKind::OverlappingTensors {
                first: pair[0].name.clone(),
                second: pair[1].name.clone(),
            });
        }
    }

    Ok(GgufFile {
        path: path.to_path_buf(),
        version,
        file_size,
        alignment,
        data_offset,
        metadata,
        kv_index,
        tensors,
        tensor_index,
    })
}

fn read_value<R: Read>(src: &mut Source<R>, key: &str) -> Result<GgufValue, GgufErrorKind> {
    let what = || format!("the value of '{key}'");
    let type_id = src.u32(&|| format!("the value type of '{key}'"))?;
    let ty = GgufValueType::from_id(type_id).ok_or_else(|| GgufErrorKind::UnknownValueType {
        key: key.to_owned(),
        type_id,
    })?;
    Ok(match ty {
        GgufValueType::Array => GgufValue::Array(read_array(src, key)?),
        scalar => read_scalar(src, scalar, &what)?,
    })
}

fn read_scalar<R: Read>(
    src: &mut Source<R>,
    ty: GgufValueType,
    what: &dyn Fn() -> String,
) -> Result<GgufValue, GgufErrorKind> {
    Ok(match ty {
        GgufValueType::U8 => GgufValue::U8(src.u8(what)?),
        GgufValueType::I8 => GgufValue::I8(src.u8(what)? as i8),
        GgufValueType::U16 => GgufValue::U16(src.u16(what)?),
        GgufValueType::I16 => GgufValue::I16(src.u16(what)? as i16),
        GgufValueType::U32 => GgufValue::U32(src.u32(what)?),
        GgufValueType::I32 => GgufValue::I32(src.u32(what)? as i32),
        GgufValueType::F32 => GgufValue::F32(f32::from_bits(src.u32(what)?)),
        GgufValueType::Bool => GgufValue::Bool(src.u8(what)? != 0),
        GgufValueType::String => GgufValue::String(src.string_lossy(what)?),
        GgufValueType::U64 => GgufValue::U64(src.u64(what)?),
        GgufValueType::I64 => GgufValue::I64(src.u64(what)? as i64),
        GgufValueType::F64 => GgufValue::F64(f64::from_bits(src.u64(what)?)),
        // Arrays are handled by the caller; reaching this is a nested array.
        GgufValueType::Array => return Err(GgufErrorKind::NestedArray { key: what() }),
    })
}

fn read_array<R: Read>(src: &mut Source<R>, key: &str) -> Result<GgufArray, GgufErrorKind> {
    let elem_id = src.u32(&|| format!("the array element type of '{key}'"))?;
    let elem = GgufValueType::from_id(elem_id).ok_or_else(|| GgufErrorKind::UnknownValueType {
        key: key.to_owned(),
        type_id: elem_id,
    })?;
    let count = src.u64(&|| format!("the array length of '{key}'"))?;
    let n = src.check_count(count, elem.min_size(), &|| format!("the array length of '{key}'"))?;
    let what = || format!("an element of array '{key}'");
    Ok(match elem {
        GgufValueType::U8 => GgufArray::U8(read_fixed(src, n, &what, |[b]: [u8; 1]| b)?),
        GgufValueType::I8 => GgufArray::I8(read_fixed(src, n, &what, |[b]: [u8; 1]| b as i8)?),
        GgufValueType::Bool => GgufArray::Bool(read_fixed(src, n, &what, |[b]: [u8; 1]| b != 0)?),
        GgufValueType::U16 => GgufArray::U16(read_fixed(src, n, &what, u16::from_le_bytes)?),
        GgufValueType::I16 => GgufArray::I16(read_fixed(src, n, &what, i16::from_le_bytes)?),
        GgufValueType::U32 => GgufArray::U32(read_fixed(src, n, &what, u32::from_le_bytes)?),
        GgufValueType::I32 => GgufArray::I32(read_fixed(src, n, &what, i32::from_le_bytes)?),
        GgufValueType::F32 => GgufArray::F32(read_fixed(src, n, &what, f32::from_le_bytes)?),
        GgufValueType::U64 => GgufArray::U64(read_fixed(src, n, &what, u64::from_le_bytes)?),
        GgufValueType::I64 => GgufArray::I64(read_fixed(src, n, &what, i64::from_le_bytes)?),
        GgufValueType::F64 => GgufArray::F64(read_fixed(src, n, &what, f64::from_le_bytes)?),
        GgufValueType::String => {
            // Each string is bounded individually by the bytes left.
            let mut v = Vec::with_capacity(n.min(1 << 16));
            for _ in 0..n {
                v.push(src.string_lossy(&what)?);
            }
            GgufArray::String(v)
        }
        GgufValueType::Array => return Err(GgufErrorKind::NestedArray { key: key.to_owned() }),
    })
}

/// Reads `n` fixed-size little-endian elements in one go and decodes them.
/// `n` has already been bounded by the bytes left in the file.
fn read_fixed<R: Read, const N: usize, T>(
    src: &mut Source<R>,
    n: usize,
    what: &dyn Fn() -> String,
    decode: impl Fn([u8; N]) -> T,
) -> Result<Vec<T>, GgufErrorKind> {
    let mut buf = vec![0u8; n * N];
    src.fill(&mut buf, what)?;
    Ok(buf
        .chunks_exact(N)
        .map(|c| {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            decode(a)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writer::GgufWriter;
    use std::io::Cursor;

    /// Hand-encodes a minimal GGUF file, so that tests do not depend on the
    /// writer for the malformed cases.
    #[derive(Default)]
    struct Raw {
        buf: Vec<u8>,
    }

    impl Raw {
        fn u32(&mut self, v: u32) -> &mut Self {
            self.buf.extend_from_slice(&v.to_le_bytes());
            self
        }
        fn u64(&mut self, v: u64) -> &mut Self {
            self.buf.extend_from_slice(&v.to_le_bytes());
            self
        }
        fn str(&mut self, s: &[u8]) -> &mut Self {
            self.u64(s.len() as u64);
            self.buf.extend_from_slice(s);
            self
        }
        fn header(&mut self, version: u32, n_tensors: u64, n_kv: u64) -> &mut Self {
            self.buf.extend_from_slice(b"GGUF");
            self.u32(version).u64(n_tensors).u64(n_kv)
        }
        fn kv_u32(&mut self, k: &str, v: u32) -> &mut Self {
            self.str(k.as_bytes()).u32(4).u32(v)
        }
        fn kv_str(&mut self, k: &str, v: &str) -> &mut Self {
            self.str(k.as_bytes()).u32(8).str(v.as_bytes())
        }
        fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
            self.str(name.as_bytes()).u32(dims.len() as u32);
            for &d in dims {
                self.u64(d);
            }
            self.u32(ty).u64(offset)
        }
        fn pad_to(&mut self, align: usize) -> &mut Self {
            while self.buf.len() % align != 0 {
                self.buf.push(0);
            }
            self
        }
        fn zeros(&mut self, n: usize) -> &mut Self {
            self.buf.resize(self.buf.len() + n, 0);
            self
        }
    }

    fn parse_bytes(b: &[u8]) -> Result<GgufFile, GgufError> {
        GgufFile::from_reader(Cursor::new(b), b.len() as u64, "test.gguf")
    }

    fn kind(b: &[u8]) -> GgufErrorKind {
        match parse_bytes(b) {
            Ok(_) => panic!("expected an error"),
            Err(e) => {
                // the message always names the file
                assert!(e.to_string().starts_with("test.gguf: "), "{e}");
                e.into_kind()
            }
        }
    }

    /// A small valid file: two KVs, two tensors (F32 [4], Q8_0 [32, 2]).
    fn small_file() -> Vec<u8> {
        let mut r = Raw::default();
        r.header(3, 2, 3)
            .kv_str("general.architecture", "llama")
            .kv_u32("llama.block_count", 2);
        // array of strings
        r.str(b"tokenizer.ggml.tokens").u32(9).u32(8).u64(2).str(b"a").str(b"b");
        r.tensor("a", &[4], 0, 0).tensor("b", &[32, 2], 8, 32);
        r.pad_to(32).zeros(32 + 68);
        r.buf
    }

    #[test]
    fn parses_a_small_file() {
        let f = parse_bytes(&small_file()).unwrap();
        assert_eq!(f.version(), 3);
        assert_eq!(f.architecture(), Some("llama"));
        assert_eq!(f.get_u64("llama.block_count"), Some(2));
        assert_eq!(f.get_str_array("tokenizer.ggml.tokens").unwrap(), ["a", "b"]);
        assert_eq!(f.get_array_len("tokenizer.ggml.tokens"), Some(2));
        assert_eq!(f.tensors().len(), 2);
        let b = f.tensor("b").unwrap();
        assert_eq!(b.ty, GgmlType::Q8_0);
        assert_eq!(b.nbytes, 68);
        assert_eq!(b.file_offset, f.data_offset() + 32);
        assert_eq!(f.data_offset() % 32, 0);
        assert_eq!(f.tensor_data_bytes(), 16 + 68);
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let full = small_file();
        for cut in 0..full.len() {
            let r = parse_bytes(&full[..cut]);
            assert!(r.is_err(), "truncated at {cut} parsed fine");
        }
    }

    #[test]
    fn every_single_byte_corruption_is_handled() {
        // Flipping any byte must give Ok or Err, never a panic.
        let full = small_file();
        for i in 0..full.len() {
            for v in [0x00, 0xff, 0x7f, 0x80] {
                let mut b = full.clone();
                b[i] = v;
                let _ = parse_bytes(&b);
            }
        }
    }

    #[test]
    fn bad_magic() {
        let mut b = small_file();
        b[0] = b'X';
        assert!(matches!(kind(&b), GgufErrorKind::BadMagic { found } if &found == b"XGUF"));
    }

    #[test]
    fn unsupported_version() {
        for v in [0, 1, 4, 0x0300_0000] {
            let mut r = Raw::default();
            r.header(v, 0, 0);
            assert!(matches!(kind(&r.buf), GgufErrorKind::UnsupportedVersion(x) if x == v));
        }
        let mut r = Raw::default();
        r.header(2, 0, 0);
        assert!(parse_bytes(&r.buf).is_ok());
    }

    #[test]
    fn truncated_header_reports_offset() {
        let mut r = Raw::default();
        r.header(3, 0, 1);
        r.buf.truncate(20);
        match kind(&r.buf) {
            GgufErrorKind::Truncated { offset, file_size, .. } => {
                assert_eq!(offset, 16);
                assert_eq!(file_size, 20);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn absurd_counts_are_rejected_before_allocating() {
        let mut r = Raw::default();
        r.header(3, u64::MAX, 0);
        assert!(matches!(kind(&r.buf), GgufErrorKind::ImplausibleCount { .. }));
        let mut r = Raw::default();
        r.header(3, 0, 1 << 60);
        assert!(matches!(kind(&r.buf), GgufErrorKind::ImplausibleCount { .. }));
        // a string claiming 2^62 bytes
        let mut r = Raw::default();
        r.header(3, 0, 1).u64(1 << 62);
        assert!(matches!(kind(&r.buf), GgufErrorKind::ImplausibleCount { .. }));
        // an array claiming 2^61 u64 elements
        let mut r = Raw::default();
        r.header(3, 0, 1).str(b"k").u32(9).u32(10).u64(1 << 61);
        assert!(matches!(kind(&r.buf), GgufErrorKind::ImplausibleCount { .. }));
        // an array of strings claiming more strings than 8-byte slots left
        let mut r = Raw::default();
        r.header(3, 0, 1).str(b"k").u32(9).u32(8).u64(100).str(b"x");
        assert!(matches!(kind(&r.buf), GgufErrorKind::ImplausibleCount { .. }));
    }

    #[test]
    fn key_errors() {
        let mut r = Raw::default();
        r.header(3, 0, 1).str(b"").u32(4).u32(1);
        assert!(matches!(kind(&r.buf), GgufErrorKind::EmptyKey { index: 0 }));

        let mut r = Raw::default();
        r.header(3, 0, 1).str(&[0xff, 0xfe]).u32(4).u32(1);
        assert!(matches!(kind(&r.buf), GgufErrorKind::InvalidUtf8 { .. }));

        let mut r = Raw::default();
        r.header(3, 0, 2).kv_u32("a", 1).kv_u32("a", 2);
        assert!(matches!(kind(&r.buf), GgufErrorKind::DuplicateKey(k) if k == "a"));

        let mut r = Raw::default();
        r.header(3, 0, 1).str(b"k").u32(13).u32(0);
        assert!(matches!(
            kind(&r.buf),
            GgufErrorKind::UnknownValueType { type_id: 13, .. }
        ));

        let mut r = Raw::default();
        r.header(3, 0, 1).str(b"k").u32(9).u32(9).u64(1).u32(4).u64(0);
        assert!(matches!(kind(&r.buf), GgufErrorKind::NestedArray { .. }));
    }

    #[test]
    fn alignment_key() {
        for bad in [0u32, 3, 48] {
            let mut r = Raw::default();
            r.header(3, 0, 1).kv_u32("general.alignment", bad);
            assert!(matches!(kind(&r.buf), GgufErrorKind::BadAlignment(_)), "{bad}");
        }
        let mut r = Raw::default();
        r.header(3, 1, 1)
            .kv_u32("general.alignment", 64)
            .tensor("t", &[16], 0, 0)
            .pad_to(64)
            .zeros(64);
        let f = parse_bytes(&r.buf).unwrap();
        assert_eq!(f.alignment(), 64);
        assert_eq!(f.data_offset() % 64, 0);
    }

    fn one_tensor(name: &str, dims: &[u64], ty: u32, offset: u64, data: usize) -> Vec<u8> {
        let mut r = Raw::default();
        r.header(3, 1, 0).tensor(name, dims, ty, offset).pad_to(32).zeros(data);
        r.buf
    }

    #[test]
    fn tensor_errors() {
        assert!(matches!(
            kind(&one_tensor("t", &[1, 1, 1, 1, 1], 0, 0, 64)),
            GgufErrorKind::BadRank { n_dims: 5, .. }
        ));
        assert!(matches!(
            kind(&one_tensor("t", &[], 0, 0, 64)),
            GgufErrorKind::BadRank { n_dims: 0, .. }
        ));
        assert!(matches!(
            kind(&one_tensor("t", &[4, 0], 0, 0, 64)),
            GgufErrorKind::BadDim { index: 1, value: 0, .. }
        ));
        assert!(matches!(
            kind(&one_tensor("t", &[u64::MAX], 0, 0, 64)),
            GgufErrorKind::BadDim { .. }
        ));
        assert!(matches!(
            kind(&one_tensor("t", &[4], 4, 0, 64)),
            GgufErrorKind::UnknownGgmlType { type_id: 4, .. }
        ));
        assert!(matches!(
            kind(&one_tensor("t", &[1 << 40, 1 << 40], 0, 0, 64)),
            GgufErrorKind::BadShape { .. }
        ));
        assert!(matches!(
            kind(&one_tensor("t", &[33], 2, 0, 64)),
            GgufErrorKind::BadShape { .. }
        ));
        assert!(matches!(
            kind(&one_tensor("t", &[4], 0, 16, 64)),
            GgufErrorKind::MisalignedOffset { offset: 16, .. }
        ));
        let long = "x".repeat(64);
        assert!(matches!(
            kind(&one_tensor(&long, &[4], 0, 0, 64)),
            GgufErrorKind::TensorNameTooLong { len: 64, .. }
        ));
        let mut r = Raw::default();
        r.header(3, 1, 0)
            .str(&[0xc3, 0x28])
            .u32(1)
            .u64(4)
            .u32(0)
            .u64(0)
            .pad_to(32)
            .zeros(16);
        assert!(matches!(kind(&r.buf), GgufErrorKind::InvalidUtf8 { .. }));

        let mut r = Raw::default();
        r.header(3, 2, 0)
            .tensor("t", &[4], 0, 0)
            .tensor("t", &[4], 0, 32)
            .pad_to(32)
            .zeros(64);
        assert!(matches!(kind(&r.buf), GgufErrorKind::DuplicateTensor(n) if n == "t"));
    }

    #[test]
    fn overlapping_tensors() {
        let mut r = Raw::default();
        r.header(3, 2, 0)
            .tensor("a", &[16], 0, 0)
            .tensor("b", &[4], 0, 32)
            .pad_to(32)
            .zeros(128);
        assert!(matches!(
            kind(&r.buf),
            GgufErrorKind::OverlappingTensors { first, second } if first == "a" && second == "b"
        ));
    }

    #[test]
    fn data_past_the_end_names_the_tensor_and_sizes() {
        let b = one_tensor("blk.3.attn_q.weight", &[32, 4], 8, 0, 100);
        let e = parse_bytes(&b).unwrap_err();
        match e.kind() {
            GgufErrorKind::DataOutOfBounds { tensor, end, file_size } => {
                assert_eq!(tensor, "blk.3.attn_q.weight");
                assert_eq!(*file_size, b.len() as u64);
                assert_eq!(*end, b.len() as u64 - 100 + 136);
            }
            other => panic!("{other:?}"),
        }
        let msg = e.to_string();
        assert!(msg.contains("tensor 'blk.3.attn_q.weight' data ends at byte"), "{msg}");
        assert!(msg.contains("but the file has"), "{msg}");
        // huge offsets saturate instead of overflowing
        let b = one_tensor("t", &[4], 0, u64::MAX - 31, 16);
        assert!(matches!(kind(&b), GgufErrorKind::DataOutOfBounds { .. }));
    }

    #[test]
    fn exact_fit_is_accepted() {
        let b = one_tensor("t", &[32, 4], 8, 0, 136);
        assert!(parse_bytes(&b).is_ok());
    }

    #[test]
    fn writer_round_trip_through_a_real_file() {
        let dir = std::env::temp_dir().join(format!("gguf-reader-rt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rt.gguf");
        let mut w = GgufWriter::new();
        w.add_kv("general.architecture", "llama").unwrap();
        w.add_kv("x.f", GgufValue::F32(1.5)).unwrap();
        w.add_kv("x.i", GgufValue::I32(-3)).unwrap();
        w.add_tensor("t0", GgmlType::F32, &[8]).unwrap();
        w.add_tensor("t1", GgmlType::Q4_0, &[64, 3]).unwrap();
        let mut s = w.create_file(&path).unwrap();
        s.write_tensor_data("t0", &[1u8; 32]).unwrap();
        s.write_tensor_data("t1", &[2u8; 108]).unwrap();
        s.finish().unwrap();

        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.path(), path.as_path());
        assert_eq!(f.get_f32("x.f"), Some(1.5));
        assert_eq!(f.get_u64("x.i"), None);
        assert_eq!(f.get("x.i"), Some(&GgufValue::I32(-3)));
        let t1 = f.tensor("t1").unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let start = t1.file_offset as usize;
        assert!(bytes[start..start + 108].iter().all(|&b| b == 2));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_file_is_an_io_error_with_the_path() {
        let e = GgufFile::open("/nonexistent/dir/x.gguf").unwrap_err();
        assert!(matches!(e.kind(), GgufErrorKind::Io(_)));
        assert!(e.to_string().starts_with("/nonexistent/dir/x.gguf: "));
    }
}
