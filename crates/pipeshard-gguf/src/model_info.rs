//! Model-level view of a GGUF file: hyper-parameters from the metadata and a
//! classified tensor list, as needed to plan memory.

use super::reader::GgufFile;
use super::types::{row_size, GgmlType, SizeError};
use super::value::GgufValue;

/// A model's hyper-parameters could not be derived from its metadata.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelInfoError {
    /// `general.architecture` is missing.
    #[error("{path}: general.architecture is missing")]
    MissingArchitecture {
        /// The file.
        path: String,
    },
    /// A required key is missing.
    #[error("{path}: required metadata key '{key}' is missing")]
    MissingKey {
        /// The file.
        path: String,
        /// The key.
        key: String,
    },
    /// A key has a value of the wrong type or an impossible value.
    #[error("{path}: metadata key '{key}' {problem}")]
    BadValue {
        /// The file.
        path: String,
        /// The key.
        key: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A layer index is out of range.
    #[error("layer {layer} is out of range: the model has {n_layer} layers")]
    LayerOutOfRange {
        /// The layer asked for.
        layer: u32,
        /// The number of layers.
        n_layer: u32,
    },
    /// A KV-cache row size cannot be computed for the requested type.
    #[error("KV cache row of layer {layer}: {source}")]
    KvRow {
        /// The layer.
        layer: u32,
        /// Why.
        source: SizeError,
    },
}

/// What a tensor does in the model, from its GGUF name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorRole {
    /// `token_embd`: input embeddings.
    TokenEmbd,
    /// `output`: the LM head.
    Output,
    /// `output_norm`: final norm.
    OutputNorm,
    /// `attn_q`.
    AttnQ,
    /// `attn_k`.
    AttnK,
    /// `attn_v`.
    AttnV,
    /// `attn_qkv`: fused Q/K/V.
    AttnQkv,
    /// `attn_output`.
    AttnOutput,
    /// `attn_norm`: pre-attention norm.
    AttnNorm,
    /// `attn_q_norm`: per-head Q norm.
    AttnQNorm,
    /// `attn_k_norm`: per-head K norm.
    AttnKNorm,
    /// `ffn_norm`: pre-FFN norm.
    FfnNorm,
    /// `ffn_gate`: dense FFN gate.
    FfnGate,
    /// `ffn_up`: dense FFN up.
    FfnUp,
    /// `ffn_down`: dense FFN down.
    FfnDown,
    /// `ffn_gate_inp`: MoE router.
    MoeRouter,
    /// `ffn_gate_exps`: stacked expert gates.
    MoeGateExps,
    /// `ffn_up_exps`: stacked expert ups.
    MoeUpExps,
    /// `ffn_down_exps`: stacked expert downs.
    MoeDownExps,
    /// `ffn_gate_up_exps`: stacked expert gates and ups in one tensor
    /// (Gemma 4).
    MoeGateUpExps,
    /// `ffn_gate_inp_shexp`: shared-expert gate scalar.
    SharedExpertRouter,
    /// `ffn_gate_shexp`.
    SharedExpertGate,
    /// `ffn_up_shexp`.
    SharedExpertUp,
    /// `ffn_down_shexp`.
    SharedExpertDown,
    /// `post_attention_norm`: norm after attention (Gemma, gpt-oss, GLM,
    /// Qwen3.5: before the FFN).
    AttnPostNorm,
    /// `post_ffw_norm`: norm after the FFN (Gemma).
    FfnPostNorm,
    /// `pre_ffw_norm_2`: norm in front of the routed experts, beside the
    /// dense FFN's `ffn_norm` (Gemma 4).
    MoePreNorm,
    /// `post_ffw_norm_1`: norm after the dense FFN of a MoE layer (Gemma 4).
    FfnDensePostNorm,
    /// `post_ffw_norm_2`: norm after the routed experts (Gemma 4).
    MoePostNorm,
    /// `layer_output_scale`: a layer's output scalar (Gemma 4).
    LayerOutScale,
    /// `rope_freqs`: RoPE frequency factors, one tensor for all layers.
    RopeFreqs,
    /// `<weight>.scale`: a weight's per-tensor or per-expert scale (the
    /// router's input scale and the per-expert output scale of Gemma 4,
    /// NVFP4's second scale).
    WeightScale,
    /// `attn_sinks`: per-head attention sink logits (gpt-oss).
    AttnSinks,
    /// `attn_gate`: output gate of a Gated-DeltaNet layer (Qwen3.5).
    AttnGate,
    /// `attn_q_a`: MLA's compressed Q projection (DeepSeek).
    AttnQA,
    /// `attn_q_b`: MLA's Q decompression.
    AttnQB,
    /// `attn_q_a_norm`: norm of the compressed Q.
    AttnQANorm,
    /// `attn_kv_a_mqa`: MLA's compressed KV (and rotary K) projection.
    AttnKvA,
    /// `attn_kv_a_norm`: norm of the compressed KV.
    AttnKvANorm,
    /// `attn_kv_b`: MLA's joint K/V decompression (older files).
    AttnKvB,
    /// `attn_k_b`: MLA's per-head K decompression, absorbed into Q.
    AttnKB,
    /// `attn_v_b`: MLA's per-head V decompression.
    AttnVB,
    /// `exp_probs_b`: the router's expert-selection bias.
    MoeSelectionBias,
    /// `ssm_conv1d`: a recurrent layer's short convolution kernel.
    SsmConv,
    /// `ssm_dt`: time-step bias.
    SsmDt,
    /// `ssm_a`: state decay.
    SsmA,
    /// `ssm_beta`: Gated-DeltaNet write-strength projection.
    SsmBeta,
    /// `ssm_alpha`: Gated-DeltaNet decay projection.
    SsmAlpha,
    /// `ssm_ba`: the write-strength and decay projections in one tensor
    /// (Qwen3-Next).
    SsmBetaAlpha,
    /// `ssm_norm`: gated output norm.
    SsmNorm,
    /// `ssm_out`: a recurrent layer's output projection.
    SsmOut,
    /// Anything else.
    Other,
}

