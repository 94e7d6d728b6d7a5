//! Structure-aware mutation of GGUF files.
//!
//! A valid file is taken apart into its header, metadata and tensor
//! directory ([`RawGguf`]); mutations change those structures (values set to
//! boundary values or to the wrong type, keys deleted or duplicated, tensor
//! shapes, types, offsets and names changed, vocabulary entries duplicated
//! or arrays cut short), and the result is serialized again without any of
//! the writer's checks, so that it can say anything a hostile file can.
//! Byte-level mutations of the serialized header cover what the structure
//! cannot express (unknown type tags, broken lengths).

use std::path::Path;

use crate::gguf::{GgmlType, GgufArray, GgufFile, GgufValue, DEFAULT_ALIGNMENT};

/// A small deterministic generator (splitmix64): the same seed gives the
/// same cases on every machine.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The generator of case `index` of a run with `seed`.
    pub fn for_case(seed: u64, index: u64) -> Rng {
        let mut r = Rng(seed ^ index.wrapping_mul(0xA076_1D64_78BD_642F));
        r.next_u64();
        r
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// True with probability `1 / n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    /// A random element of `items` (non-empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// One tensor directory entry, as raw as the file holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct RawTensor {
    /// Name bytes.
    pub name: Vec<u8>,
    /// Dimensions (any count, any value).
    pub dims: Vec<u64>,
    /// ggml type id (any value).
    pub ty: u32,
    /// Offset relative to the data section.
    pub offset: u64,
}

/// A GGUF file taken apart, to be mutated and serialized again.
#[derive(Debug, Clone)]
pub struct RawGguf {
    /// Format version.
    pub version: u32,
    /// Overrides the tensor count in the header.
    pub n_tensors: Option<u64>,
    /// Overrides the metadata count in the header.
    pub n_kv: Option<u64>,
    /// Metadata, in file order (keys may repeat).
    pub kv: Vec<(Vec<u8>, GgufValue)>,
    /// The tensor directory, in file order.
    pub tensors: Vec<RawTensor>,
    /// The data section, copied from the original file.
    pub data: std::sync::Arc<Vec<u8>>,
}

impl RawGguf {
    /// Reads a valid GGUF file.
    pub fn open(path: &Path) -> Result<RawGguf, crate::gguf::GgufError> {
        let f = GgufFile::open(path)?;
        let bytes = std::fs::read(path).map_err(|e| crate::gguf::GgufError::new(path, e.into()))?;
        let data = bytes[(f.data_offset() as usize).min(bytes.len())..].to_vec();
        Ok(RawGguf {
            version: f.version(),
            n_tensors: None,
            n_kv: None,
            kv: f
                .metadata()
                .iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v.clone()))
                .collect(),
            tensors: f
                .tensors()
                .iter()
                .map(|t| RawTensor {
                    name: t.name.as_bytes().to_vec(),
                    dims: t.dims.clone(),
                    ty: t.ty.id(),
                    offset: t.offset,
                })
                .collect(),
            data: std::sync::Arc::new(data),
        })
    }

    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.kv.iter().find(|(k, _)| k == key.as_bytes()).map(|(_, v)| v)
    }

    /// Sets `key` (the first occurrence), or appends it.
    pub fn set(&mut self, key: &str, v: GgufValue) {
        match self.kv.iter_mut().find(|(k, _)| k == key.as_bytes()) {
            Some(e) => e.1 = v,
            None => self.kv.push((key.as_bytes().to_vec(), v)),
        }
    }

    /// `general.architecture`, or `"llama"`.
    pub fn arch(&self) -> String {
        self.get("general.architecture")
            .and_then(GgufValue::as_str)
            .unwrap_or("llama")
            .to_owned()
    }

    /// The alignment llama.cpp would use: `general.alignment` if it is a
    /// power-of-two u32, else 32.
    fn alignment(&self) -> u64 {
        match self.get("general.alignment") {
            Some(GgufValue::U32(a)) if a.is_power_of_two() => u64::from(*a),
            _ => DEFAULT_ALIGNMENT,
        }
    }

    /// The serialized header, metadata and tensor directory (padded to the
    /// alignment); the data section follows it.
    pub fn header_bytes(&self) -> Vec<u8> {
        let mut h = Vec::new();
        h.extend_from_slice(b"GGUF");
        h.extend_from_slice(&self.version.to_le_bytes());
        h.extend_from_slice(&self.n_tensors.unwrap_or(self.tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&self.n_kv.unwrap_or(self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            put_bytes(&mut h, k);
            put_value(&mut h, v);
        }
        for t in &self.tensors {
            put_bytes(&mut h, &t.name);
            h.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                h.extend_from_slice(&d.to_le_bytes());
            }
            h.extend_from_slice(&t.ty.to_le_bytes());
            h.extend_from_slice(&t.offset.to_le_bytes());
        }
        let a = self.alignment() as usize;
        h.resize(h.len().next_multiple_of(a), 0);
        h
    }
}

