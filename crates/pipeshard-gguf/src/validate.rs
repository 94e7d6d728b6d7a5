//! Checks of the hyper-parameters that llama.cpp trusts, against its limits
//! and against the file's own tensors, before the file is handed to it.
//!
//! llama.cpp's loader checks many things itself and reports them as a load
//! failure (a missing key, a tensor of the wrong shape), but some values it
//! takes on trust and then stops the process with `GGML_ASSERT` when they
//! are out of range: a `block_count` above `LLAMA_MAX_LAYERS`, an
//! `expert_count` above `LLAMA_MAX_EXPERTS` or below `expert_used_count`, a
//! per-layer `expert_used_count` above layer 0's (which most graphs size
//! every layer by), a head size unlike `rope.dimension_count`, duplicate vocabulary strings, an
//! unknown `rope.scaling.type`. [`validate`] checks each of those (and the
//! types of the scalar keys llama.cpp reads) and names the offending key, so
//! that a bad file fails with a message instead of an abort.
//!
//! The rules mirror the pinned llama.cpp (`llama-model.cpp` `load_hparams`,
//! `llama-vocab.cpp` `load`, the graph builders' asserts); they are no
//! stricter than what llama.cpp itself would accept or fail cleanly on,
//! except where noted.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::model_info::{parse_layer, TensorRole};
use super::reader::GgufFile;
use super::types::GgmlType;
use super::value::{GgufArray, GgufValue, GgufValueType};

/// Most layers llama.cpp supports (`LLAMA_MAX_LAYERS`).
pub const LLAMA_MAX_LAYERS: u64 = 512;

/// Most routed experts llama.cpp supports (`LLAMA_MAX_EXPERTS`).
pub const LLAMA_MAX_EXPERTS: u64 = 1024;

/// The values of `{arch}.rope.scaling.type` llama.cpp knows.
pub const ROPE_SCALING_TYPES: [&str; 4] = ["none", "linear", "yarn", "longrope"];

/// Architectures whose graph asserts that the head size of K, of V and the
/// rotary dimension count are one number (`GGML_ASSERT(n_embd_head ==
/// n_rot)` in `src/models/*.cpp`), listed by `general.architecture`.
const HEAD_EQUALS_ROT: &[&str] = &[
    "apertus",
    "arcee",
    "arctic",
    "baichuan",
    "chameleon",
    "codeshell",
    "cogvlm",
    "cohere2moe",
    "dbrx",
    "deci",
    "deepseek",
    "dots1",
    "dream",
    "ernie4_5",
    "ernie4_5-moe",
    "exaone",
    "exaone4",
    "exaone-moe",
    "falcon",
    "granite",
    "granite_swa",
    "graniteswitch",
    "grok",
    "grovemoe",
    "hunyuan-moe",
    "hunyuan_vl",
    "hy_v3",
    "internlm2",
    "jais2",
    "llada",
    "llada-moe",
    "llama",
    "llama4",
    "maincoder",
    "mellum",
    "minimax-01",
    "minimax-m2",
    "mistral3",
    "nemotron",
    "olmo",
    "olmo2",
    "olmoe",
    "orion",
    "paddleocr",
    "pangu-embedded",
    "plamo",
    "pockettts",
    "qwen2",
    "qwen2moe",
    "qwen2vl",
    "qwen3",
    "qwen3moe",
    "qwen3vl",
    "qwen3vlmoe",
    "rnd1",
    "seed_oss",
    "smallthinker",
    "smollm3",
    "starcoder2",
    "talkie",
    "xverse",
];

/// A hyper-parameter (or tensor) llama.cpp would trust is missing its mark.
#[derive(Debug, thiserror::Error)]
#[error("{}: {subject} {problem}", path.display())]
pub struct HparamError {
    path: PathBuf,
    subject: Subject,
    problem: HparamProblem,
}

/// What an [`HparamError`] is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// A metadata key.
    Key(String),
    /// A tensor.
    Tensor(String),
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Subject::Key(k) => write!(f, "metadata key '{k}'"),
            Subject::Tensor(t) => write!(f, "tensor '{t}'"),
        }
    }
}

impl HparamError {
    fn new(path: &Path, key: impl Into<String>, problem: HparamProblem) -> Self {
        HparamError {
            path: path.to_path_buf(),
            subject: Subject::Key(key.into()),
            problem,
        }
    }