impl TensorRole {
    /// Classifies a tensor by its GGUF name (`blk.N.<role>.weight|bias`).
    pub fn from_name(name: &str) -> TensorRole {
        if name.ends_with(".scale") {
            return TensorRole::WeightScale;
        }
        let base = match parse_layer(name) {
            Some((_, rest)) => rest,
            None => name,
        };
        // strip the trailing `.weight` / `.bias` / other suffix (`ssm_a`
        // has none)
        let base = base.rsplit_once('.').map_or(base, |(b, _)| b);
        match base {
            "token_embd" => TensorRole::TokenEmbd,
            "output" => TensorRole::Output,
            "output_norm" => TensorRole::OutputNorm,
            "attn_q" => TensorRole::AttnQ,
            "attn_k" => TensorRole::AttnK,
            "attn_v" => TensorRole::AttnV,
            "attn_qkv" => TensorRole::AttnQkv,
            "attn_output" => TensorRole::AttnOutput,
            "attn_norm" => TensorRole::AttnNorm,
            "attn_q_norm" => TensorRole::AttnQNorm,
            "attn_k_norm" => TensorRole::AttnKNorm,
            "ffn_norm" => TensorRole::FfnNorm,
            "ffn_gate" => TensorRole::FfnGate,
            "ffn_up" => TensorRole::FfnUp,
            "ffn_down" => TensorRole::FfnDown,
            "ffn_gate_inp" => TensorRole::MoeRouter,
            "ffn_gate_exps" => TensorRole::MoeGateExps,
            "ffn_up_exps" => TensorRole::MoeUpExps,
            "ffn_down_exps" => TensorRole::MoeDownExps,
            "ffn_gate_up_exps" => TensorRole::MoeGateUpExps,
            "ffn_gate_inp_shexp" => TensorRole::SharedExpertRouter,
            "ffn_gate_shexp" => TensorRole::SharedExpertGate,
            "ffn_up_shexp" => TensorRole::SharedExpertUp,
            "ffn_down_shexp" => TensorRole::SharedExpertDown,
            "post_attention_norm" => TensorRole::AttnPostNorm,
            "post_ffw_norm" => TensorRole::FfnPostNorm,
            "pre_ffw_norm_2" => TensorRole::MoePreNorm,
            "post_ffw_norm_1" => TensorRole::FfnDensePostNorm,
            "post_ffw_norm_2" => TensorRole::MoePostNorm,
            "layer_output_scale" => TensorRole::LayerOutScale,
            "rope_freqs" => TensorRole::RopeFreqs,
            "attn_sinks" => TensorRole::AttnSinks,
            "attn_gate" => TensorRole::AttnGate,
            "attn_q_a" => TensorRole::AttnQA,
            "attn_q_b" => TensorRole::AttnQB,
            "attn_q_a_norm" => TensorRole::AttnQANorm,
            "attn_kv_a_mqa" => TensorRole::AttnKvA,
            "attn_kv_a_norm" => TensorRole::AttnKvANorm,
            "attn_kv_b" => TensorRole::AttnKvB,
            "attn_k_b" => TensorRole::AttnKB,
            "attn_v_b" => TensorRole::AttnVB,
            "exp_probs_b" => TensorRole::MoeSelectionBias,
            "ssm_conv1d" => TensorRole::SsmConv,
            "ssm_dt" => TensorRole::SsmDt,
            "ssm_a" => TensorRole::SsmA,
            "ssm_beta" => TensorRole::SsmBeta,
            "ssm_alpha" => TensorRole::SsmAlpha,
            "ssm_ba" => TensorRole::SsmBetaAlpha,
            "ssm_norm" => TensorRole::SsmNorm,
            "ssm_out" => TensorRole::SsmOut,
            _ => TensorRole::Other,
        }
    }

    /// Whether this is one of the stacked routed-expert tensors.
    pub fn is_routed_expert(self) -> bool {
        matches!(
            self,
            TensorRole::MoeGateExps | TensorRole::MoeUpExps | TensorRole::MoeDownExps | TensorRole::MoeGateUpExps
        )
    }

    /// Whether this belongs to a recurrent (state-space or Gated-DeltaNet)
    /// layer's mixer.
    pub fn is_recurrent(self) -> bool {
        matches!(
            self,
            TensorRole::SsmConv
                | TensorRole::SsmDt
                | TensorRole::SsmA
                | TensorRole::SsmBeta
                | TensorRole::SsmAlpha
                | TensorRole::SsmBetaAlpha
                | TensorRole::SsmNorm
                | TensorRole::SsmOut
        )
    }

    /// Whether the planner knows what this tensor does.
    pub fn is_known(self) -> bool {
        self != TensorRole::Other
    }

    /// Whether this belongs to a shared expert.
    pub fn is_shared_expert(self) -> bool {
        matches!(
            self,
            TensorRole::SharedExpertRouter
                | TensorRole::SharedExpertGate
                | TensorRole::SharedExpertUp
                | TensorRole::SharedExpertDown
        )
    }
}

/// Splits `blk.N.rest` into `(N, rest)`.
pub fn parse_layer(name: &str) -> Option<(u32, &str)> {
    let rest = name.strip_prefix("blk.")?;
    let (num, rest) = rest.split_once('.')?;
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((num.parse().ok()?, rest))
}

/// One tensor of the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelTensor {
    /// GGUF name.
    pub name: String,
    /// Layer index from a `blk.N.` prefix; `None` for global tensors.
    pub layer: Option<u32>,
    /// Classification.
    pub role: TensorRole,
    /// Element type.
    pub ty: GgmlType,
    /// Shape, row length first.
    pub dims: Vec<u64>,
    /// Exact host bytes (`ggml_nbytes`).
    pub nbytes: u64,
}