fn put_bytes(h: &mut Vec<u8>, s: &[u8]) {
    h.extend_from_slice(&(s.len() as u64).to_le_bytes());
    h.extend_from_slice(s);
}

/// A key's value as a GGUF file stores it: its type id, then the value.
fn put_value(h: &mut Vec<u8>, v: &GgufValue) {
    h.extend_from_slice(&v.value_type().id().to_le_bytes());
    crate::gguf::encode_value(h, v);
}

/// Hyper-parameters (`{arch}.` suffixes) that llama.cpp reads.
pub const HPARAM_KEYS: &[&str] = &[
    "block_count",
    "context_length",
    "embedding_length",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.key_length_swa",
    "attention.value_length_swa",
    "attention.sliding_window",
    "attention.layer_norm_rms_epsilon",
    "rope.dimension_count",
    "rope.dimension_count_swa",
    "rope.dimension_sections",
    "rope.freq_base",
    "rope.scaling.type",
    "rope.scaling.factor",
    "rope.scaling.original_context_length",
    "expert_count",
    "expert_used_count",
    "expert_shared_count",
    "expert_feed_forward_length",
    "expert_group_count",
    "expert_group_used_count",
    "expert_gating_func",
    "expert_weights_scale",
    "expert_weights_norm",
    "leading_dense_block_count",
    "nextn_predict_layers",
    "vocab_size",
    "pooling_type",
    "attention.causal",
    "attention.sliding_window_pattern",
];

/// Vocabulary keys.
const TOKENIZER_IDS: &[&str] = &[
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.seperator_token_id",
    "tokenizer.ggml.mask_token_id",
    "tokenizer.ggml.fim_pre_token_id",
];

/// Architectures a file may claim to be (real ones, close relatives of the
/// seeds, and nonsense).
const ARCHES: &[&str] = &[
    "llama",
    "qwen2",
    "qwen3",
    "qwen3moe",
    "qwen2moe",
    "qwen2vl",
    "mistral3",
    "gemma3",
    "phi3",
    "deepseek2",
    "granite",
    "olmoe",
    "bert",
    "t5",
    "mamba",
    "rwkv6",
    "clip",
    "gpt2",
    "starcoder2",
    "falcon",
    "nope",
    "",
];

const TOKENIZER_MODELS: &[&str] = &[
    "llama", "gpt2", "bert", "t5", "rwkv", "plamo2", "none", "no_vocab", "ugm", "wat",
];

/// Integers at the edges of what llama.cpp and ggml handle.
fn boundary(rng: &mut Rng, current: Option<u64>) -> u64 {
    let c = current.unwrap_or(4);
    *rng.pick(&[
        0,
        1,
        2,
        3,
        c.saturating_sub(1),
        c + 1,
        c * 2,
        c / 2,
        c * 3,
        511,
        512,
        513,
        1023,
        1024,
        1025,
        65535,
        65536,
        (1 << 31) - 1,
        1 << 31,
        u64::from(u32::MAX),
        u64::MAX,
    ])
}

/// A value of a random type, for type confusion.
fn any_value(rng: &mut Rng, n: u64) -> GgufValue {
    match rng.below(12) {
        0 => GgufValue::U8(n as u8),
        1 => GgufValue::I8(-(n as i8).wrapping_abs()),
        2 => GgufValue::U16(n as u16),
        3 => GgufValue::I32(-(n as i32).wrapping_abs() - 1),
        4 => GgufValue::U64(n),
        5 => GgufValue::I64(n as i64),
        6 => GgufValue::F32(*rng.pick(&[0.0, -1.0, f32::NAN, f32::INFINITY, 1e30, n as f32])),
        7 => GgufValue::F64(n as f64),
        8 => GgufValue::Bool(n & 1 == 1),
        9 => GgufValue::String(rng.pick(&["", "none", "yarn", "x", "\u{0}"]).to_string()),
        10 => GgufValue::Array(GgufArray::U32(vec![n as u32; rng.below(6)])),
        _ => GgufValue::U32(n as u32),
    }
}

