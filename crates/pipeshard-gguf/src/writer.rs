//! Streaming GGUF writer.
//!
//! A [`GgufWriter`] collects metadata and tensor declarations (name, type,
//! shape). [`GgufWriter::start`] then writes the header, metadata and tensor
//! directory — every offset is known from the declared shapes — and returns
//! a [`TensorDataWriter`] that accepts each tensor's bytes in declaration
//! order, in as many chunks as the caller likes, inserting the alignment
//! padding between tensors. Nothing but the current chunk is held in memory.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use super::error::GgufWriteError;
use super::reader::{DEFAULT_ALIGNMENT, GGUF_MAGIC, KEY_ALIGNMENT, MAX_TENSOR_NAME_LEN};
use super::types::{nbytes, GgmlType};
use super::value::{GgufArray, GgufValue};

/// The GGUF version this writer produces.
pub const GGUF_VERSION: u32 = 3;

/// Capacity of the buffer used by [`GgufWriter::create_file`].
pub const FILE_BUFFER_BYTES: usize = 8 << 20;

/// A tensor declared to a [`GgufWriter`], with its place in the data section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedTensor {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub ty: GgmlType,
    /// Shape, row length first.
    pub dims: Vec<u64>,
    /// Offset relative to the data section (aligned).
    pub offset: u64,
    /// Exact data size in bytes.
    pub nbytes: u64,
}

/// Collects metadata and tensor declarations for a GGUF file.
#[derive(Debug, Clone)]
pub struct GgufWriter {
    alignment: u64,
    metadata: Vec<(String, GgufValue)>,
    keys: HashSet<String>,
    tensors: Vec<PlannedTensor>,
    names: HashSet<String>,
    data_size: u64,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter::new()
    }
}

fn align_up(x: u64, a: u64) -> Option<u64> {
    x.checked_next_multiple_of(a)
}

impl GgufWriter {
    /// A writer with the default alignment of 32 bytes.
    pub fn new() -> GgufWriter {
        GgufWriter {
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            keys: HashSet::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
            data_size: 0,
        }
    }

    /// The data alignment in use.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Adds a metadata entry. Keys must be unique and non-empty. Setting
    /// `general.alignment` (as a power-of-two `u32`) changes the alignment;
    /// it must then be set before any tensor is declared.
    pub fn add_kv(&mut self, key: impl Into<String>, value: impl Into<GgufValue>) -> Result<&mut Self, GgufWriteError> {
        let key = key.into();
        let value = value.into();
        if key.is_empty() {
            return Err(GgufWriteError::EmptyKey);
        }
        if self.keys.contains(&key) {
            return Err(GgufWriteError::DuplicateKey(key));
        }
        if key == KEY_ALIGNMENT {
            let a = match value {
                GgufValue::U32(a) => u64::from(a),
                ref other => return Err(GgufWriteError::BadAlignment(other.as_u64().unwrap_or(0))),
            };
            if a == 0 || !a.is_power_of_two() || !self.tensors.is_empty() {
                return Err(GgufWriteError::BadAlignment(a));
            }
            self.alignment = a;
        }
        self.keys.insert(key.clone());
        self.metadata.push((key, value));
        Ok(self)
    }