impl ModelTensor {
    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Bytes ggml-cuda allocates for this tensor (see
    /// [`cuda_alloc_size`](crate::types::cuda_alloc_size)).
    pub fn cuda_alloc_size(&self) -> u64 {
        // the shape was validated when the file was read
        super::types::cuda_alloc_size(self.ty, &self.dims).unwrap_or(self.nbytes)
    }

    /// Whether this is a bias (name ends in `.bias`).
    pub fn is_bias(&self) -> bool {
        self.name.ends_with(".bias")
    }

    /// Whether this holds a layer's routed experts, one matrix per expert
    /// (what a MoE matmul, MUL_MAT_ID, selects from).
    pub fn holds_routed_experts(&self) -> bool {
        self.role.is_routed_expert() && self.dims.get(2).copied().unwrap_or(1) > 1
    }
}

/// Hyper-parameters and classified tensors of a model stored in GGUF.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    /// `general.architecture`.
    pub architecture: String,
    /// `general.name`, if present.
    pub name: Option<String>,
    /// `{arch}.block_count`.
    pub n_layer: u32,
    /// `{arch}.embedding_length`.
    pub n_embd: u64,
    /// `{arch}.feed_forward_length`, per layer (empty when absent).
    pub n_ff: Vec<u64>,
    /// `{arch}.attention.head_count`, per layer (0 for attention-free models).
    pub n_head: Vec<u32>,
    /// `{arch}.attention.head_count_kv`, per layer (defaults to `n_head`).
    pub n_head_kv: Vec<u32>,
    /// `{arch}.attention.key_length` (default `n_embd / n_head`).
    pub head_dim_k: u64,
    /// `{arch}.attention.value_length` (default `n_embd / n_head`).
    pub head_dim_v: u64,
    /// `{arch}.attention.key_length_swa` / `value_length_swa`: the K and V
    /// head sizes of sliding-window layers (Gemma 4), where they differ.
    pub head_dim_swa: Option<(u64, u64)>,
    /// Layers from this index on hold no KV cache of their own (they read
    /// an earlier layer's: `{arch}.attention.shared_kv_layers`, Gemma 4).
    pub kv_layers_end: u32,
    /// `{arch}.context_length`, if present.
    pub n_ctx_train: Option<u64>,
    /// Vocabulary size: `{arch}.vocab_size`, else the token list length,
    /// else the second dimension of `token_embd`.
    pub n_vocab: Option<u64>,
    /// `{arch}.expert_count` (0 for dense models).
    pub n_expert: u32,
    /// `{arch}.expert_used_count` (0 for dense models).
    pub n_expert_used: u32,
    /// `{arch}.expert_shared_count`, or 1 when `*_shexp` tensors exist
    /// without that key.
    pub n_expert_shared: u32,
    /// `{arch}.expert_feed_forward_length`, if present.
    pub n_ff_exp: Option<u64>,
    /// `{arch}.attention.sliding_window`, if present.
    pub sliding_window: Option<u64>,
    /// Per layer: whether the layer uses sliding-window attention.
    pub swa_layers: Vec<bool>,
    /// Per layer: whether the layer is recurrent (it has `ssm_*` tensors):
    /// it keeps a fixed state per sequence instead of a KV cache.
    pub recurrent_layers: Vec<bool>,
    /// Bytes of one sequence's recurrent state in one recurrent layer: the
    /// convolution and SSM states (`n_embd_r` + `n_embd_s` in
    /// `llama-hparams.cpp`), F32 as `llama_memory_recurrent` keeps them.
    pub recurrent_state_bytes: u64,
    /// Multi-head latent attention (`attention.kv_lora_rank` with
    /// `key_length_mla`): the cache holds the compressed K row only, and V
    /// is a view of it.
    pub mla: bool,
    /// The tensors llama.cpp loads: the file's, in file order, then the
    /// output projection it loads from the token embedding where the model
    /// ties them ([`tied_output`](crate::tied_output)).
    pub tensors: Vec<ModelTensor>,
    /// Whether `tensors` holds that tied output (`output.weight`, which the
    /// file does not hold).
    pub tied_output: bool,
}

/// Reads a key that may be a scalar or a per-layer array of integers.
fn per_layer(f: &GgufFile, key: &str, n_layer: u32, path: &str) -> Result<Option<Vec<u64>>, ModelInfoError> {
    let bad = |problem: String| ModelInfoError::BadValue {
        path: path.to_owned(),
        key: key.to_owned(),
        problem,
    };
    match f.get(key) {
        None => Ok(None),
        Some(GgufValue::Array(a)) => {
            let v = a
                .to_u64_vec()
                .ok_or_else(|| bad("is not an array of non-negative integers".into()))?;
            if v.len() != n_layer as usize {
                return Err(bad(format!(
                    "has {} entries but the model has {n_layer} layers",
                    v.len()
                )));
            }
            Ok(Some(v))
        }
        Some(v) => {
            let x = v
                .as_u64()
                .ok_or_else(|| bad(format!("is a {} value, expected an integer", v.value_type())))?;
            Ok(Some(vec![x; n_layer as usize]))
        }
    }
}

fn to_u32(v: u64, key: &str, path: &str) -> Result<u32, ModelInfoError> {
    u32::try_from(v).map_err(|_| ModelInfoError::BadValue {
        path: path.to_owned(),
        key: key.to_owned(),
        problem: format!("is {v}, which does not fit in 32 bits"),
    })
}

/// Default SWA pattern (`n_pattern`, as in `llama_hparams::set_swa_pattern`
/// with `dense_first = false`) for architectures that do not store one.
fn default_swa_pattern(arch: &str) -> Option<u32> {
    match arch {
        "gemma2" => Some(2),
        "gemma3" => Some(6),
        "gpt-oss" => Some(2),
        "cohere2" => Some(4),
        _ => None,
    }
}