    fn tensor(path: &Path, name: &str, problem: HparamProblem) -> Self {
        HparamError {
            path: path.to_path_buf(),
            subject: Subject::Tensor(name.to_owned()),
            problem,
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The metadata key, or the tensor, at fault.
    pub fn key(&self) -> &str {
        match &self.subject {
            Subject::Key(k) | Subject::Tensor(k) => k,
        }
    }

    /// What the error is about.
    pub fn subject(&self) -> &Subject {
        &self.subject
    }

    /// What is wrong with it.
    pub fn problem(&self) -> &HparamProblem {
        &self.problem
    }
}

/// What is wrong with a hyper-parameter.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum HparamProblem {
    /// A key llama.cpp requires is absent.
    #[error("is missing")]
    Missing,
    /// The value has a type llama.cpp does not read this key as.
    #[error("is a {found} value; llama.cpp reads it as {expected}")]
    WrongType {
        /// What the file holds (`"u64"`, `"array of f32"`, …).
        found: String,
        /// What llama.cpp expects.
        expected: &'static str,
    },
    /// The value is outside what llama.cpp accepts.
    #[error("is {value}; {allowed}")]
    OutOfRange {
        /// The value found.
        value: String,
        /// What is allowed, in words.
        allowed: String,
    },
    /// The value disagrees with a tensor's shape.
    #[error("is {value}, but tensor '{tensor}' {shape}")]
    DisagreesWithTensor {
        /// The value found.
        value: u64,
        /// The tensor.
        tensor: String,
        /// What its shape says, in words.
        shape: String,
    },
    /// The value disagrees with other metadata.
    #[error("{0}")]
    Inconsistent(String),
    /// Two vocabulary entries have the same text.
    #[error("has the string {text:?} twice, at token {first} and token {second}")]
    DuplicateToken {
        /// The duplicated text (as llama.cpp stores it).
        text: String,
        /// Its first index.
        first: usize,
        /// Its second index.
        second: usize,
    },
}

/// Checks every hyper-parameter llama.cpp trusts against its limits and
/// against the tensors of `f`. See the module documentation.
pub fn validate(f: &GgufFile) -> Result<(), HparamError> {
    let path = f.path();
    let arch_key = "general.architecture";
    let arch = match f.get(arch_key) {
        None => return Err(HparamError::new(path, arch_key, HparamProblem::Missing)),
        Some(GgufValue::String(s)) => s.as_str(),
        Some(v) => return Err(wrong_type(path, arch_key, v, "a string")),
    };
    check_scalar_types(f, arch)?;
    check_floats(f, arch)?;
    check_tensor_types(f)?;
    if arch != "clip" {
        check_hparams(f, arch)?;
    }
    check_vocab(f, arch)?;
    Ok(())
}

fn type_name(v: &GgufValue) -> String {
    match v {
        GgufValue::Array(a) => format!("array of {}", a.elem_type()),
        other => other.value_type().to_string(),
    }
}

fn wrong_type(path: &Path, key: &str, v: &GgufValue, expected: &'static str) -> HparamError {
    HparamError::new(
        path,
        key,
        HparamProblem::WrongType {
            found: type_name(v),
            expected,
        },
    )
}

fn out_of_range(path: &Path, key: &str, value: impl ToString, allowed: impl Into<String>) -> HparamError {
    HparamError::new(
        path,
        key,
        HparamProblem::OutOfRange {
            value: value.to_string(),
            allowed: allowed.into(),
        },
    )
}

/// How llama.cpp reads a key.
#[derive(Clone, Copy)]
enum Expect {
    U32,
    F32,
    Bool,
    Str,
    /// A `u32`, or an array of `i32`/`u32` with one entry per layer.
    U32OrLayerArray,
}

/// `{arch}.` keys llama.cpp reads with a fixed type (`get_key`, whose
/// `GKV::get_kv` requires the exact GGUF type).
const ARCH_KEYS: &[(&str, Expect)] = &[
    ("context_length", Expect::U32),
    ("embedding_length", Expect::U32),
    ("embedding_length_out", Expect::U32),
    ("block_count", Expect::U32),
    ("leading_dense_block_count", Expect::U32),
    ("nextn_predict_layers", Expect::U32),
    ("feed_forward_length", Expect::U32OrLayerArray),
    ("expert_feed_forward_length", Expect::U32),
    ("expert_shared_feed_forward_length", Expect::U32),
    ("expert_count", Expect::U32),
    ("expert_used_count", Expect::U32OrLayerArray),
    ("expert_shared_count", Expect::U32),
    ("expert_group_count", Expect::U32),
    ("expert_group_used_count", Expect::U32),
    ("vocab_size", Expect::U32),
    ("pooling_type", Expect::U32),
    ("attention.causal", Expect::Bool),
    ("attention.head_count", Expect::U32OrLayerArray),
    ("attention.head_count_kv", Expect::U32OrLayerArray),
    ("attention.key_length", Expect::U32),
    ("attention.value_length", Expect::U32),
    ("attention.key_length_swa", Expect::U32),
    ("attention.value_length_swa", Expect::U32),
    ("attention.sliding_window", Expect::U32),
    ("attention.layer_norm_epsilon", Expect::F32),
    ("attention.layer_norm_rms_epsilon", Expect::F32),
    ("rope.dimension_count", Expect::U32),
    ("rope.dimension_count_swa", Expect::U32),
    ("rope.freq_base", Expect::F32),
    ("rope.freq_base_swa", Expect::F32),
    ("rope.scale_linear", Expect::F32),
    ("rope.scaling.type", Expect::Str),
    ("rope.scaling.factor", Expect::F32),
    ("rope.scaling.attn_factor", Expect::F32),
    ("rope.scaling.original_context_length", Expect::U32),
    ("rope.scaling.finetuned", Expect::Bool),
];

/// Global keys llama.cpp reads with a fixed type.
const GLOBAL_KEYS: &[(&str, Expect)] = &[
    ("general.name", Expect::Str),
    ("tokenizer.ggml.model", Expect::Str),
    ("tokenizer.ggml.pre", Expect::Str),
    ("tokenizer.ggml.bos_token_id", Expect::U32),
    ("tokenizer.ggml.eos_token_id", Expect::U32),
    ("tokenizer.ggml.eot_token_id", Expect::U32),
    ("tokenizer.ggml.eom_token_id", Expect::U32),
    ("tokenizer.ggml.unknown_token_id", Expect::U32),
    ("tokenizer.ggml.seperator_token_id", Expect::U32),
    ("tokenizer.ggml.padding_token_id", Expect::U32),
    ("tokenizer.ggml.mask_token_id", Expect::U32),
    ("tokenizer.ggml.add_bos_token", Expect::Bool),
    ("tokenizer.ggml.add_eos_token", Expect::Bool),
    ("tokenizer.ggml.add_sep_token", Expect::Bool),
    ("tokenizer.ggml.add_space_prefix", Expect::Bool),
    ("tokenizer.ggml.remove_extra_whitespaces", Expect::Bool),
];

fn check_type(path: &Path, key: &str, v: &GgufValue, expect: Expect) -> Result<(), HparamError> {
    let ok = match expect {
        Expect::U32 => v.value_type() == GgufValueType::U32,
        Expect::F32 => v.value_type() == GgufValueType::F32,
        Expect::Bool => v.value_type() == GgufValueType::Bool,
        Expect::Str => v.value_type() == GgufValueType::String,
        Expect::U32OrLayerArray => match v {
            GgufValue::U32(_) => true,
            GgufValue::Array(GgufArray::U32(_)) => true,
            // negative entries are not layer sizes
            GgufValue::Array(GgufArray::I32(a)) => a.iter().all(|&x| x >= 0),
            _ => false,
        },
    };
    if ok {
        return Ok(());
    }
    let expected = match expect {
        Expect::U32 => "a u32",
        Expect::F32 => "an f32",
        Expect::Bool => "a bool",
        Expect::Str => "a string",
        Expect::U32OrLayerArray => "a u32 or an array of non-negative i32/u32, one per layer",
    };
    Err(wrong_type(path, key, v, expected))
}

fn check_scalar_types(f: &GgufFile, arch: &str) -> Result<(), HparamError> {
    let path = f.path();
    for (suffix, expect) in ARCH_KEYS {
        let key = format!("{arch}.{suffix}");
        if let Some(v) = f.get(&key) {
            check_type(path, &key, v, *expect)?;
        }
    }
    for (key, expect) in GLOBAL_KEYS {
        if let Some(v) = f.get(key) {
            check_type(path, key, v, *expect)?;
        }
    }
    Ok(())
}

/// Norm epsilons: ggml's norms assert `eps >= 0` (false for NaN too).
fn check_floats(f: &GgufFile, arch: &str) -> Result<(), HparamError> {
    let prefix = format!("{arch}.");
    for (key, v) in f.metadata() {
        if let (true, true, GgufValue::F32(x)) = (key.starts_with(&prefix), key.ends_with("epsilon"), v) {
            if !(x.is_finite() && *x >= 0.0) {
                return Err(out_of_range(f.path(), key, x, "a finite number >= 0"));
            }
        }
    }
    Ok(())
}

/// One-dimensional weights (norms, biases, RoPE factors) are added and
/// multiplied into f32 activations, which ggml's CPU backend does only
/// with f32 operands (it aborts on anything else).
fn check_tensor_types(f: &GgufFile) -> Result<(), HparamError> {
    for t in f.tensors() {
        if t.dims.len() == 1 && t.ty != GgmlType::F32 {
            return Err(HparamError::tensor(
                f.path(),
                &t.name,
                HparamProblem::Inconsistent(format!(
                    "is a one-dimensional {} tensor; llama.cpp adds and multiplies one-dimensional weights only as f32",
                    t.ty
                )),
            ));
        }
    }
    Ok(())
}

/// A `u32` key (its type was checked already); `None` when absent.
fn get_u32(f: &GgufFile, key: &str) -> Option<u32> {
    match f.get(key) {
        Some(GgufValue::U32(x)) => Some(*x),
        _ => None,
    }
}

/// A per-layer key as llama.cpp's `get_key_or_arr` reads it: a scalar
/// repeated, or an array of exactly `n_layer` entries.
fn per_layer(f: &GgufFile, key: &str, n_layer: u32) -> Result<Option<Vec<u32>>, HparamError> {
    let path = f.path();
    match f.get(key) {
        None => Ok(None),
        Some(GgufValue::U32(x)) => Ok(Some(vec![*x; n_layer as usize])),
        Some(GgufValue::Array(a)) => {
            if a.len() != n_layer as usize {
                return Err(HparamError::new(
                    path,
                    key,
                    HparamProblem::Inconsistent(format!("has {} entries but block_count is {n_layer}", a.len())),
                ));
            }
            let v = a.to_u64_vec().unwrap_or_default();
            Ok(Some(v.into_iter().map(|x| x.min(u64::from(u32::MAX)) as u32).collect()))
        }
        // other types were rejected by check_scalar_types
        Some(_) => Ok(None),
    }
}

fn check_hparams(f: &GgufFile, arch: &str) -> Result<(), HparamError> {
    let path = f.path();
    let key = |k: &str| format!("{arch}.{k}");

    // Layers: 1 ..= LLAMA_MAX_LAYERS, and every blk.N tensor inside them.
    let k_layers = key("block_count");
    let Some(n_layer) = get_u32(f, &k_layers) else {
        return Err(HparamError::new(path, k_layers, HparamProblem::Missing));
    };
    if n_layer == 0 || u64::from(n_layer) > LLAMA_MAX_LAYERS {
        return Err(out_of_range(
            path,
            &k_layers,
            n_layer,
            format!("llama.cpp supports 1 to {LLAMA_MAX_LAYERS} layers (LLAMA_MAX_LAYERS)"),
        ));
    }
    let mut layer_has_tensor = vec![false; n_layer as usize];
    for t in f.tensors() {
        if let Some((il, _)) = parse_layer(&t.name) {
            match layer_has_tensor.get_mut(il as usize) {
                Some(seen) => *seen = true,
                None => {
                    return Err(HparamError::new(
                        path,
                        k_layers,
                        HparamProblem::DisagreesWithTensor {
                            value: u64::from(n_layer),
                            tensor: t.name.clone(),
                            shape: format!("belongs to layer {il}"),
                        },
                    ))
                }
            }
        }
    }
    if layer_has_tensor.iter().any(|&x| x) {
        if let Some(il) = layer_has_tensor.iter().position(|&x| !x) {
            return Err(HparamError::new(
                path,
                k_layers,
                HparamProblem::Inconsistent(format!("is {n_layer}, but the file has no tensors for layer {il}")),
            ));
        }
    }
    let k_nextn = key("nextn_predict_layers");
    if let Some(n) = get_u32(f, &k_nextn) {
        if n > n_layer {
            return Err(out_of_range(
                path,
                &k_nextn,
                n,
                format!("at most block_count ({n_layer})"),
            ));
        }
    }
    if arch == "wavtokenizer-dec" {
        for k in [key("posnet.block_count"), key("convnext.block_count")] {
            if let Some(n) = f.get(&k).and_then(GgufValue::as_u64) {
                if n > u64::from(n_layer) {
                    return Err(out_of_range(path, &k, n, format!("at most block_count ({n_layer})")));
                }
            }
        }
    }

    check_experts(f, arch, n_layer)?;
    check_heads(f, arch, n_layer)?;

    let k_scaling = key("rope.scaling.type");
    if let Some(s) = f.get_str(&k_scaling) {
        if !ROPE_SCALING_TYPES.contains(&s) {
            return Err(out_of_range(
                path,
                &k_scaling,
                format!("{s:?}"),
                format!("llama.cpp knows {}", ROPE_SCALING_TYPES.join(", ")),
            ));
        }
    }
    Ok(())
}

/// The number of routed experts and how many are used, as `load_hparams`
/// asserts them, and against the expert tensors' third dimension.
fn check_experts(f: &GgufFile, arch: &str, n_layer: u32) -> Result<(), HparamError> {
    let path = f.path();
    let key = |k: &str| format!("{arch}.{k}");
    let k_count = key("expert_count");
    let k_used = key("expert_used_count");
    let k_groups = key("expert_group_count");
    let k_group_used = key("expert_group_used_count");
    let mut n_expert = get_u32(f, &k_count).unwrap_or(0);
    let used = per_layer(f, &k_used, n_layer)?.unwrap_or_default();
    let mut used_max = used.iter().copied().max().unwrap_or(0);
    let n_groups = get_u32(f, &k_groups).unwrap_or(0);
    let n_group_used = get_u32(f, &k_group_used).unwrap_or(0);
    if (arch == "hunyuan_vl" || arch == "hunyuan-dense") && n_expert <= 1 {
        // load_hparams turns these into dense models
        n_expert = 0;
        used_max = 0;
    }

    if u64::from(n_expert) > LLAMA_MAX_EXPERTS {
        return Err(out_of_range(
            path,
            &k_count,
            n_expert,
            format!("llama.cpp supports at most {LLAMA_MAX_EXPERTS} experts (LLAMA_MAX_EXPERTS)"),
        ));
    }
    if used_max > n_expert {
        return Err(out_of_range(
            path,
            &k_used,
            used_max,
            format!("at most expert_count ({n_expert})"),
        ));
    }
    if n_expert > 0 {
        if used_max == 0 {
            return Err(out_of_range(
                path,
                &k_used,
                0,
                format!("a model with {n_expert} experts must use at least one"),
            ));
        }
        if n_groups >= n_expert {
            return Err(out_of_range(
                path,
                &k_groups,
                n_groups,
                format!("less than expert_count ({n_expert})"),
            ));
        }
        if n_groups > 1 {
            if n_expert % n_groups != 0 {
                return Err(out_of_range(
                    path,
                    &k_groups,
                    n_groups,
                    format!("a divisor of expert_count ({n_expert})"),
                ));
            }
            if n_group_used == 0 || n_group_used >= n_groups {
                return Err(out_of_range(
                    path,
                    &k_group_used,
                    n_group_used,
                    format!("1 to {} (below expert_group_count)", n_groups - 1),
                ));
            }
        }
    } else {
        if used_max > 0 {
            return Err(out_of_range(path, &k_used, used_max, "0 for a model without experts"));
        }
        if n_groups > 0 {
            return Err(out_of_range(path, &k_groups, n_groups, "0 for a model without experts"));
        }
    }

    if n_expert > 0 {
        check_experts_per_layer(f, arch, &k_used, &used)?;
    }

    // The stacked expert tensors hold expert_count matrices; the router
    // scores expert_count experts.
    for t in f.tensors() {
        let role = TensorRole::from_name(&t.name);
        let n = match role {
            // gpt-oss's expert biases hold one row per expert
            r if r.is_routed_expert() && t.name.ends_with(".bias") => t.dims.get(1).copied().unwrap_or(1),
            r if r.is_routed_expert() => t.dims.get(2).copied().unwrap_or(1),
            TensorRole::MoeRouter if t.name.ends_with(".weight") && t.dims.len() == 2 => t.dims[1],
            _ => continue,
        };
        if n != u64::from(n_expert) {
            let shape = if role == TensorRole::MoeRouter {
                format!("scores {n} experts")
            } else {
                format!("holds {n} experts")
            };
            return Err(HparamError::new(
                path,
                k_count,
                HparamProblem::DisagreesWithTensor {
                    value: u64::from(n_expert),
                    tensor: t.name.clone(),
                    shape,
                },
            ));
        }
    }
    Ok(())
}

/// Architectures whose graph routes each layer's own `expert_used_count`
/// (the others route layer 0's in every layer).
const EXPERTS_USED_PER_LAYER: &[&str] = &["nemotron_h", "nemotron_h_moe"];

/// A per-layer `expert_used_count` as `build_moe_ffn` uses it: each layer
/// with routed experts sums `n_expert_used(il)` of the experts the graph
/// computed, which are layer 0's count for most architectures (a larger
/// count views past them: `GGML_ASSERT(view_src == NULL || ...)`), and at
/// least one.
fn check_experts_per_layer(f: &GgufFile, arch: &str, k_used: &str, used: &[u32]) -> Result<(), HparamError> {
    let per_layer = EXPERTS_USED_PER_LAYER.contains(&arch);
    for t in f.tensors() {
        let role = TensorRole::from_name(&t.name);
        if role != TensorRole::MoeRouter && !role.is_routed_expert() {
            continue;
        }
        let Some((il, _)) = parse_layer(&t.name) else { continue };
        let Some(&n) = used.get(il as usize) else { continue };
        let most = if per_layer { u32::MAX } else { used[0] };
        if n == 0 || n > most {
            let allowed = if per_layer {
                format!("at least 1 in layer {il}, which has routed experts")
            } else {
                format!("1 to layer 0's count ({most}) in layer {il}: {arch} routes layer 0's count in every layer")
            };
            return Err(out_of_range(f.path(), k_used, format!("{used:?}"), allowed));
        }
    }
    Ok(())
}

/// Head counts, head sizes and the rotary dimension count, as the graph
/// uses them, and against the attention tensors.
fn check_heads(f: &GgufFile, arch: &str, n_layer: u32) -> Result<(), HparamError> {
    let path = f.path();
    let key = |k: &str| format!("{arch}.{k}");
    let k_head = key("attention.head_count");
    let k_head_kv = key("attention.head_count_kv");
    let Some(n_head) = per_layer(f, &k_head, n_layer)? else {
        return Ok(());
    };
    let n_head_kv = per_layer(f, &k_head_kv, n_layer)?.unwrap_or_else(|| n_head.clone());
    // llama.cpp's n_head() is layer 0's; attention-free models have none.
    let n_head0 = n_head[0];
    if n_head0 == 0 {
        return Ok(());
    }
    let n_embd = get_u32(f, &key("embedding_length")).unwrap_or(0);
    let k_key_len = key("attention.key_length");
    let k_val_len = key("attention.value_length");
    let k_rot = key("rope.dimension_count");
    let head_k = get_u32(f, &k_key_len).unwrap_or(n_embd / n_head0);
    let head_v = get_u32(f, &k_val_len).unwrap_or(n_embd / n_head0);
    let n_rot = get_u32(f, &k_rot).unwrap_or(head_k);

    for il in 0..n_layer as usize {
        let (h, kv) = (n_head[il], n_head_kv[il]);
        if kv > 0 && (h == 0 || h % kv != 0) {
            return Err(out_of_range(
                path,
                &k_head_kv,
                kv,
                format!("a divisor of attention.head_count ({h}) in layer {il}"),
            ));
        }
    }

    // ggml_rope: the rotated part is even and fits in the head.
    if n_rot % 2 != 0 || n_rot > head_k {
        return Err(out_of_range(
            path,
            &k_rot,
            n_rot,
            format!("an even number no larger than the head size of K ({head_k})"),
        ));
    }
    let k_key_swa = key("attention.key_length_swa");
    let k_rot_swa = key("rope.dimension_count_swa");
    let head_k_swa = get_u32(f, &k_key_swa).unwrap_or(head_k);
    let n_rot_swa = get_u32(f, &k_rot_swa).unwrap_or(n_rot);
    if n_rot_swa % 2 != 0 || n_rot_swa > head_k_swa {
        return Err(out_of_range(
            path,
            &k_rot_swa,
            n_rot_swa,
            format!("an even number no larger than the head size of K in SWA layers ({head_k_swa})"),
        ));
    }

    // M-RoPE sections: ggml's rope asserts they fit in the head, and takes
    // the position modulo their sum.
    let k_sections = key("rope.dimension_sections");
    let sections: Option<Vec<i64>> = match f.get(&k_sections) {
        Some(GgufValue::Array(GgufArray::I32(v))) => Some(v.iter().map(|&x| i64::from(x)).collect()),
        Some(GgufValue::Array(GgufArray::U32(v))) => Some(v.iter().map(|&x| i64::from(x)).collect()),
        Some(GgufValue::I32(x)) => Some(vec![i64::from(*x); 4]),
        Some(GgufValue::U32(x)) => Some(vec![i64::from(*x); 4]),
        _ => None,
    };
    if let Some(sec) = sections {
        let sum: i64 = sec.iter().take(4).sum();
        let needs_sections = matches!(
            arch,
            "qwen2vl" | "qwen3vl" | "qwen3vlmoe" | "qwen35" | "qwen35moe" | "qwen4exp"
        );
        if sec.iter().any(|&x| x < 0) || sum > i64::from(head_k) || (sum == 0 && needs_sections) {
            return Err(out_of_range(
                path,
                &k_sections,
                format!("{sec:?}"),
                format!("non-negative sections summing to 1 to the head size ({head_k})"),
            ));
        }
    }

    if !HEAD_EQUALS_ROT.contains(&arch) {
        return Ok(());
    }
    // These graphs assert head_k == head_v == n_rot, and their attention
    // tensors are plain Q, K and V projections.
    if n_rot != head_k {
        return Err(out_of_range(
            path,
            &k_rot,
            n_rot,
            format!(
                "{arch} needs the head size ({head_k}, from attention.key_length or embedding_length / head_count)"
            ),
        ));
    }
    if head_v != head_k && !matches!(arch, "exaone4" | "exaone-moe" | "talkie") {
        return Err(out_of_range(
            path,
            &k_val_len,
            head_v,
            format!("{arch} needs the head size of K ({head_k})"),
        ));
    }
    for t in f.tensors() {
        let Some((il, _)) = parse_layer(&t.name) else { continue };
        if !t.name.ends_with(".weight") || t.dims.len() != 2 {
            continue;
        }
        let il = il as usize;
        let (h, kv) = (u64::from(n_head[il]), u64::from(n_head_kv[il]));
        let (want, k, n, what) = match TensorRole::from_name(&t.name) {
            TensorRole::AttnQ => (h * u64::from(head_k), &k_head, h, "query heads"),
            TensorRole::AttnK => (kv * u64::from(head_k), &k_head_kv, kv, "key heads"),
            TensorRole::AttnV => (kv * u64::from(head_v), &k_head_kv, kv, "value heads"),
            _ => continue,
        };
        if t.dims[1] != want {
            return Err(HparamError::new(
                path,
                k.clone(),
                HparamProblem::DisagreesWithTensor {
                    value: n,
                    tensor: t.name.clone(),
                    shape: format!(
                        "has {} outputs, not {n} {what} of {} (layer {il})",
                        t.dims[1],
                        if what == "value heads" { head_v } else { head_k }
                    ),
                },
            ));
        }
    }
    Ok(())
}

/// Whether `s` is `<0xXX>`, the text of a byte token.
fn is_byte_token_text(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 6 && s.starts_with("<0x") && b[5] == b'>' && b[3].is_ascii_hexdigit() && b[4].is_ascii_hexdigit()
}

/// The vocabulary as `llama_vocab::impl::load` reads it.
fn check_vocab(f: &GgufFile, arch: &str) -> Result<(), HparamError> {
    let path = f.path();
    let model = f.get_str("tokenizer.ggml.model");
    if let Some(m @ ("none" | "no_vocab")) = model {
        // llama.cpp then has no tokenizer, and asserts one when asked to
        // tokenize, which every pipeshard command and the server do
        return Err(out_of_range(
            path,
            "tokenizer.ggml.model",
            format!("{m:?}"),
            "the model has no vocabulary, and pipeshard runs models that tokenize text",
        ));
    }
    let k_tokens = "tokenizer.ggml.tokens";
    let tokens = match f.get(k_tokens) {
        None => return Ok(()),
        Some(GgufValue::Array(GgufArray::String(v))) => v,
        Some(v) => return Err(wrong_type(path, k_tokens, v, "an array of strings")),
    };
    let n_tokens = tokens.len();
    if u32::try_from(n_tokens).is_err() || n_tokens > i32::MAX as usize {
        return Err(out_of_range(path, k_tokens, n_tokens, "fewer than 2^31 tokens"));
    }

    // Every token's text must be unique (llama.cpp asserts that its two maps
    // have the same size); empty entries become "[EMPTY_<i>]" first.
    let mut seen: HashMap<std::borrow::Cow<'_, str>, usize> = HashMap::with_capacity(n_tokens);
    for (i, t) in tokens.iter().enumerate() {
        let text = if t.is_empty() {
            std::borrow::Cow::Owned(format!("[EMPTY_{i}]"))
        } else {
            std::borrow::Cow::Borrowed(t.as_str())
        };
        if let Some(&first) = seen.get(&text) {
            return Err(HparamError::new(
                path,
                k_tokens,
                HparamProblem::DuplicateToken {
                    text: text.into_owned(),
                    first,
                    second: i,
                },
            ));
        }
        seen.insert(text, i);
    }

    // Byte tokens are decoded from their text ("<0xXX>"; a shorter text
    // makes llama.cpp's token_to_byte throw where nothing catches it).
    let k_types = "tokenizer.ggml.token_type";
    if let Some(GgufValue::Array(GgufArray::I32(types))) = f.get(k_types) {
        const LLAMA_TOKEN_TYPE_BYTE: i32 = 6;
        if let Some(i) = (0..n_tokens.min(types.len()))
            .find(|&i| types[i] == LLAMA_TOKEN_TYPE_BYTE && !is_byte_token_text(&tokens[i]))
        {
            return Err(HparamError::new(
                path,
                k_types,
                HparamProblem::Inconsistent(format!(
                    "marks token {i} ({:?}) as a byte token, whose text must be <0xXX>",
                    tokens[i]
                )),
            ));
        }
    }
    // SentencePiece falls back to byte tokens for any text its pieces do
    // not cover; llama.cpp's byte_to_token throws if one is missing.
    if model == Some("llama") {
        let have = |s: &str| seen.contains_key(s);
        if let Some(b) = (0..=255u8).find(|&b| {
            let hex = format!("<0x{b:02X}>");
            let raw_byte = b != 0 && b.is_ascii() && have(&char::from(b).to_string());
            !(have(&hex) || raw_byte)
        }) {
            return Err(HparamError::new(
                path,
                k_tokens,
                HparamProblem::Inconsistent(format!(
                    "has no byte token <0x{b:02X}>, which a SentencePiece (\"llama\") vocabulary needs"
                )),
            ));
        }
    }

    let k_scores = "tokenizer.ggml.scores";
    if let Some(v) = f.get(k_scores) {
        match v {
            GgufValue::Array(a @ (GgufArray::F32(_) | GgufArray::I32(_))) => {
                if a.len() < n_tokens {
                    return Err(HparamError::new(
                        path,
                        k_scores,
                        HparamProblem::Inconsistent(format!("has {} entries for {n_tokens} tokens", a.len())),
                    ));
                }
            }
            other => return Err(wrong_type(path, k_scores, other, "an array of f32 or i32")),
        }
    }
    if let Some(v) = f.get(k_types) {
        match v {
            GgufValue::Array(a @ GgufArray::I32(_)) => {
                if a.len() < n_tokens {
                    return Err(HparamError::new(
                        path,
                        k_types,
                        HparamProblem::Inconsistent(format!("has {} entries for {n_tokens} tokens", a.len())),
                    ));
                }
            }
            other => return Err(wrong_type(path, k_types, other, "an array of i32")),
        }
    }
    let k_merges = "tokenizer.ggml.merges";
    if let Some(v) = f.get(k_merges) {
        if !matches!(v, GgufValue::Array(GgufArray::String(_))) {
            return Err(wrong_type(path, k_merges, v, "an array of strings"));
        }
    }

    // The embedding has one row per token (llama.cpp creates it as
    // {n_embd, n_vocab}); pipeshard's planner reads vocab_size first.
    if let Some(t) = f.tensor("token_embd.weight") {
        if t.dims.len() == 2 && t.dims[1] != n_tokens as u64 {
            return Err(HparamError::new(
                path,
                k_tokens,
                HparamProblem::DisagreesWithTensor {
                    value: n_tokens as u64,
                    tensor: t.name.clone(),
                    shape: format!("has {} rows", t.dims[1]),
                },
            ));
        }
    }
    let k_vocab = format!("{arch}.vocab_size");
    if let Some(n) = get_u32(f, &k_vocab) {
        if n as usize != n_tokens {
            return Err(HparamError::new(
                path,
                k_vocab,
                HparamProblem::Inconsistent(format!("is {n}, but {k_tokens} has {n_tokens} entries")),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writer::GgufWriter;
    use std::io::Cursor;

    /// A two-layer llama with 4 heads of 16 (2 KV heads), 8 tokens, and
    /// whatever `edit` changes, as a parsed file (tensor data is zeros).
    fn llama(edit: impl FnOnce(&mut Vec<(String, GgufValue)>, &mut Vec<(String, Vec<u64>)>)) -> GgufFile {
        let mut kv: Vec<(String, GgufValue)> = vec![
            ("general.architecture".into(), "llama".into()),
            ("llama.block_count".into(), 2u32.into()),
            ("llama.context_length".into(), 256u32.into()),
            ("llama.embedding_length".into(), 64u32.into()),
            ("llama.feed_forward_length".into(), 128u32.into()),
            ("llama.attention.head_count".into(), 4u32.into()),
            ("llama.attention.head_count_kv".into(), 2u32.into()),
            ("llama.rope.dimension_count".into(), 16u32.into()),
            ("tokenizer.ggml.model".into(), "gpt2".into()),
            (
                "tokenizer.ggml.tokens".into(),
                GgufArray::String((0..8).map(|i| format!("t{i}")).collect()).into(),
            ),
            ("tokenizer.ggml.token_type".into(), GgufArray::I32(vec![1; 8]).into()),
        ];
        let mut tensors: Vec<(String, Vec<u64>)> = vec![("token_embd.weight".into(), vec![64, 8])];
        for il in 0..2 {
            for (n, d) in [
                ("attn_norm", vec![64]),
                ("attn_q", vec![64, 64]),
                ("attn_k", vec![64, 32]),
                ("attn_v", vec![64, 32]),
                ("attn_output", vec![64, 64]),
                ("ffn_norm", vec![64]),
                ("ffn_up", vec![64, 128]),
                ("ffn_gate", vec![64, 128]),
                ("ffn_down", vec![128, 64]),
            ] {
                tensors.push((format!("blk.{il}.{n}.weight"), d));
            }
        }
        tensors.push(("output_norm.weight".into(), vec![64]));
        edit(&mut kv, &mut tensors);
        let mut w = GgufWriter::new();
        for (k, v) in kv {
            w.add_kv(k, v).unwrap();
        }
        for (n, d) in &tensors {
            w.add_tensor(n.clone(), GgmlType::F32, d).unwrap();
        }
        let planned = w.tensors().to_vec();
        let mut s = w.start(Cursor::new(Vec::new())).unwrap();
        for t in &planned {
            s.write_tensor_data(&t.name, &vec![0u8; t.nbytes as usize]).unwrap();
        }
        let b = s.finish().unwrap().into_inner();
        GgufFile::from_reader(Cursor::new(&b), b.len() as u64, "m.gguf").unwrap()
    }

    fn set(kv: &mut Vec<(String, GgufValue)>, key: &str, v: impl Into<GgufValue>) {
        let v = v.into();
        match kv.iter_mut().find(|(k, _)| k == key) {
            Some(e) => e.1 = v,
            None => kv.push((key.into(), v)),
        }
    }

    /// The error for a file edited by `edit`, with its key and message.
    fn err(edit: impl FnOnce(&mut Vec<(String, GgufValue)>, &mut Vec<(String, Vec<u64>)>)) -> HparamError {
        let e = validate(&llama(edit)).expect_err("expected a validation error");
        assert!(e.to_string().starts_with("m.gguf: metadata key '"), "{e}");
        e
    }

    fn moe(kv: &mut Vec<(String, GgufValue)>, t: &mut Vec<(String, Vec<u64>)>, n_expert: u64) {
        set(kv, "llama.expert_count", n_expert as u32);
        set(kv, "llama.expert_used_count", 2u32);
        t.retain(|(n, _)| !n.contains("ffn_up") && !n.contains("ffn_gate") && !n.contains("ffn_down"));
        for il in 0..2 {
            t.push((format!("blk.{il}.ffn_gate_inp.weight"), vec![64, n_expert]));
            t.push((format!("blk.{il}.ffn_up_exps.weight"), vec![64, 32, n_expert]));
            t.push((format!("blk.{il}.ffn_gate_exps.weight"), vec![64, 32, n_expert]));
            t.push((format!("blk.{il}.ffn_down_exps.weight"), vec![32, 64, n_expert]));
        }
    }

    #[test]
    fn a_consistent_file_passes() {
        validate(&llama(|_, _| {})).unwrap();
        validate(&llama(|kv, t| moe(kv, t, 4))).unwrap();
        // partial rotary embeddings are fine for architectures that allow them
        validate(&llama(|kv, _| {
            set(kv, "general.architecture", "phi2");
            for (k, _) in kv.iter_mut() {
                *k = k.replacen("llama.", "phi2.", 1);
            }
            set(kv, "phi2.rope.dimension_count", 8u32);
        }))
        .unwrap();
    }

    #[test]
    fn block_count_limits_and_tensors() {
        for n in [0u32, 513, 65536, u32::MAX] {
            let e = err(|kv, _| set(kv, "llama.block_count", n));
            assert_eq!(e.key(), "llama.block_count");
            assert!(e.to_string().contains("LLAMA_MAX_LAYERS"), "{e}");
        }
        let e = err(|kv, _| set(kv, "llama.block_count", 1u32));
        assert!(
            e.to_string()
                .contains("tensor 'blk.1.attn_norm.weight' belongs to layer 1"),
            "{e}"
        );
        let e = err(|kv, _| set(kv, "llama.block_count", 3u32));
        assert!(e.to_string().contains("no tensors for layer 2"), "{e}");
        let e = err(|kv, _| set(kv, "llama.nextn_predict_layers", 3u32));
        assert_eq!(e.key(), "llama.nextn_predict_layers");
    }

    #[test]
    fn expert_counts() {
        // dense model claiming experts, with none used
        let e = err(|kv, _| set(kv, "llama.expert_count", 2u32));
        assert_eq!(e.key(), "llama.expert_used_count");
        // more used than exist
        let e = err(|kv, t| {
            moe(kv, t, 4);
            set(kv, "llama.expert_count", 1u32);
        });
        assert_eq!(e.key(), "llama.expert_used_count");
        for n in [1025u32, u32::MAX] {
            let e = err(|kv, t| {
                moe(kv, t, 4);
                set(kv, "llama.expert_count", n);
            });
            assert_eq!(e.key(), "llama.expert_count");
            assert!(e.to_string().contains("LLAMA_MAX_EXPERTS"), "{e}");
        }
        // in range but unlike the tensors
        let e = err(|kv, t| {
            moe(kv, t, 4);
            set(kv, "llama.expert_count", 8u32);
        });
        assert_eq!(e.key(), "llama.expert_count");
        assert!(e.to_string().contains("experts"), "{e}");
        let e = err(|kv, t| {
            moe(kv, t, 4);
            set(kv, "llama.expert_used_count", GgufArray::U32(vec![2, 0, 1]));
        });
        assert!(e.to_string().contains("has 3 entries but block_count is 2"), "{e}");
        // per layer: llama routes layer 0's count in every layer
        let e = err(|kv, t| {
            moe(kv, t, 4);
            set(kv, "llama.expert_used_count", GgufArray::U32(vec![1, 4]));
        });
        assert_eq!(e.key(), "llama.expert_used_count");
        assert!(e.to_string().contains("1 to layer 0's count (1) in layer 1"), "{e}");
        let e = err(|kv, t| {
            moe(kv, t, 4);
            set(kv, "llama.expert_used_count", GgufArray::U32(vec![2, 0]));
        });
        assert!(e.to_string().contains("in layer 1"), "{e}");
        for ok in [vec![4, 1], vec![2, 2]] {
            validate(&llama(|kv, t| {
                moe(kv, t, 4);
                set(kv, "llama.expert_used_count", GgufArray::U32(ok));
            }))
            .unwrap();
        }
        let e = err(|kv, t| {
            moe(kv, t, 4);
            set(kv, "llama.expert_group_count", 3u32);
        });
        assert_eq!(e.key(), "llama.expert_group_count");
        let e = err(|kv, _| set(kv, "llama.expert_used_count", 1u32));
        assert_eq!(e.key(), "llama.expert_used_count");
    }

    #[test]
    fn heads_head_sizes_and_rope() {
        let e = err(|kv, _| set(kv, "llama.rope.dimension_count", 8u32));
        assert_eq!(e.key(), "llama.rope.dimension_count");
        assert!(e.to_string().contains("is 8; llama needs the head size (16"), "{e}");
        let e = err(|kv, _| set(kv, "llama.rope.dimension_count", 32u32));
        assert!(e.to_string().contains("no larger than the head size of K (16)"), "{e}");
        let e = err(|kv, _| set(kv, "llama.attention.key_length", 32u32));
        assert_eq!(e.key(), "llama.rope.dimension_count");
        let e = err(|kv, _| {
            set(kv, "llama.attention.key_length", 32u32);
            set(kv, "llama.rope.dimension_count", 32u32);
            set(kv, "llama.attention.value_length", 32u32);
        });
        assert_eq!(e.key(), "llama.attention.head_count");
        assert!(e.to_string().contains("'blk.0.attn_q.weight' has 64 outputs"), "{e}");
        let e = err(|kv, _| set(kv, "llama.attention.head_count_kv", 3u32));
        assert_eq!(e.key(), "llama.attention.head_count_kv");
        let e = err(|kv, _| set(kv, "llama.attention.head_count_kv", 4u32));
        assert!(e.to_string().contains("'blk.0.attn_k.weight' has 32 outputs"), "{e}");
        for bad in [vec![8, 8, 8, 8], vec![-1, 4, 4, 0]] {
            let e = err(|kv, _| set(kv, "llama.rope.dimension_sections", GgufArray::I32(bad)));
            assert_eq!(e.key(), "llama.rope.dimension_sections");
        }
        validate(&llama(|kv, _| {
            set(kv, "llama.rope.dimension_sections", GgufArray::I32(vec![2, 3, 3, 0]))
        }))
        .unwrap();
        let e = err(|kv, _| set(kv, "llama.attention.head_count", GgufArray::I32(vec![4])));
        assert_eq!(e.key(), "llama.attention.head_count");
    }

    #[test]
    fn scalar_key_types() {
        let cases: [(&str, GgufValue); 6] = [
            ("llama.block_count", GgufValue::U64(2)),
            ("llama.block_count", GgufValue::I32(-1)),
            ("llama.context_length", GgufValue::F32(1.0)),
            ("llama.rope.freq_base", GgufValue::U32(10000)),
            ("llama.attention.head_count", GgufArray::I32(vec![-4, 4]).into()),
            ("tokenizer.ggml.bos_token_id", GgufValue::I32(1)),
        ];
        for (key, v) in cases {
            let e = err(|kv, _| set(kv, key, v.clone()));
            assert_eq!(e.key(), key);
            assert!(matches!(e.problem(), HparamProblem::WrongType { .. }), "{e}");
        }
        let e = err(|kv, _| set(kv, "general.architecture", 3u32));
        assert_eq!(e.key(), "general.architecture");
        for eps in [f32::NAN, -1e-5, f32::INFINITY] {
            let e = err(|kv, _| set(kv, "llama.attention.layer_norm_rms_epsilon", eps));
            assert_eq!(e.key(), "llama.attention.layer_norm_rms_epsilon");
        }
        let e = err(|kv, _| set(kv, "llama.rope.scaling.type", "sideways"));
        assert!(
            e.to_string()
                .contains("\"sideways\"; llama.cpp knows none, linear, yarn, longrope"),
            "{e}"
        );
    }

    #[test]
    fn one_dimensional_weights_are_f32() {
        let mut w = GgufWriter::new();
        w.add_kv("general.architecture", "llama").unwrap();
        w.add_kv("llama.block_count", 1u32).unwrap();
        w.add_tensor("blk.0.attn_norm.weight", GgmlType::F16, &[64]).unwrap();
        let planned = w.tensors().to_vec();
        let mut s = w.start(Cursor::new(Vec::new())).unwrap();
        s.write_tensor_data(&planned[0].name, &[0u8; 128]).unwrap();
        let b = s.finish().unwrap().into_inner();
        let f = GgufFile::from_reader(Cursor::new(&b), b.len() as u64, "m.gguf").unwrap();
        let e = validate(&f).unwrap_err();
        assert_eq!(e.subject(), &Subject::Tensor("blk.0.attn_norm.weight".into()));
        assert!(
            e.to_string()
                .contains("tensor 'blk.0.attn_norm.weight' is a one-dimensional f16 tensor"),
            "{e}"
        );
    }

    #[test]
    fn vocabulary() {
        let e = err(|kv, _| {
            let toks: Vec<String> = ["a", "b", "c", "b", "e", "f", "g", "h"].map(String::from).to_vec();
            set(kv, "tokenizer.ggml.tokens", GgufArray::String(toks));
        });
        assert_eq!(e.key(), "tokenizer.ggml.tokens");
        assert_eq!(
            e.problem(),
            &HparamProblem::DuplicateToken {
                text: "b".into(),
                first: 1,
                second: 3
            }
        );
        // an empty entry becomes "[EMPTY_i]", which may collide
        let e = err(|kv, _| {
            let toks: Vec<String> = ["[EMPTY_1]", "", "c", "d", "e", "f", "g", "h"]
                .map(String::from)
                .to_vec();
            set(kv, "tokenizer.ggml.tokens", GgufArray::String(toks));
        });
        assert!(e.to_string().contains("twice, at token 0 and token 1"), "{e}");
        let e = err(|kv, _| set(kv, "tokenizer.ggml.token_type", GgufArray::I32(vec![1; 7])));
        assert!(e.to_string().contains("has 7 entries for 8 tokens"), "{e}");
        let e = err(|kv, _| set(kv, "tokenizer.ggml.scores", GgufArray::U8(vec![1; 8])));
        assert_eq!(e.key(), "tokenizer.ggml.scores");
        let e = err(|kv, _| {
            set(
                kv,
                "tokenizer.ggml.tokens",
                GgufArray::String((0..9).map(|i| i.to_string()).collect()),
            );
            set(kv, "tokenizer.ggml.token_type", GgufArray::I32(vec![1; 9]));
        });
        assert!(e.to_string().contains("'token_embd.weight' has 8 rows"), "{e}");
        let e = err(|kv, _| set(kv, "llama.vocab_size", 9u32));
        assert_eq!(e.key(), "llama.vocab_size");
        let e = err(|kv, _| set(kv, "tokenizer.ggml.tokens", GgufArray::I32(vec![0; 8])));
        assert!(matches!(e.problem(), HparamProblem::WrongType { .. }), "{e}");
        // SentencePiece needs its 256 byte tokens
        let e = err(|kv, _| set(kv, "tokenizer.ggml.model", "llama"));
        assert!(e.to_string().contains("has no byte token <0x00>"), "{e}");
        let mut spm: Vec<String> = (0..=255u8).map(|b| format!("<0x{b:02X}>")).collect();
        spm.extend(["a", "b"].map(String::from));
        validate(&llama(|kv, t| {
            set(kv, "tokenizer.ggml.model", "llama");
            set(kv, "tokenizer.ggml.tokens", GgufArray::String(spm.clone()));
            set(kv, "tokenizer.ggml.token_type", GgufArray::I32(vec![6; 258]));
            t[0].1 = vec![64, 258];
        }))
        .unwrap_err(); // "a" and "b" are not byte tokens
        validate(&llama(|kv, t| {
            set(kv, "tokenizer.ggml.model", "llama");
            set(kv, "tokenizer.ggml.tokens", GgufArray::String(spm.clone()));
            let mut types = vec![6; 258];
            types[256..].fill(1);
            set(kv, "tokenizer.ggml.token_type", GgufArray::I32(types));
            t[0].1 = vec![64, 258];
        }))
        .unwrap();
        let e = err(|kv, _| {
            set(
                kv,
                "tokenizer.ggml.token_type",
                GgufArray::I32(vec![1, 1, 6, 1, 1, 1, 1, 1]),
            )
        });
        assert!(e.to_string().contains("marks token 2 (\"t2\") as a byte token"), "{e}");
        // no vocabulary at all: nothing pipeshard runs can tokenize
        for m in ["none", "no_vocab"] {
            let e = err(|kv, _| set(kv, "tokenizer.ggml.model", m));
            assert!(e.to_string().contains("has no vocabulary"), "{e}");
        }
    }
}