    /// Declares the next tensor. Data must later be written in the same
    /// order as the declarations.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        dims: &[u64],
    ) -> Result<&PlannedTensor, GgufWriteError> {
        let name = name.into();
        if name.is_empty() || name.len() > MAX_TENSOR_NAME_LEN {
            return Err(GgufWriteError::BadTensorName(name));
        }
        if self.names.contains(&name) {
            return Err(GgufWriteError::DuplicateTensor(name));
        }
        if dims.contains(&0) {
            return Err(GgufWriteError::ZeroDim {
                tensor: name,
                dims: dims.to_vec(),
            });
        }
        let size = nbytes(ty, dims).map_err(|source| GgufWriteError::BadShape {
            tensor: name.clone(),
            ty,
            dims: dims.to_vec(),
            source,
        })?;
        let overflow = || GgufWriteError::BadShape {
            tensor: name.clone(),
            ty,
            dims: dims.to_vec(),
            source: super::types::SizeError::Overflow,
        };
        let offset = self.data_size;
        let end = offset
            .checked_add(size)
            .and_then(|e| align_up(e, self.alignment))
            .ok_or_else(overflow)?;
        self.data_size = end;
        self.names.insert(name.clone());
        self.tensors.push(PlannedTensor {
            name,
            ty,
            dims: dims.to_vec(),
            offset,
            nbytes: size,
        });
        Ok(&self.tensors[self.tensors.len() - 1])
    }

    /// The declared tensors, with their planned offsets.
    pub fn tensors(&self) -> &[PlannedTensor] {
        &self.tensors
    }

    /// The metadata added so far.
    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }

    /// Bytes taken by the header, metadata and tensor directory, before the
    /// padding that aligns the data section.
    pub fn header_len(&self) -> u64 {
        let mut n = 4 + 4 + 8 + 8;
        for (k, v) in &self.metadata {
            n += 8 + k.len() as u64 + 4 + v.encoded_len();
        }
        for t in &self.tensors {
            n += 8 + t.name.len() as u64 + 4 + 8 * t.dims.len() as u64 + 4 + 8;
        }
        n
    }

    /// Absolute offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.header_len().next_multiple_of(self.alignment)
    }

    /// Size of the finished file, including the padding after every tensor.
    pub fn file_size(&self) -> u64 {
        self.data_offset().saturating_add(self.data_size)
    }

    /// Sum of the declared tensors' exact data sizes.
    pub fn tensor_data_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.nbytes).sum()
    }

    /// Writes the header, metadata and tensor directory to `out`, and returns
    /// the writer for the tensor data.
    pub fn start<W: Write>(self, mut out: W) -> Result<TensorDataWriter<W>, GgufWriteError> {
        let mut h = Vec::with_capacity(self.header_len().min(1 << 26) as usize);
        h.extend_from_slice(&GGUF_MAGIC);
        h.extend_from_slice(&GGUF_VERSION.to_le_bytes());
        h.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut h, k);
            h.extend_from_slice(&v.value_type().id().to_le_bytes());
            encode_value(&mut h, v);
            if h.len() > 1 << 24 {
                out.write_all(&h)?;
                h.clear();
            }
        }
        for t in &self.tensors {
            put_str(&mut h, &t.name);
            h.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                h.extend_from_slice(&d.to_le_bytes());
            }
            h.extend_from_slice(&t.ty.id().to_le_bytes());
            h.extend_from_slice(&t.offset.to_le_bytes());
        }
        let header_len = self.header_len();
        let pad = header_len.next_multiple_of(self.alignment) - header_len;
        h.resize(h.len() + pad as usize, 0);
        out.write_all(&h)?;
        Ok(TensorDataWriter {
            out,
            alignment: self.alignment,
            tensors: self.tensors,
            current: 0,
            written: 0,
        })
    }

    /// Creates (truncating) the file at `path` and starts writing to it
    /// through a large buffer.
    pub fn create_file(self, path: impl AsRef<Path>) -> Result<TensorDataWriter<BufWriter<File>>, GgufWriteError> {
        let file = File::create(path)?;
        self.start(BufWriter::with_capacity(FILE_BUFFER_BYTES, file))
    }
}

fn put_str(h: &mut Vec<u8>, s: &str) {
    h.extend_from_slice(&(s.len() as u64).to_le_bytes());
    h.extend_from_slice(s.as_bytes());
}

/// A value's bytes as GGUF stores them (after its type id): little-endian
/// scalars, length-prefixed strings, typed and counted arrays.
pub fn encode_value(h: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => h.push(*x),
        GgufValue::I8(x) => h.push(*x as u8),
        GgufValue::U16(x) => h.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I16(x) => h.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U32(x) => h.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I32(x) => h.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F32(x) => h.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Bool(x) => h.push(u8::from(*x)),
        GgufValue::String(s) => put_str(h, s),
        GgufValue::U64(x) => h.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I64(x) => h.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F64(x) => h.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Array(a) => put_array(h, a),
    }
}