impl ModelInfo {
    /// Derives the model view from a parsed GGUF file.
    pub fn from_gguf(f: &GgufFile) -> Result<ModelInfo, ModelInfoError> {
        let path = f.path().display().to_string();
        let arch = f
            .architecture()
            .ok_or_else(|| ModelInfoError::MissingArchitecture { path: path.clone() })?
            .to_owned();
        let key = |k: &str| format!("{arch}.{k}");
        let missing = |k: String| ModelInfoError::MissingKey {
            path: path.clone(),
            key: k,
        };
        let required_u64 = |k: String| -> Result<u64, ModelInfoError> {
            match f.get(&k) {
                None => Err(missing(k)),
                Some(v) => v.as_u64().ok_or_else(|| ModelInfoError::BadValue {
                    path: path.clone(),
                    key: k.clone(),
                    problem: format!("is a {} value, expected an integer", v.value_type()),
                }),
            }
        };

        let k_layers = key("block_count");
        let n_layer = to_u32(required_u64(k_layers.clone())?, &k_layers, &path)?;
        if n_layer == 0 {
            return Err(ModelInfoError::BadValue {
                path,
                key: k_layers,
                problem: "is 0".into(),
            });
        }
        let n_embd = required_u64(key("embedding_length"))?;

        let k_head = key("attention.head_count");
        let n_head: Vec<u32> = per_layer(f, &k_head, n_layer, &path)?
            .unwrap_or_else(|| vec![0; n_layer as usize])
            .into_iter()
            .map(|x| to_u32(x, &k_head, &path))
            .collect::<Result<_, _>>()?;
        let k_head_kv = key("attention.head_count_kv");
        let n_head_kv: Vec<u32> = match per_layer(f, &k_head_kv, n_layer, &path)? {
            Some(v) => v
                .into_iter()
                .map(|x| to_u32(x, &k_head_kv, &path))
                .collect::<Result<_, _>>()?,
            None => n_head.clone(),
        };
        let n_ff = per_layer(f, &key("feed_forward_length"), n_layer, &path)?.unwrap_or_default();

        let n_head0 = u64::from(n_head.iter().copied().max().unwrap_or(0));
        let default_head_dim = n_embd.checked_div(n_head0).unwrap_or(0);
        let head_dim_k = f.get_u64(&key("attention.key_length")).unwrap_or(default_head_dim);
        let head_dim_v = f.get_u64(&key("attention.value_length")).unwrap_or(default_head_dim);

        let opt_u32 = |k: String| -> Result<u32, ModelInfoError> { to_u32(f.get_u64(&k).unwrap_or(0), &k, &path) };
        let n_expert = opt_u32(key("expert_count"))?;
        let n_expert_used = opt_u32(key("expert_used_count"))?;

        let tensors: Vec<ModelTensor> = f
            .tensors()
            .iter()
            .map(|t| ModelTensor {
                name: t.name.clone(),
                layer: parse_layer(&t.name).map(|(l, _)| l),
                role: TensorRole::from_name(&t.name),
                ty: t.ty,
                dims: t.dims.clone(),
                nbytes: t.nbytes,
            })
            .collect();

        let has_shexp = tensors.iter().any(|t| t.role.is_shared_expert());
        let n_expert_shared = match f.get(&key("expert_shared_count")) {
            Some(_) => opt_u32(key("expert_shared_count"))?,
            None => u32::from(has_shexp),
        };

        let n_vocab = f
            .get_u64(&key("vocab_size"))
            .or_else(|| f.get_array_len("tokenizer.ggml.tokens").map(|n| n as u64))
            .or_else(|| {
                tensors
                    .iter()
                    .find(|t| t.role == TensorRole::TokenEmbd)
                    .and_then(|t| t.dims.get(1).copied())
            });

        let sliding_window = f.get_u64(&key("attention.sliding_window"));
        let k_pattern = key("attention.sliding_window_pattern");
        let swa_layers = match f.get(&k_pattern) {
            Some(GgufValue::Array(a)) => {
                let flags: Option<Vec<bool>> = match a {
                    super::value::GgufArray::Bool(v) => Some(v.clone()),
                    other => other.to_u64_vec().map(|v| v.into_iter().map(|x| x != 0).collect()),
                };
                match flags {
                    Some(v) if v.len() == n_layer as usize => v,
                    _ => {
                        return Err(ModelInfoError::BadValue {
                            path,
                            key: k_pattern,
                            problem: format!("must be {n_layer} booleans"),
                        })
                    }
                }
            }
            Some(v) => {
                let n = v.as_u64().ok_or_else(|| ModelInfoError::BadValue {
                    path: path.clone(),
                    key: k_pattern.clone(),
                    problem: format!("is a {} value, expected an integer", v.value_type()),
                })?;
                swa_pattern(n, n_layer)
            }
            None => match (sliding_window, default_swa_pattern(&arch)) {
                (None, _) | (Some(0), _) => vec![false; n_layer as usize],
                (Some(_), Some(n)) => swa_pattern(u64::from(n), n_layer),
                (Some(_), None) => vec![true; n_layer as usize],
            },
        };

        let recurrent_layers: Vec<bool> = (0..n_layer)
            .map(|l| tensors.iter().any(|t| t.layer == Some(l) && t.role.is_recurrent()))
            .collect();
        let ssm = |k: &str| f.get_u64(&key(&format!("ssm.{k}"))).unwrap_or(0);
        let (d_conv, d_inner, d_state, n_group) = (
            ssm("conv_kernel"),
            ssm("inner_size"),
            ssm("state_size"),
            ssm("group_count"),
        );
        let n_embd_r = d_conv.saturating_sub(1) * (d_inner + 2 * n_group * d_state);
        let n_embd_s = d_state * d_inner;
        let mla = f.get(&key("attention.kv_lora_rank")).is_some() && f.get(&key("attention.key_length_mla")).is_some();

        let head_dim_swa = f
            .get_u64(&key("attention.key_length_swa"))
            .map(|k| (k, f.get_u64(&key("attention.value_length_swa")).unwrap_or(k)));
        let shared_kv = f.get_u64(&key("attention.shared_kv_layers")).unwrap_or(0);
        let kv_layers_end = n_layer.saturating_sub(u32::try_from(shared_kv).unwrap_or(u32::MAX));

        // Next-token-prediction layers (GLM-4.5, Qwen3.5, DeepSeek) follow
        // the trunk in block_count; llama.cpp loads and runs them only for
        // an MTP draft, so the plan is of the trunk.
        let k_nextn = key("nextn_predict_layers");
        let nextn = f.get_u64(&k_nextn).unwrap_or(0);
        if nextn >= u64::from(n_layer) {
            return Err(ModelInfoError::BadValue {
                path,
                key: k_nextn,
                problem: format!("is {nextn}, which leaves none of the {n_layer} layers"),
            });
        }
        let n_layer = n_layer - nextn as u32;
        let trunk = n_layer as usize;
        let (mut n_head, mut n_head_kv, mut n_ff) = (n_head, n_head_kv, n_ff);
        let (mut swa_layers, mut recurrent_layers, mut tensors) = (swa_layers, recurrent_layers, tensors);
        n_head.truncate(trunk);
        n_head_kv.truncate(trunk);
        n_ff.truncate(trunk);
        swa_layers.truncate(trunk);
        recurrent_layers.truncate(trunk);
        tensors.retain(|t| t.layer.map_or(true, |l| l < n_layer));
        let kv_layers_end = kv_layers_end.min(n_layer);
        let tied = crate::tied_output::tied_output(&arch, &tensors);
        let tied_output = tied.is_some();
        tensors.extend(tied);

        Ok(ModelInfo {
            name: f.get_str("general.name").map(str::to_owned),
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
            head_dim_swa,
            kv_layers_end,
            n_ctx_train: f.get_u64(&key("context_length")),
            n_vocab,
            n_expert,
            n_expert_used,
            n_expert_shared,
            n_ff_exp: f.get_u64(&key("expert_feed_forward_length")),
            sliding_window,
            swa_layers,
            recurrent_layers,
            recurrent_state_bytes: 4 * (n_embd_r + n_embd_s),
            mla,
            tensors,
            tied_output,
            architecture: arch,
        })
    }