/// Sets a hyper-parameter to a boundary value, usually as the type
/// llama.cpp reads, sometimes as a per-layer array or another type.
fn mutate_hparam(raw: &mut RawGguf, rng: &mut Rng) -> String {
    let arch = raw.arch();
    let key = format!("{arch}.{}", rng.pick(HPARAM_KEYS));
    let current = raw.get(&key).and_then(GgufValue::as_u64);
    let n_layer = raw
        .get(&format!("{arch}.block_count"))
        .and_then(GgufValue::as_u64)
        .unwrap_or(4)
        .min(1024) as usize;
    let v = boundary(rng, current);
    let value = match rng.below(10) {
        0..=5 => GgufValue::U32(v as u32),
        6 => {
            // a per-layer array, sometimes of the wrong length
            let len = match rng.below(4) {
                0 => n_layer + 1,
                1 => n_layer.saturating_sub(1),
                _ => n_layer,
            };
            let c = current.unwrap_or(v) as u32;
            let mut a: Vec<u32> = vec![c; len];
            if rng.one_in(2) {
                // layers that differ (llama.cpp's graphs may size every
                // layer by layer 0's value)
                let choices = [c, v as u32, 0, 1, c.saturating_mul(2), c / 2];
                a.iter_mut().for_each(|x| *x = *rng.pick(&choices));
            } else if let Some(x) = a.get_mut(rng.below(len.max(1))) {
                *x = v as u32;
            }
            GgufValue::Array(if rng.one_in(2) {
                GgufArray::U32(a)
            } else {
                GgufArray::I32(a.into_iter().map(|x| x as i32).collect())
            })
        }
        7 => GgufValue::F32(*rng.pick(&[0.0, -1.0, f32::NAN, f32::INFINITY, -f32::INFINITY, 1e-30, 1e30])),
        _ => any_value(rng, v),
    };
    let desc = format!("{key} = {value:?}");
    raw.set(&key, value);
    desc
}

/// Changes the type of an existing value, deletes or duplicates a key.
fn mutate_kv(raw: &mut RawGguf, rng: &mut Rng) -> String {
    if raw.kv.is_empty() {
        return "no metadata".into();
    }
    let i = rng.below(raw.kv.len());
    let key = String::from_utf8_lossy(&raw.kv[i].0).into_owned();
    match rng.below(6) {
        0 => {
            raw.kv.remove(i);
            format!("removed {key}")
        }
        1 => {
            let e = raw.kv[i].clone();
            raw.kv.push(e);
            format!("duplicated {key}")
        }
        2 => {
            // an array of the same values with another element type, or a
            // scalar in place of the array
            let v = match &raw.kv[i].1 {
                GgufValue::Array(a) => match rng.below(3) {
                    0 => GgufValue::Array(GgufArray::U8(vec![1; a.len()])),
                    1 => GgufValue::Array(GgufArray::F32(vec![1.0; a.len()])),
                    _ => GgufValue::U32(a.len() as u32),
                },
                GgufValue::String(s) => GgufValue::Array(GgufArray::String(vec![s.clone(); 2])),
                other => GgufValue::Array(GgufArray::U32(vec![other.as_u64().unwrap_or(1) as u32; 3])),
            };
            let desc = format!("{key} retyped to {}", v.value_type());
            raw.kv[i].1 = v;
            desc
        }
        _ => {
            let n = raw.kv[i].1.as_u64();
            let b = boundary(rng, n);
            let v = any_value(rng, b);
            let desc = format!("{key} = {v:?}");
            raw.kv[i].1 = v;
            desc
        }
    }
}