fn put_array(h: &mut Vec<u8>, a: &GgufArray) {
    h.extend_from_slice(&a.elem_type().id().to_le_bytes());
    h.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! le {
        ($v:expr) => {
            for x in $v {
                h.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        GgufArray::U8(v) => h.extend_from_slice(v),
        GgufArray::I8(v) => h.extend(v.iter().map(|&x| x as u8)),
        GgufArray::Bool(v) => h.extend(v.iter().map(|&x| u8::from(x))),
        GgufArray::U16(v) => le!(v),
        GgufArray::I16(v) => le!(v),
        GgufArray::U32(v) => le!(v),
        GgufArray::I32(v) => le!(v),
        GgufArray::F32(v) => le!(v),
        GgufArray::U64(v) => le!(v),
        GgufArray::I64(v) => le!(v),
        GgufArray::F64(v) => le!(v),
        GgufArray::String(v) => {
            for s in v {
                put_str(h, s);
            }
        }
    }
}

/// Receives tensor data, in declaration order, after the header is written.
#[derive(Debug)]
pub struct TensorDataWriter<W: Write> {
    out: W,
    alignment: u64,
    tensors: Vec<PlannedTensor>,
    current: usize,
    written: u64,
}

const ZEROS: [u8; 256] = [0; 256];

impl<W: Write> TensorDataWriter<W> {
    /// The tensor whose data is expected next, if any remain.
    pub fn next_tensor(&self) -> Option<&PlannedTensor> {
        self.tensors.get(self.current)
    }

    /// All tensors, in order.
    pub fn tensors(&self) -> &[PlannedTensor] {
        &self.tensors
    }

    /// Bytes of the current tensor already received.
    pub fn written_in_current(&self) -> u64 {
        self.written
    }

    /// Writes the complete data of tensor `name`, which must be the next
    /// declared tensor with nothing written for it yet, and `bytes` must be
    /// exactly its size.
    pub fn write_tensor_data(&mut self, name: &str, bytes: &[u8]) -> Result<(), GgufWriteError> {
        let t = self.tensors.get(self.current).ok_or(GgufWriteError::NoMoreTensors)?;
        if t.name != name {
            return Err(GgufWriteError::OutOfOrder {
                expected: t.name.clone(),
                got: name.to_owned(),
            });
        }
        if self.written != 0 || bytes.len() as u64 != t.nbytes {
            return Err(GgufWriteError::SizeMismatch {
                tensor: t.name.clone(),
                expected: t.nbytes,
                got: self.written + bytes.len() as u64,
            });
        }
        self.write_chunk(bytes)
    }

    /// Appends `bytes` to the current tensor. When the tensor is complete,
    /// its padding is written and the next tensor becomes current. A chunk
    /// must not extend past the end of the current tensor.
    pub fn write_chunk(&mut self, bytes: &[u8]) -> Result<(), GgufWriteError> {
        let t = self.tensors.get(self.current).ok_or(GgufWriteError::NoMoreTensors)?;
        let total = self.written + bytes.len() as u64;
        if total > t.nbytes {
            return Err(GgufWriteError::SizeMismatch {
                tensor: t.name.clone(),
                expected: t.nbytes,
                got: total,
            });
        }
        self.out.write_all(bytes)?;
        self.written = total;
        if total == t.nbytes {
            let mut pad = t.nbytes.next_multiple_of(self.alignment) - t.nbytes;
            while pad > 0 {
                let n = pad.min(ZEROS.len() as u64);
                self.out.write_all(&ZEROS[..n as usize])?;
                pad -= n;
            }
            self.current += 1;
            self.written = 0;
        }
        Ok(())
    }

    /// An [`io::Write`] sink for the current tensor's bytes (errors are
    /// reported as `io::Error`s wrapping the [`GgufWriteError`]).
    pub fn sink(&mut self) -> TensorSink<'_, W> {
        TensorSink { w: self }
    }

    /// Flushes the output and returns it; fails if a tensor is missing data.
    pub fn finish(mut self) -> Result<W, GgufWriteError> {
        if let Some(t) = self.tensors.get(self.current) {
            return Err(GgufWriteError::Incomplete {
                tensor: t.name.clone(),
                remaining: self.tensors.len() - self.current - 1,
            });
        }
        self.out.flush()?;
        Ok(self.out)
    }
}

/// [`io::Write`] adapter over [`TensorDataWriter::write_chunk`].
#[derive(Debug)]
pub struct TensorSink<'a, W: Write> {
    w: &'a mut TensorDataWriter<W>,
}