    fn check_layer(&self, layer: u32) -> Result<usize, ModelInfoError> {
        if layer < self.n_layer {
            Ok(layer as usize)
        } else {
            Err(ModelInfoError::LayerOutOfRange {
                layer,
                n_layer: self.n_layer,
            })
        }
    }

    /// KV heads of `layer`.
    pub fn n_head_kv(&self, layer: u32) -> Result<u32, ModelInfoError> {
        Ok(self.n_head_kv[self.check_layer(layer)?])
    }

    /// K and V head sizes of `layer`: a sliding-window layer's own where
    /// the model has them (`n_embd_head_k(il)` in `llama-hparams.cpp`).
    fn head_dims(&self, layer: u32) -> (u64, u64) {
        match self.head_dim_swa {
            Some(swa) if self.is_swa(layer) => swa,
            _ => (self.head_dim_k, self.head_dim_v),
        }
    }

    /// Width of one token's K row in `layer` (`key_length * n_head_kv`).
    pub fn n_embd_k_gqa(&self, layer: u32) -> Result<u64, ModelInfoError> {
        Ok(self.head_dims(layer).0 * u64::from(self.n_head_kv(layer)?))
    }

    /// Width of one token's V row in `layer` (`value_length * n_head_kv`).
    pub fn n_embd_v_gqa(&self, layer: u32) -> Result<u64, ModelInfoError> {
        Ok(self.head_dims(layer).1 * u64::from(self.n_head_kv(layer)?))
    }

    /// Whether `layer` keeps a KV cache of its own (`has_kv`): not a
    /// recurrent layer, nor one reading an earlier layer's cache.
    pub fn has_kv(&self, layer: u32) -> bool {
        layer < self.kv_layers_end && !self.is_recurrent(layer)
    }

    /// KV-cache bytes one token takes in `layer` with the given cache types:
    /// `row_size(type_k, n_embd_k_gqa) + row_size(type_v, n_embd_v_gqa)`;
    /// the K row alone with MLA, and nothing in a recurrent layer.
    pub fn kv_bytes_per_token(&self, layer: u32, type_k: GgmlType, type_v: GgmlType) -> Result<u64, ModelInfoError> {
        let kv_err = |source| ModelInfoError::KvRow { layer, source };
        if !self.has_kv(layer) {
            // checked like any other layer
            self.check_layer(layer)?;
            return Ok(0);
        }
        let k = row_size(type_k, self.n_embd_k_gqa(layer)?).map_err(kv_err)?;
        let v = if self.mla {
            0
        } else {
            row_size(type_v, self.n_embd_v_gqa(layer)?).map_err(kv_err)?
        };
        k.checked_add(v).ok_or(ModelInfoError::KvRow {
            layer,
            source: SizeError::Overflow,
        })
    }

    /// Whether `layer` uses sliding-window attention.
    pub fn is_swa(&self, layer: u32) -> bool {
        self.swa_layers.get(layer as usize).copied().unwrap_or(false)
    }

    /// Whether `layer` is recurrent (a fixed state instead of a KV cache).
    pub fn is_recurrent(&self, layer: u32) -> bool {
        self.recurrent_layers.get(layer as usize).copied().unwrap_or(false)
    }