/// Strings llama.cpp dispatches on: the architecture, the tokenizer model,
/// the RoPE scaling type, the pre-tokenizer.
fn mutate_strings(raw: &mut RawGguf, rng: &mut Rng) -> String {
    let arch = raw.arch();
    let (key, v) = match rng.below(4) {
        0 => ("general.architecture".to_string(), rng.pick(ARCHES).to_string()),
        1 => (
            "tokenizer.ggml.model".to_string(),
            rng.pick(TOKENIZER_MODELS).to_string(),
        ),
        2 => (
            format!("{arch}.rope.scaling.type"),
            rng.pick(&["none", "linear", "yarn", "longrope", "LINEAR", ""])
                .to_string(),
        ),
        _ => (
            "tokenizer.ggml.pre".to_string(),
            rng.pick(&[
                "default", "llama3", "qwen2", "gpt-4o", "tekken", "smollm", "kimi-k2", "?",
            ])
            .to_string(),
        ),
    };
    if key == "general.architecture" && rng.one_in(2) {
        // keep the hyper-parameters under the new name
        let old = format!("{arch}.");
        for (k, _) in raw.kv.iter_mut() {
            if k.starts_with(old.as_bytes()) {
                let rest = k[old.len()..].to_vec();
                *k = [format!("{v}.").into_bytes(), rest].concat();
            }
        }
    }
    let desc = format!("{key} = {v:?}");
    raw.set(&key, GgufValue::String(v));
    desc
}

/// The vocabulary: duplicate or empty entries, arrays of the wrong length
/// or type, token types and special ids out of range, broken merges.
fn mutate_vocab(raw: &mut RawGguf, rng: &mut Rng) -> String {
    let n = match raw.get("tokenizer.ggml.tokens") {
        Some(GgufValue::Array(a)) => a.len(),
        _ => 0,
    };
    let find = |raw: &mut RawGguf, key: &str| raw.kv.iter().position(|(k, _)| k == key.as_bytes());
    match rng.below(8) {
        0 | 1 if n > 1 => {
            let (i, j) = (rng.below(n), rng.below(n));
            if let Some(p) = find(raw, "tokenizer.ggml.tokens") {
                if let GgufValue::Array(GgufArray::String(v)) = &mut raw.kv[p].1 {
                    v[j] = if rng.one_in(4) { String::new() } else { v[i].clone() };
                }
            }
            format!("token {j} = token {i} (or empty)")
        }
        2 => {
            let key = *rng.pick(&[
                "tokenizer.ggml.tokens",
                "tokenizer.ggml.scores",
                "tokenizer.ggml.token_type",
                "tokenizer.ggml.merges",
            ]);
            let cut = rng.below(n.max(1) + 1);
            if let Some(p) = find(raw, key) {
                if let GgufValue::Array(a) = &mut raw.kv[p].1 {
                    truncate(a, cut);
                }
            }
            format!("{key} cut to {cut} entries")
        }
        3 => {
            if let Some(p) = find(raw, "tokenizer.ggml.token_type") {
                if let GgufValue::Array(GgufArray::I32(v)) = &mut raw.kv[p].1 {
                    if !v.is_empty() {
                        let i = rng.below(v.len());
                        v[i] = *rng.pick(&[-1, 0, 6, 7, 100, i32::MAX, i32::MIN]);
                    }
                }
            }
            "token_type out of range".into()
        }
        4 | 5 => {
            let key = *rng.pick(TOKENIZER_IDS);
            let v = match rng.below(4) {
                0 => GgufValue::U32(n as u32),
                1 => GgufValue::U32(u32::MAX),
                2 => GgufValue::U32(n.saturating_sub(1) as u32),
                _ => GgufValue::I32(-1),
            };
            let desc = format!("{key} = {v:?}");
            raw.set(key, v);
            desc
        }
        6 => {
            if let Some(p) = find(raw, "tokenizer.ggml.merges") {
                if let GgufValue::Array(GgufArray::String(v)) = &mut raw.kv[p].1 {
                    if !v.is_empty() {
                        let i = rng.below(v.len());
                        v[i] = rng.pick(&["", " ", "a", "a b c", "\u{fffd} \u{fffd}"]).to_string();
                    }
                }
            }
            "a broken merge".into()
        }
        _ => {
            if let Some(p) = find(raw, "tokenizer.ggml.tokens") {
                if let GgufValue::Array(GgufArray::String(v)) = &mut raw.kv[p].1 {
                    v.push(format!("extra{}", rng.below(1000)));
                }
            }
            "one more token".into()
        }
    }
}