impl<W: Write> Write for TensorSink<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.w.write_chunk(buf).map_err(io::Error::other)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.w.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reader::GgufFile;
    use std::io::Cursor;

    fn sample() -> GgufWriter {
        let mut w = GgufWriter::new();
        w.add_kv("general.architecture", "llama").unwrap();
        w.add_kv("llama.block_count", 2u32).unwrap();
        w.add_kv("f", 0.25f32).unwrap();
        w.add_kv("b", true).unwrap();
        w.add_kv("u64", GgufValue::U64(1 << 40)).unwrap();
        w.add_kv("i8", GgufValue::I8(-5)).unwrap();
        w.add_kv("f64", GgufValue::F64(2.5)).unwrap();
        w.add_kv("toks", GgufArray::String(vec!["a".into(), "é".into(), String::new()]))
            .unwrap();
        w.add_kv("types", GgufArray::I32(vec![1, 3, 6])).unwrap();
        w.add_kv("flags", GgufArray::Bool(vec![true, false])).unwrap();
        w.add_kv("e", GgufArray::U64(vec![])).unwrap();
        w.add_tensor("token_embd.weight", GgmlType::Q4_0, &[64, 10]).unwrap();
        w.add_tensor("norm", GgmlType::F32, &[5]).unwrap();
        w.add_tensor("blk.0.ffn_up_exps.weight", GgmlType::Q4_K, &[256, 3, 2])
            .unwrap();
        w
    }

    fn write_sample() -> (Vec<u8>, Vec<PlannedTensor>) {
        let w = sample();
        let expected_size = w.file_size();
        let mut s = w.start(Cursor::new(Vec::new())).unwrap();
        let tensors = s.tensors().to_vec();
        s.write_tensor_data("token_embd.weight", &[7u8; 2 * 18 * 10]).unwrap();
        // chunked, through the io::Write sink
        s.sink().write_all(&[1u8; 8]).unwrap();
        s.sink().write_all(&[2u8; 12]).unwrap();
        let big = vec![3u8; 144 * 6];
        for c in big.chunks(100) {
            s.write_chunk(c).unwrap();
        }
        assert!(s.next_tensor().is_none());
        let out = s.finish().unwrap().into_inner();
        assert_eq!(out.len() as u64, expected_size);
        (out, tensors)
    }

    #[test]
    fn round_trip_metadata_and_layout() {
        let (bytes, planned) = write_sample();
        let f = GgufFile::from_reader(Cursor::new(&bytes), bytes.len() as u64, "mem").unwrap();
        assert_eq!(f.version(), GGUF_VERSION);
        assert_eq!(f.architecture(), Some("llama"));
        assert_eq!(f.get_u64("llama.block_count"), Some(2));
        assert_eq!(f.get_f32("f"), Some(0.25));
        assert_eq!(f.get_bool("b"), Some(true));
        assert_eq!(f.get_u64("u64"), Some(1 << 40));
        assert_eq!(f.get("i8"), Some(&GgufValue::I8(-5)));
        assert_eq!(f.get_f32("f64"), Some(2.5));
        assert_eq!(f.get_str_array("toks").unwrap(), ["a", "é", ""]);
        assert_eq!(f.get_array("types"), Some(&GgufArray::I32(vec![1, 3, 6])));
        assert_eq!(f.get_array("flags"), Some(&GgufArray::Bool(vec![true, false])));
        assert_eq!(f.get_array_len("e"), Some(0));
        assert_eq!(f.tensors().len(), 3);
        for (t, p) in f.tensors().iter().zip(&planned) {
            assert_eq!(t.name, p.name);
            assert_eq!(t.ty, p.ty);
            assert_eq!(t.dims, p.dims);
            assert_eq!(t.offset, p.offset);
            assert_eq!(t.nbytes, p.nbytes);
            assert_eq!(t.offset % 32, 0);
        }
        // data lands where the directory says
        let norm = f.tensor("norm").unwrap();
        let s = norm.file_offset as usize;
        assert_eq!(&bytes[s..s + 8], &[1u8; 8]);
        assert_eq!(&bytes[s + 8..s + 20], &[2u8; 12]);
        let e = f.tensor("blk.0.ffn_up_exps.weight").unwrap();
        assert_eq!(e.dims, vec![256, 3, 2]);
        assert!(bytes[e.file_offset as usize..][..864].iter().all(|&b| b == 3));
        // padding is zeros
        assert!(bytes[s + 20..s + 32].iter().all(|&b| b == 0));
    }

    #[test]
    fn custom_alignment() {
        let mut w = GgufWriter::new();
        w.add_kv("general.alignment", 64u32).unwrap();
        w.add_tensor("a", GgmlType::F32, &[3]).unwrap();
        w.add_tensor("b", GgmlType::F32, &[3]).unwrap();
        assert_eq!(w.tensors()[1].offset, 64);
        let mut s = w.start(Cursor::new(Vec::new())).unwrap();
        s.write_tensor_data("a", &[0; 12]).unwrap();
        s.write_tensor_data("b", &[0; 12]).unwrap();
        let out = s.finish().unwrap().into_inner();
        let f = GgufFile::from_reader(Cursor::new(&out), out.len() as u64, "mem").unwrap();
        assert_eq!(f.alignment(), 64);
        assert_eq!(f.data_offset() % 64, 0);
    }

    #[test]
    fn declaration_errors() {
        let mut w = GgufWriter::new();
        w.add_kv("k", 1u32).unwrap();
        assert!(matches!(w.add_kv("k", 2u32), Err(GgufWriteError::DuplicateKey(_))));
        assert!(matches!(w.add_kv("", 2u32), Err(GgufWriteError::EmptyKey)));
        assert!(matches!(
            w.add_kv("general.alignment", 48u32),
            Err(GgufWriteError::BadAlignment(48))
        ));
        w.add_tensor("t", GgmlType::F32, &[1]).unwrap();
        assert!(matches!(
            w.add_tensor("t", GgmlType::F32, &[1]),
            Err(GgufWriteError::DuplicateTensor(_))
        ));
        assert!(matches!(
            w.add_tensor("x".repeat(64), GgmlType::F32, &[1]),
            Err(GgufWriteError::BadTensorName(_))
        ));
        assert!(matches!(
            w.add_tensor("q", GgmlType::Q4_0, &[33]),
            Err(GgufWriteError::BadShape { .. })
        ));
        assert!(matches!(
            w.add_tensor("z", GgmlType::F32, &[4, 0]),
            Err(GgufWriteError::ZeroDim { .. })
        ));
        assert!(matches!(
            w.add_tensor("o", GgmlType::F32, &[1 << 62, 1 << 62]),
            Err(GgufWriteError::BadShape { .. })
        ));
        assert!(matches!(
            w.add_kv("general.alignment", 64u32),
            Err(GgufWriteError::BadAlignment(64))
        ));
    }

    #[test]
    fn data_errors() {
        let mut w = GgufWriter::new();
        w.add_tensor("a", GgmlType::F32, &[2]).unwrap();
        w.add_tensor("b", GgmlType::F32, &[2]).unwrap();
        let mut s = w.start(Cursor::new(Vec::new())).unwrap();
        assert!(matches!(
            s.write_tensor_data("b", &[0; 8]),
            Err(GgufWriteError::OutOfOrder { .. })
        ));
        assert!(matches!(
            s.write_tensor_data("a", &[0; 7]),
            Err(GgufWriteError::SizeMismatch {
                expected: 8,
                got: 7,
                ..
            })
        ));
        assert!(matches!(
            s.write_chunk(&[0; 9]),
            Err(GgufWriteError::SizeMismatch { .. })
        ));
        s.write_chunk(&[0; 4]).unwrap();
        assert!(matches!(
            s.write_tensor_data("a", &[0; 8]),
            Err(GgufWriteError::SizeMismatch { .. })
        ));
        s.write_chunk(&[0; 4]).unwrap();
        assert!(matches!(
            s.finish(),
            Err(GgufWriteError::Incomplete { remaining: 0, .. })
        ));

        let mut w = GgufWriter::new();
        w.add_tensor("a", GgmlType::F32, &[1]).unwrap();
        let mut s = w.start(Cursor::new(Vec::new())).unwrap();
        s.write_tensor_data("a", &[0; 4]).unwrap();
        assert!(matches!(s.write_chunk(&[0]), Err(GgufWriteError::NoMoreTensors)));
    }

    #[test]
    fn header_len_matches_what_is_written() {
        let w = sample();
        let len = w.header_len();
        let data_offset = w.data_offset();
        let mut s = w.start(Cursor::new(Vec::new())).unwrap();
        let written = s.sink().w.out.get_ref().len() as u64;
        assert_eq!(written, data_offset);
        assert!(len <= data_offset && data_offset - len < 32);
    }
}