    /// Bytes of `layer`'s recurrent state for `n_seq` sequences (0 for an
    /// attention layer): fixed, whatever the context length.
    pub fn state_bytes(&self, layer: u32, n_seq: u64) -> u64 {
        if self.is_recurrent(layer) {
            self.recurrent_state_bytes * n_seq.max(1)
        } else {
            0
        }
    }

    /// The tensors the planner has no role for.
    pub fn unknown_tensors(&self) -> impl Iterator<Item = &ModelTensor> {
        self.tensors.iter().filter(|t| !t.role.is_known())
    }

    /// Whether the model has routed experts.
    pub fn is_moe(&self) -> bool {
        self.n_expert > 0
    }

    /// The tensors of `layer`.
    pub fn layer_tensors(&self, layer: u32) -> impl Iterator<Item = &ModelTensor> {
        self.tensors.iter().filter(move |t| t.layer == Some(layer))
    }

    /// Host bytes of all tensors of `layer`.
    pub fn layer_bytes(&self, layer: u32) -> u64 {
        self.layer_tensors(layer).map(|t| t.nbytes).sum()
    }

    /// Whether `t` is the tied output: the token embedding loaded again as
    /// the output projection, which the file does not hold.
    pub fn is_tied_output(&self, t: &ModelTensor) -> bool {
        self.tied_output && t.name == crate::tied_output::OUTPUT
    }

    /// The tensors the file holds: all but the tied output.
    pub fn file_tensors(&self) -> impl Iterator<Item = &ModelTensor> {
        self.tensors.iter().filter(|t| !self.is_tied_output(t))
    }

    /// Host bytes of the file's tensors.
    pub fn total_bytes(&self) -> u64 {
        self.file_tensors().map(|t| t.nbytes).sum()
    }

    /// Total number of parameters (the file's tensors).
    pub fn n_params(&self) -> u64 {
        self.file_tensors().map(ModelTensor::n_elements).sum()
    }
}