fn truncate(a: &mut GgufArray, n: usize) {
    match a {
        GgufArray::U8(v) => v.truncate(n),
        GgufArray::I8(v) => v.truncate(n),
        GgufArray::U16(v) => v.truncate(n),
        GgufArray::I16(v) => v.truncate(n),
        GgufArray::U32(v) => v.truncate(n),
        GgufArray::I32(v) => v.truncate(n),
        GgufArray::F32(v) => v.truncate(n),
        GgufArray::Bool(v) => v.truncate(n),
        GgufArray::String(v) => v.truncate(n),
        GgufArray::U64(v) => v.truncate(n),
        GgufArray::I64(v) => v.truncate(n),
        GgufArray::F64(v) => v.truncate(n),
    }
}

/// A tensor's dimensions, type, offset or name; tensors removed or repeated.
fn mutate_tensor(raw: &mut RawGguf, rng: &mut Rng) -> String {
    if raw.tensors.is_empty() {
        return "no tensors".into();
    }
    let i = rng.below(raw.tensors.len());
    let name = String::from_utf8_lossy(&raw.tensors[i].name).into_owned();
    let t = &mut raw.tensors[i];
    match rng.below(9) {
        0 | 1 => {
            let d = rng.below(t.dims.len().max(1)).min(t.dims.len().saturating_sub(1));
            let old = t.dims[d];
            t.dims[d] = *rng.pick(&[
                1,
                2,
                32,
                old / 2,
                old * 2,
                old + 32,
                old.saturating_sub(32),
                1 << 31,
                1 << 40,
            ]);
            format!("{name} dim {d} = {}", t.dims[d])
        }
        2 => {
            if t.dims.len() > 1 && rng.one_in(2) {
                t.dims.pop();
            } else {
                t.dims.push(*rng.pick(&[1, 2, 4]));
            }
            format!("{name} dims = {:?}", t.dims)
        }
        3 => {
            let types = [
                GgmlType::F32,
                GgmlType::F16,
                GgmlType::Q4_0,
                GgmlType::Q4_1,
                GgmlType::Q8_0,
                GgmlType::Q4_K,
                GgmlType::Q6_K,
                GgmlType::BF16,
            ];
            t.ty = if rng.one_in(8) {
                *rng.pick(&[4, 5, 40, 1000, u32::MAX])
            } else {
                rng.pick(&types).id()
            };
            format!("{name} type = {}", t.ty)
        }
        4 => {
            t.offset = *rng.pick(&[
                0,
                t.offset + 32,
                t.offset.saturating_sub(32),
                t.offset + 1,
                u64::MAX - 31,
                1 << 40,
            ]);
            format!("{name} offset = {}", t.offset)
        }
        5 => {
            let new = match rng.below(4) {
                0 => name.replacen("blk.", "blk.9", 1),
                1 => name.replace(".weight", ".bias"),
                2 => format!("{name}x"),
                _ => String::from_utf8_lossy(&raw.tensors[rng.below(raw.tensors.len())].name).into_owned(),
            };
            raw.tensors[i].name = new.clone().into_bytes();
            format!("{name} renamed {new}")
        }
        6 => {
            raw.tensors.remove(i);
            format!("removed {name}")
        }
        7 => {
            let e = raw.tensors[i].clone();
            raw.tensors.push(e);
            format!("{name} listed twice")
        }
        _ => {
            // another tensor's shape (same data size or not)
            let j = rng.below(raw.tensors.len());
            raw.tensors[i].dims = raw.tensors[j].dims.clone();
            format!("{name} has the shape of tensor #{j}")
        }
    }
}

/// The header's version and counts.
fn mutate_header(raw: &mut RawGguf, rng: &mut Rng) -> String {
    match rng.below(3) {
        0 => {
            raw.version = *rng.pick(&[0, 1, 2, 4, u32::MAX]);
            format!("version = {}", raw.version)
        }
        1 => {
            let n = raw.tensors.len() as u64;
            raw.n_tensors = Some(*rng.pick(&[0, n.saturating_sub(1), n + 1, u64::MAX, 1 << 40]));
            format!("tensor count = {:?}", raw.n_tensors)
        }
        _ => {
            let n = raw.kv.len() as u64;
            raw.n_kv = Some(*rng.pick(&[0, n.saturating_sub(1), n + 1, u64::MAX, 1 << 40]));
            format!("kv count = {:?}", raw.n_kv)
        }
    }
}

/// One mutated case: the file's bytes and what was done to it.
#[derive(Debug, Clone)]
pub struct Case {
    /// Header, metadata and directory (the data section follows).
    pub header: Vec<u8>,
    /// The data section.
    pub data: std::sync::Arc<Vec<u8>>,
    /// The mutations, in order.
    pub mutations: Vec<String>,
}