/// Expands an integer SWA pattern as `set_swa_pattern(n, dense_first=false)`
/// does: with `n == 0` every layer is SWA; otherwise every `n`-th layer
/// (the last of each group) is dense.
fn swa_pattern(n: u64, n_layer: u32) -> Vec<bool> {
    (0..u64::from(n_layer)).map(|il| n == 0 || il % n < n - 1).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::GgufArray;
    use crate::writer::GgufWriter;
    use std::io::Cursor;

    fn file(build: impl FnOnce(&mut GgufWriter)) -> GgufFile {
        let mut w = GgufWriter::new();
        build(&mut w);
        let tensors = w.tensors().to_vec();
        let mut s = w.start(Cursor::new(Vec::new())).unwrap();
        for t in &tensors {
            s.write_tensor_data(&t.name, &vec![0u8; t.nbytes as usize]).unwrap();
        }
        let b = s.finish().unwrap().into_inner();
        GgufFile::from_reader(Cursor::new(&b), b.len() as u64, "m.gguf").unwrap()
    }

    #[test]
    fn role_classification() {
        use TensorRole::*;
        let cases = [
            ("token_embd.weight", TokenEmbd, None),
            ("output.weight", Output, None),
            ("output_norm.weight", OutputNorm, None),
            ("blk.0.attn_q.weight", AttnQ, Some(0)),
            ("blk.12.attn_q.bias", AttnQ, Some(12)),
            ("blk.1.attn_k.weight", AttnK, Some(1)),
            ("blk.1.attn_v.weight", AttnV, Some(1)),
            ("blk.1.attn_qkv.weight", AttnQkv, Some(1)),
            ("blk.1.attn_output.weight", AttnOutput, Some(1)),
            ("blk.1.attn_norm.weight", AttnNorm, Some(1)),
            ("blk.1.attn_q_norm.weight", AttnQNorm, Some(1)),
            ("blk.1.attn_k_norm.weight", AttnKNorm, Some(1)),
            ("blk.1.ffn_norm.weight", FfnNorm, Some(1)),
            ("blk.1.ffn_gate.weight", FfnGate, Some(1)),
            ("blk.1.ffn_up.weight", FfnUp, Some(1)),
            ("blk.1.ffn_down.weight", FfnDown, Some(1)),
            ("blk.1.ffn_gate_inp.weight", MoeRouter, Some(1)),
            ("blk.1.ffn_gate_exps.weight", MoeGateExps, Some(1)),
            ("blk.1.ffn_up_exps.weight", MoeUpExps, Some(1)),
            ("blk.1.ffn_down_exps.weight", MoeDownExps, Some(1)),
            ("blk.1.ffn_gate_inp_shexp.weight", SharedExpertRouter, Some(1)),
            ("blk.1.ffn_gate_shexp.weight", SharedExpertGate, Some(1)),
            ("blk.1.ffn_up_shexp.weight", SharedExpertUp, Some(1)),
            ("blk.1.ffn_down_shexp.weight", SharedExpertDown, Some(1)),
            ("blk.1.post_attention_norm.weight", AttnPostNorm, Some(1)),
            ("blk.1.post_ffw_norm.weight", FfnPostNorm, Some(1)),
            ("blk.1.attn_sinks.weight", AttnSinks, Some(1)),
            ("blk.1.attn_gate.weight", AttnGate, Some(1)),
            ("blk.1.attn_q_a.weight", AttnQA, Some(1)),
            ("blk.1.attn_q_b.weight", AttnQB, Some(1)),
            ("blk.1.attn_q_a_norm.weight", AttnQANorm, Some(1)),
            ("blk.1.attn_kv_a_mqa.weight", AttnKvA, Some(1)),
            ("blk.1.attn_kv_a_norm.weight", AttnKvANorm, Some(1)),
            ("blk.1.attn_kv_b.weight", AttnKvB, Some(1)),
            ("blk.1.attn_k_b.weight", AttnKB, Some(1)),
            ("blk.1.attn_v_b.weight", AttnVB, Some(1)),
            ("blk.1.exp_probs_b.bias", MoeSelectionBias, Some(1)),
            ("blk.1.ffn_gate_exps.bias", MoeGateExps, Some(1)),
            ("blk.1.ssm_conv1d.weight", SsmConv, Some(1)),
            ("blk.1.ssm_dt.bias", SsmDt, Some(1)),
            ("blk.1.ssm_a", SsmA, Some(1)),
            ("blk.1.ssm_beta.weight", SsmBeta, Some(1)),
            ("blk.1.ssm_alpha.weight", SsmAlpha, Some(1)),
            ("blk.1.ssm_ba.weight", SsmBetaAlpha, Some(1)),
            ("blk.1.ssm_norm.weight", SsmNorm, Some(1)),
            ("blk.1.ssm_out.weight", SsmOut, Some(1)),
            ("blk.1.ffn_gate_up_exps.weight", MoeGateUpExps, Some(1)),
            ("blk.1.pre_ffw_norm_2.weight", MoePreNorm, Some(1)),
            ("blk.1.post_ffw_norm_1.weight", FfnDensePostNorm, Some(1)),
            ("blk.1.post_ffw_norm_2.weight", MoePostNorm, Some(1)),
            ("blk.1.layer_output_scale.weight", LayerOutScale, Some(1)),
            ("blk.1.ffn_gate_inp.scale", WeightScale, Some(1)),
            ("blk.1.ffn_down_exps.scale", WeightScale, Some(1)),
            ("rope_freqs.weight", RopeFreqs, None),
            ("blk.1.mystery.weight", Other, Some(1)),
            ("v.blk.0.attn_q.weight", Other, None),
            ("blk.x.attn_q.weight", Other, None),
        ];
        for (name, role, layer) in cases {
            assert_eq!(TensorRole::from_name(name), role, "{name}");
            assert_eq!(parse_layer(name).map(|(l, _)| l), layer, "{name}");
        }
    }

    fn base(w: &mut GgufWriter) {
        w.add_kv("general.architecture", "llama").unwrap();
        w.add_kv("llama.block_count", 2u32).unwrap();
        w.add_kv("llama.embedding_length", 64u32).unwrap();
        w.add_kv("llama.feed_forward_length", 128u32).unwrap();
        w.add_kv("llama.attention.head_count", 4u32).unwrap();
        w.add_kv("llama.context_length", 4096u32).unwrap();
    }

    #[test]
    fn dense_model_defaults() {
        let f = file(|w| {
            base(w);
            w.add_kv("tokenizer.ggml.tokens", GgufArray::String(vec!["a".into(); 10]))
                .unwrap();
            w.add_tensor("token_embd.weight", GgmlType::Q8_0, &[64, 10]).unwrap();
            w.add_tensor("blk.0.attn_q.weight", GgmlType::Q4_0, &[64, 64]).unwrap();
            w.add_tensor("blk.1.attn_norm.weight", GgmlType::F32, &[64]).unwrap();
        });
        let m = ModelInfo::from_gguf(&f).unwrap();
        assert_eq!(m.architecture, "llama");
        assert_eq!(m.n_layer, 2);
        assert_eq!(m.n_head, vec![4, 4]);
        assert_eq!(m.n_head_kv, vec![4, 4]);
        assert_eq!(m.head_dim_k, 16);
        assert_eq!(m.n_ff, vec![128, 128]);
        assert_eq!(m.n_ctx_train, Some(4096));
        assert_eq!(m.n_vocab, Some(10));
        assert!(!m.is_moe());
        assert_eq!(m.n_expert_shared, 0);
        assert_eq!(m.swa_layers, vec![false, false]);
        assert_eq!(m.layer_bytes(0), 64 * 64 / 32 * 18);
        assert_eq!(m.layer_bytes(1), 256);
        // 64-wide Q4_0 rows are padded by 448 elements on CUDA
        let q = &m.tensors[1];
        assert_eq!(q.cuda_alloc_size(), q.nbytes + 448 / 32 * 18);
        assert_eq!(m.tensors[2].cuda_alloc_size(), 256);
        assert_eq!(m.total_bytes(), 10 * 2 * 34 + 64 * 64 / 32 * 18 + 256);
        // 16 * 4 = 64 wide K and V rows
        assert_eq!(m.kv_bytes_per_token(0, GgmlType::F16, GgmlType::F16), Ok(256));
        assert_eq!(
            m.kv_bytes_per_token(0, GgmlType::Q8_0, GgmlType::Q4_0),
            Ok(2 * 34 + 2 * 18)
        );
        assert!(matches!(
            m.kv_bytes_per_token(2, GgmlType::F16, GgmlType::F16),
            Err(ModelInfoError::LayerOutOfRange { layer: 2, n_layer: 2 })
        ));
    }

    #[test]
    fn per_layer_kv_heads_head_dims_and_moe() {
        let f = file(|w| {
            base(w);
            w.add_kv("llama.attention.head_count_kv", GgufArray::I32(vec![2, 1]))
                .unwrap();
            w.add_kv("llama.attention.key_length", 32u32).unwrap();
            w.add_kv("llama.attention.value_length", 24u32).unwrap();
            w.add_kv("llama.expert_count", 8u32).unwrap();
            w.add_kv("llama.expert_used_count", 2u32).unwrap();
            w.add_kv("llama.expert_feed_forward_length", 32u32).unwrap();
            w.add_tensor("blk.0.ffn_up_shexp.weight", GgmlType::F16, &[64, 32])
                .unwrap();
        });
        let m = ModelInfo::from_gguf(&f).unwrap();
        assert_eq!(m.n_head_kv, vec![2, 1]);
        assert_eq!(m.n_embd_k_gqa(0), Ok(64));
        assert_eq!(m.n_embd_v_gqa(1), Ok(24));
        assert_eq!(
            m.kv_bytes_per_token(1, GgmlType::F16, GgmlType::F32),
            Ok(32 * 2 + 24 * 4)
        );
        assert!(matches!(
            m.kv_bytes_per_token(1, GgmlType::Q4_K, GgmlType::F16),
            Err(ModelInfoError::KvRow { layer: 1, .. })
        ));
        assert!(m.is_moe());
        assert_eq!((m.n_expert, m.n_expert_used), (8, 2));
        assert_eq!(m.n_expert_shared, 1);
        assert_eq!(m.n_ff_exp, Some(32));
    }

    #[test]
    fn sliding_window_patterns() {
        let f = file(|w| {
            base(w);
            w.add_kv("llama.attention.sliding_window", 512u32).unwrap();
            w.add_kv("llama.attention.sliding_window_pattern", 2u32).unwrap();
        });
        let m = ModelInfo::from_gguf(&f).unwrap();
        assert_eq!(m.sliding_window, Some(512));
        assert_eq!(m.swa_layers, vec![true, false]);
        assert!(m.is_swa(0) && !m.is_swa(1) && !m.is_swa(7));

        let f = file(|w| {
            base(w);
            w.add_kv("llama.attention.sliding_window", 512u32).unwrap();
            w.add_kv(
                "llama.attention.sliding_window_pattern",
                GgufArray::Bool(vec![false, true]),
            )
            .unwrap();
        });
        assert_eq!(ModelInfo::from_gguf(&f).unwrap().swa_layers, vec![false, true]);

        let f = file(|w| {
            base(w);
            w.add_kv("llama.attention.sliding_window", 512u32).unwrap();
        });
        assert_eq!(ModelInfo::from_gguf(&f).unwrap().swa_layers, vec![true, true]);
        assert_eq!(swa_pattern(6, 7), vec![true, true, true, true, true, false, true]);
    }

    #[test]
    fn window_layers_head_sizes_and_shared_kv_layers() {
        // Gemma 4's layout: wider heads in the global layers, the last
        // layers reading an earlier layer's cache.
        let f = file(|w| {
            base(w);
            w.add_kv("llama.attention.head_count_kv", 2u32).unwrap();
            w.add_kv("llama.attention.key_length", 32u32).unwrap();
            w.add_kv("llama.attention.value_length", 32u32).unwrap();
            w.add_kv("llama.attention.key_length_swa", 16u32).unwrap();
            w.add_kv("llama.attention.value_length_swa", 16u32).unwrap();
            w.add_kv("llama.attention.sliding_window", 512u32).unwrap();
            w.add_kv(
                "llama.attention.sliding_window_pattern",
                GgufArray::Bool(vec![false, true]),
            )
            .unwrap();
            w.add_kv("llama.attention.shared_kv_layers", 1u32).unwrap();
        });
        let m = ModelInfo::from_gguf(&f).unwrap();
        assert_eq!(m.head_dim_swa, Some((16, 16)));
        assert_eq!(m.n_embd_k_gqa(0), Ok(64));
        assert_eq!(m.n_embd_v_gqa(1), Ok(32));
        let kv = |l| m.kv_bytes_per_token(l, GgmlType::F16, GgmlType::F16);
        assert_eq!(kv(0), Ok(2 * 2 * 64));
        assert!(m.has_kv(0) && !m.has_kv(1));
        assert_eq!(kv(1), Ok(0));
        assert!(matches!(kv(2), Err(ModelInfoError::LayerOutOfRange { .. })));
    }

    #[test]
    fn next_token_prediction_layers_are_not_planned() {
        let f = file(|w| {
            base(w);
            w.add_kv("llama.nextn_predict_layers", 1u32).unwrap();
            w.add_kv("llama.attention.head_count_kv", GgufArray::I32(vec![2, 1]))
                .unwrap();
            w.add_tensor("blk.0.attn_q.weight", GgmlType::F16, &[64, 64]).unwrap();
            w.add_tensor("blk.1.attn_q.weight", GgmlType::F16, &[64, 64]).unwrap();
            w.add_tensor("blk.1.nextn.eh_proj.weight", GgmlType::F16, &[128, 64])
                .unwrap();
        });
        let m = ModelInfo::from_gguf(&f).unwrap();
        assert_eq!(m.n_layer, 1);
        assert_eq!(m.n_head_kv, vec![2]);
        assert_eq!(m.swa_layers.len(), 1);
        let names: Vec<&str> = m.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["blk.0.attn_q.weight"]);
        let f = file(|w| {
            base(w);
            w.add_kv("llama.nextn_predict_layers", 2u32).unwrap();
        });
        assert!(matches!(
            ModelInfo::from_gguf(&f),
            Err(ModelInfoError::BadValue { key, .. }) if key == "llama.nextn_predict_layers"
        ));
    }

    #[test]
    fn metadata_errors() {
        let f = file(|w| {
            w.add_kv("general.architecture", "llama").unwrap();
        });
        assert!(matches!(
            ModelInfo::from_gguf(&f),
            Err(ModelInfoError::MissingKey { key, .. }) if key == "llama.block_count"
        ));
        let f = file(|_| {});
        assert!(matches!(
            ModelInfo::from_gguf(&f),
            Err(ModelInfoError::MissingArchitecture { .. })
        ));
        let f = file(|w| {
            base(w);
            w.add_kv("llama.attention.head_count_kv", GgufArray::I32(vec![2, 1, 1]))
                .unwrap();
        });
        let e = ModelInfo::from_gguf(&f).unwrap_err();
        assert!(
            e.to_string().contains("has 3 entries but the model has 2 layers"),
            "{e}"
        );
        let f = file(|w| {
            w.add_kv("general.architecture", "llama").unwrap();
            w.add_kv("llama.block_count", "two").unwrap();
        });
        assert!(matches!(ModelInfo::from_gguf(&f), Err(ModelInfoError::BadValue { .. })));
    }
}