impl Case {
    /// Writes the file.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
        f.write_all(&self.header)?;
        f.write_all(&self.data)?;
        f.flush()
    }
}

/// Applies one to three (mostly one) structure-aware mutations to a copy of `base`, and
/// sometimes flips bytes of the serialized header.
pub fn mutate(base: &RawGguf, rng: &mut Rng) -> Case {
    let mut raw = base.clone();
    let mut mutations = Vec::new();
    // mostly one mutation, so that more cases get past pipeshard's checks
    // and reach llama.cpp
    let n = match rng.below(10) {
        0..=5 => 1,
        6..=8 => 2,
        _ => 3,
    };
    for _ in 0..n {
        let m = match rng.below(20) {
            0..=6 => mutate_hparam(&mut raw, rng),
            7..=9 => mutate_kv(&mut raw, rng),
            10..=11 => mutate_strings(&mut raw, rng),
            12..=14 => mutate_vocab(&mut raw, rng),
            15..=18 => mutate_tensor(&mut raw, rng),
            _ => mutate_header(&mut raw, rng),
        };
        mutations.push(m);
    }
    let mut header = raw.header_bytes();
    if rng.one_in(10) && header.len() > 24 {
        for _ in 0..1 + rng.below(8) {
            let i = 4 + rng.below(header.len() - 4);
            header[i] = *rng.pick(&[0x00, 0xff, 0x7f, 0x80, 0x01]) ^ if rng.one_in(2) { 0 } else { header[i] };
            mutations.push(format!("byte {i} = {:#04x}", header[i]));
        }
    }
    Case {
        header,
        data: raw.data.clone(),
        mutations,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::writer::GgufWriter;

    fn base() -> (tempdir::Dir, RawGguf) {
        let dir = tempdir::Dir::new("mutate");
        let path = dir.0.join("b.gguf");
        let mut w = GgufWriter::new();
        w.add_kv("general.architecture", "llama").unwrap();
        w.add_kv("llama.block_count", 1u32).unwrap();
        w.add_kv("tokenizer.ggml.tokens", GgufArray::String(vec!["a".into(), "b".into()]))
            .unwrap();
        w.add_kv("tokenizer.ggml.token_type", GgufArray::I32(vec![1, 1]))
            .unwrap();
        w.add_tensor("blk.0.attn_norm.weight", GgmlType::F32, &[8]).unwrap();
        w.add_tensor("token_embd.weight", GgmlType::Q8_0, &[32, 2]).unwrap();
        let mut s = w.create_file(&path).unwrap();
        s.write_tensor_data("blk.0.attn_norm.weight", &[1u8; 32]).unwrap();
        s.write_tensor_data("token_embd.weight", &[2u8; 68]).unwrap();
        s.finish().unwrap();
        let raw = RawGguf::open(&path).unwrap();
        (dir, raw)
    }

    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new(name: &str) -> Dir {
                let d = std::env::temp_dir().join(format!("pipeshard-{name}-{}", std::process::id()));
                std::fs::create_dir_all(&d).unwrap();
                Dir(d)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn unmutated_round_trip_is_byte_identical() {
        let (dir, raw) = base();
        let original = std::fs::read(dir.0.join("b.gguf")).unwrap();
        let mut again = raw.header_bytes();
        again.extend_from_slice(&raw.data);
        assert_eq!(again, original);
    }

    #[test]
    fn mutations_are_deterministic_and_parse_or_fail_cleanly() {
        let (_dir, raw) = base();
        let mut changed = 0;
        for i in 0..500 {
            let a = mutate(&raw, &mut Rng::for_case(7, i));
            let b = mutate(&raw, &mut Rng::for_case(7, i));
            assert_eq!(a.header, b.header);
            assert_eq!(a.mutations, b.mutations);
            let mut bytes = a.header.clone();
            bytes.extend_from_slice(&a.data);
            if let Ok(f) = GgufFile::from_reader(std::io::Cursor::new(&bytes), bytes.len() as u64, "c.gguf") {
                let _ = crate::gguf::validate(&f);
            }
            changed += usize::from(a.header != raw.header_bytes());
        }
        assert!(changed > 400, "only {changed} of 500 cases changed the file");
    }
}
