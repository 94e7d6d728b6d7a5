//! Architecture presets with the real hyper-parameters of popular models,
//! and tiny variants with the same tensor set for CI.
//!
//! Tensor names and shapes follow llama.cpp's loaders (`src/models/*.cpp`
//! `load_arch_tensors`, `tools/mtmd/clip.cpp`); shapes are listed ggml-style,
//! row length first.

use super::quantize::Init;
use super::tokenizer::{TokenizerKind, TokenizerSpec};
use crate::gguf::GgufArray;
use crate::gguf::GgufValue;

/// Hyper-parameters of one model architecture preset.
#[derive(Debug, Clone, PartialEq)]
pub struct ArchPreset {
    /// Preset name (`llama3.1-8b`, `tiny-qwen3-30b-a3b`, …).
    pub name: &'static str,
    /// `general.architecture` (`llama`, `qwen3`, `qwen3moe`, `qwen2vl`).
    pub arch: &'static str,
    /// Number of transformer blocks.
    pub n_layer: u32,
    /// Hidden size.
    pub n_embd: u64,
    /// Dense FFN size (`feed_forward_length`).
    pub n_ff: u64,
    /// Attention heads.
    pub n_head: u64,
    /// KV heads.
    pub n_head_kv: u64,
    /// Head dimension (K and V).
    pub head_dim: u64,
    /// Vocabulary size.
    pub n_vocab: u64,
    /// Training context length.
    pub n_ctx_train: u32,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Routed experts (0 for dense models).
    pub n_expert: u32,
    /// Experts used per token.
    pub n_expert_used: u32,
    /// Per-expert FFN size.
    pub n_ff_exp: u64,
    /// Whether Q and K have per-head RMS norms (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    /// Whether Q, K and V have biases.
    pub qkv_bias: bool,
    /// Whether the LM head shares the token embedding (no `output.weight`).
    pub tied_embeddings: bool,
    /// M-RoPE sections (`rope.dimension_sections`) for Qwen2-VL models.
    pub rope_sections: Option<[i32; 4]>,
    /// Tokenizer family and layout.
    pub tokenizer: TokenizerSpec,
    /// Vision tower, for models shipped with an mmproj file.
    pub vision: Option<VisionPreset>,
}

/// Hyper-parameters of a Qwen2.5-VL style vision tower (mmproj file).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VisionPreset {
    /// Transformer blocks (`depth`).
    pub n_layer: u32,
    /// Hidden size.
    pub n_embd: u64,
    /// FFN size.
    pub n_ff: u64,
    /// Attention heads.
    pub n_head: u64,
    /// Patch size in pixels.
    pub patch_size: u32,
    /// Nominal image size.
    pub image_size: u32,
    /// Spatial merge factor of the patch merger.
    pub spatial_merge: u32,
    /// Window-attention pattern: every `n_wa_pattern`-th block is full
    /// attention (`fullatt_block_indexes[0] + 1`).
    pub n_wa_pattern: u32,
    /// Output width = the language model's hidden size.
    pub projection_dim: u64,
    /// Norm epsilon.
    pub eps: f32,
}

/// One tensor to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    /// GGUF name.
    pub name: String,
    /// Shape, row length first.
    pub dims: Vec<u64>,
    /// How to fill it.
    pub init: Init,
}

/// Standard deviation of a weight with `fan_in` inputs: half of the usual
/// `1/sqrt(fan_in)` so that activations stay tame through deep stacks of
/// random layers.
fn sigma(fan_in: u64) -> f32 {
    0.5 / (fan_in.max(1) as f32).sqrt()
}

fn weight(name: String, dims: &[u64]) -> TensorSpec {
    TensorSpec {
        init: Init::Random { sigma: sigma(dims[0]) },
        name,
        dims: dims.to_vec(),
    }
}

fn norm(name: String, n: u64) -> TensorSpec {
    TensorSpec {
        name,
        dims: vec![n],
        init: Init::Ones,
    }
}

fn bias(name: String, n: u64) -> TensorSpec {
    TensorSpec {
        name,
        dims: vec![n],
        init: Init::Zeros,
    }
}

const QWEN3_TOK: TokenizerSpec = TokenizerSpec {
    kind: TokenizerKind::Qwen3,
    n_vocab: 151_936,
    first_special: 151_643,
};

const TINY_QWEN3_TOK: TokenizerSpec = TokenizerSpec {
    kind: TokenizerKind::Qwen3,
    n_vocab: 1280,
    first_special: 1000,
};

/// The preset list. Real ones first, then their tiny variants.
fn all_presets() -> Vec<ArchPreset> {
    let llama31 = ArchPreset {
        name: "llama3.1-8b",
        arch: "llama",
        n_layer: 32,
        n_embd: 4096,
        n_ff: 14336,
        n_head: 32,
        n_head_kv: 8,
        head_dim: 128,
        n_vocab: 128_256,
        n_ctx_train: 131_072,
        rope_theta: 500_000.0,
        rms_eps: 1e-5,
        n_expert: 0,
        n_expert_used: 0,
        n_ff_exp: 0,
        qk_norm: false,
        qkv_bias: false,
        tied_embeddings: false,
        rope_sections: None,
        tokenizer: TokenizerSpec {
            kind: TokenizerKind::Llama3,
            n_vocab: 128_256,
            first_special: 128_000,
        },
        vision: None,
    };
    // Llama-3.2-1B: the usual draft model for Llama-3.1-8B (same tokenizer).
    let llama32_1b = ArchPreset {
        name: "llama3.2-1b",
        n_layer: 16,
        n_embd: 2048,
        n_ff: 8192,
        n_head: 32,
        n_head_kv: 8,
        head_dim: 64,
        tied_embeddings: true,
        ..llama31.clone()
    };
    let qwen3_8b = ArchPreset {
        name: "qwen3-8b",
        arch: "qwen3",
        n_layer: 36,
        n_embd: 4096,
        n_ff: 12288,
        n_head: 32,
        n_head_kv: 8,
        head_dim: 128,
        n_vocab: 151_936,
        n_ctx_train: 40_960,
        rope_theta: 1_000_000.0,
        rms_eps: 1e-6,
        qk_norm: true,
        tokenizer: QWEN3_TOK,
        ..llama31.clone()
    };
    let qwen3_30b = ArchPreset {
        name: "qwen3-30b-a3b",
        arch: "qwen3moe",
        n_layer: 48,
        n_embd: 2048,
        n_ff: 6144,
        n_head: 32,
        n_head_kv: 4,
        head_dim: 128,
        n_expert: 128,
        n_expert_used: 8,
        n_ff_exp: 768,
        ..qwen3_8b.clone()
    };
    // Qwen3-0.6B: a draft model for the Qwen3 family (same tokenizer).
    let qwen3_06b = ArchPreset {
        name: "qwen3-0.6b",
        n_layer: 28,
        n_embd: 1024,
        n_ff: 3072,
        n_head: 16,
        n_head_kv: 8,
        head_dim: 128,
        tied_embeddings: true,
        ..qwen3_8b.clone()
    };
    let qwen3_235b = ArchPreset {
        name: "qwen3-235b-a22b",
        n_layer: 94,
        n_embd: 4096,
        n_ff: 12288,
        n_head: 64,
        n_head_kv: 4,
        n_ff_exp: 1536,
        ..qwen3_30b.clone()
    };
    let minitron = ArchPreset {
        name: "mistral-nemo-minitron-8b",
        n_layer: 40,
        n_ff: 11520,
        n_vocab: 131_072,
        n_ctx_train: 8192,
        rope_theta: 1_000_000.0,
        tokenizer: TokenizerSpec {
            kind: TokenizerKind::Tekken,
            n_vocab: 131_072,
            first_special: 1000,
        },
        ..llama31.clone()
    };
    let qwen25vl = ArchPreset {
        name: "qwen2.5-vl-7b",
        arch: "qwen2vl",
        n_layer: 28,
        n_embd: 3584,
        n_ff: 18944,
        n_head: 28,
        n_head_kv: 4,
        head_dim: 128,
        n_vocab: 152_064,
        n_ctx_train: 128_000,
        rope_theta: 1_000_000.0,
        rms_eps: 1e-6,
        qkv_bias: true,
        rope_sections: Some([16, 24, 24, 0]),
        tokenizer: TokenizerSpec {
            kind: TokenizerKind::Qwen2,
            n_vocab: 152_064,
            first_special: 151_643,
        },
        vision: Some(VisionPreset {
            n_layer: 32,
            n_embd: 1280,
            n_ff: 3420,
            n_head: 16,
            patch_size: 14,
            image_size: 560,
            spatial_merge: 2,
            n_wa_pattern: 8,
            projection_dim: 3584,
            eps: 1e-6,
        }),
        ..llama31.clone()
    };

    // Tiny variants: same architecture and tensor set, small dims. Row
    // lengths mix multiples of 256 (K-quants apply) and of 32 only (the
    // upstream fallbacks apply), and 768 % 512 != 0 exercises CUDA padding.
    let tiny_llama = ArchPreset {
        name: "tiny-llama3.1-8b",
        n_layer: 4,
        n_embd: 256,
        n_ff: 768,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_vocab: 1024,
        n_ctx_train: 4096,
        tokenizer: TokenizerSpec {
            kind: TokenizerKind::Llama3,
            n_vocab: 1024,
            first_special: 768,
        },
        ..llama31.clone()
    };
    // A draft for tiny-llama3.1-8b: the same tokenizer, two thin layers.
    let tiny_llama32_1b = ArchPreset {
        name: "tiny-llama3.2-1b",
        n_layer: 2,
        n_ff: 512,
        n_head_kv: 1,
        tied_embeddings: true,
        ..tiny_llama.clone()
    };
    let tiny_qwen3 = ArchPreset {
        name: "tiny-qwen3-8b",
        n_layer: 4,
        n_embd: 256,
        n_ff: 768,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_vocab: 1280,
        n_ctx_train: 4096,
        tokenizer: TINY_QWEN3_TOK,
        ..qwen3_8b.clone()
    };
    let tiny_qwen3_06b = ArchPreset {
        name: "tiny-qwen3-0.6b",
        n_layer: 2,
        n_ff: 512,
        tied_embeddings: true,
        ..tiny_qwen3.clone()
    };
    let tiny_qwen3_30b = ArchPreset {
        name: "tiny-qwen3-30b-a3b",
        n_layer: 4,
        n_embd: 256,
        n_ff: 512,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 128,
        n_vocab: 1280,
        n_ctx_train: 4096,
        n_expert: 16,
        n_expert_used: 4,
        n_ff_exp: 128,
        tokenizer: TINY_QWEN3_TOK,
        ..qwen3_30b.clone()
    };
    let tiny_qwen3_235b = ArchPreset {
        name: "tiny-qwen3-235b-a22b",
        n_layer: 4,
        n_embd: 256,
        n_ff: 768,
        n_head: 8,
        n_head_kv: 2,
        head_dim: 64,
        n_vocab: 1280,
        n_ctx_train: 4096,
        n_expert: 16,
        n_expert_used: 4,
        n_ff_exp: 256,
        tokenizer: TINY_QWEN3_TOK,
        ..qwen3_235b.clone()
    };
    let tiny_minitron = ArchPreset {
        name: "tiny-mistral-nemo-minitron-8b",
        n_layer: 4,
        n_embd: 256,
        n_ff: 640,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_vocab: 1024,
        n_ctx_train: 4096,
        tokenizer: TokenizerSpec {
            kind: TokenizerKind::Tekken,
            n_vocab: 1024,
            first_special: 32,
        },
        ..minitron.clone()
    };
    let tiny_qwen25vl = ArchPreset {
        name: "tiny-qwen2.5-vl-7b",
        n_layer: 4,
        n_embd: 256,
        n_ff: 512,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_vocab: 1280,
        n_ctx_train: 4096,
        rope_sections: Some([8, 12, 12, 0]),
        tokenizer: TokenizerSpec {
            kind: TokenizerKind::Qwen2,
            n_vocab: 1280,
            first_special: 1000,
        },
        vision: Some(VisionPreset {
            n_layer: 4,
            n_embd: 64,
            n_ff: 160,
            n_head: 4,
            patch_size: 14,
            image_size: 560,
            spatial_merge: 2,
            n_wa_pattern: 2,
            projection_dim: 256,
            eps: 1e-6,
        }),
        ..qwen25vl.clone()
    };
    vec![
        llama31,
        llama32_1b,
        qwen3_8b,
        qwen3_06b,
        qwen3_30b,
        qwen3_235b,
        minitron,
        qwen25vl,
        tiny_llama,
        tiny_llama32_1b,
        tiny_qwen3,
        tiny_qwen3_06b,
        tiny_qwen3_30b,
        tiny_qwen3_235b,
        tiny_minitron,
        tiny_qwen25vl,
    ]
}

/// An unknown preset name was given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown preset '{name}'; available presets: {}", available.join(", "))]
pub struct UnknownPreset {
    /// The name asked for.
    pub name: String,
    /// Every valid name.
    pub available: Vec<&'static str>,
}

/// Names of all presets.
pub fn names() -> Vec<&'static str> {
    all_presets().iter().map(|p| p.name).collect()
}

/// All presets.
pub fn all() -> Vec<ArchPreset> {
    all_presets()
}

/// Looks a preset up by name (case-insensitive).
pub fn by_name(name: &str) -> Result<ArchPreset, UnknownPreset> {
    all_presets()
        .into_iter()
        .find(|p| p.name.eq_ignore_ascii_case(name))
        .ok_or_else(|| UnknownPreset {
            name: name.to_owned(),
            available: names(),
        })
}

impl ArchPreset {
    /// Width of the Q projection output (`head_dim * n_head`).
    pub fn n_embd_q(&self) -> u64 {
        self.head_dim * self.n_head
    }

    /// Width of the K and V projection outputs (`head_dim * n_head_kv`).
    pub fn n_embd_kv(&self) -> u64 {
        self.head_dim * self.n_head_kv
    }

    /// Whether the preset has routed experts.
    pub fn is_moe(&self) -> bool {
        self.n_expert > 0
    }

    /// The language model's tensors, in file order (token embedding, blocks,
    /// final norm, LM head), with shapes as llama.cpp's loader expects.
    pub fn tensors(&self) -> Vec<TensorSpec> {
        let e = self.n_embd;
        let q = self.n_embd_q();
        let kv = self.n_embd_kv();
        let mut v = Vec::new();
        v.push(TensorSpec {
            name: "token_embd.weight".into(),
            dims: vec![e, self.n_vocab],
            init: Init::Random { sigma: 0.02 },
        });
        for i in 0..self.n_layer {
            let n = |s: &str| format!("blk.{i}.{s}");
            v.push(norm(n("attn_norm.weight"), e));
            v.push(weight(n("attn_q.weight"), &[e, q]));
            if self.qkv_bias {
                v.push(bias(n("attn_q.bias"), q));
            }
            v.push(weight(n("attn_k.weight"), &[e, kv]));
            if self.qkv_bias {
                v.push(bias(n("attn_k.bias"), kv));
            }
            v.push(weight(n("attn_v.weight"), &[e, kv]));
            if self.qkv_bias {
                v.push(bias(n("attn_v.bias"), kv));
            }
            v.push(weight(n("attn_output.weight"), &[q, e]));
            if self.qk_norm {
                v.push(norm(n("attn_k_norm.weight"), self.head_dim));
                v.push(norm(n("attn_q_norm.weight"), self.head_dim));
            }
            v.push(norm(n("ffn_norm.weight"), e));
            if self.is_moe() {
                let (x, f) = (u64::from(self.n_expert), self.n_ff_exp);
                v.push(weight(n("ffn_gate_inp.weight"), &[e, x]));
                v.push(weight(n("ffn_gate_exps.weight"), &[e, f, x]));
                v.push(weight(n("ffn_down_exps.weight"), &[f, e, x]));
                v.push(weight(n("ffn_up_exps.weight"), &[e, f, x]));
            } else {
                v.push(weight(n("ffn_gate.weight"), &[e, self.n_ff]));
                v.push(weight(n("ffn_down.weight"), &[self.n_ff, e]));
                v.push(weight(n("ffn_up.weight"), &[e, self.n_ff]));
            }
        }
        v.push(norm("output_norm.weight".into(), e));
        if !self.tied_embeddings {
            v.push(weight("output.weight".into(), &[e, self.n_vocab]));
        }
        v
    }

    /// Architecture metadata (`general.*` except file type, and `{arch}.*`).
    pub fn metadata(&self) -> Vec<(String, GgufValue)> {
        let a = self.arch;
        let k = |s: &str| format!("{a}.{s}");
        let u32v = |x: u64| GgufValue::U32(x as u32);
        let mut kv: Vec<(String, GgufValue)> = vec![
            ("general.architecture".into(), a.into()),
            ("general.type".into(), "model".into()),
            (
                "general.name".into(),
                format!("{}{}", super::NAME_PREFIX, self.name).into(),
            ),
            (k("block_count"), self.n_layer.into()),
            (k("context_length"), self.n_ctx_train.into()),
            (k("embedding_length"), u32v(self.n_embd)),
            (k("feed_forward_length"), u32v(self.n_ff)),
            (k("attention.head_count"), u32v(self.n_head)),
            (k("attention.head_count_kv"), u32v(self.n_head_kv)),
            (k("attention.key_length"), u32v(self.head_dim)),
            (k("attention.value_length"), u32v(self.head_dim)),
            (k("rope.dimension_count"), u32v(self.head_dim)),
            (k("rope.freq_base"), self.rope_theta.into()),
            (k("attention.layer_norm_rms_epsilon"), self.rms_eps.into()),
            (k("vocab_size"), u32v(self.n_vocab)),
        ];
        if self.is_moe() {
            kv.push((k("expert_count"), self.n_expert.into()));
            kv.push((k("expert_used_count"), self.n_expert_used.into()));
            kv.push((k("expert_feed_forward_length"), u32v(self.n_ff_exp)));
        }
        if let Some(s) = self.rope_sections {
            kv.push((k("rope.dimension_sections"), GgufArray::I32(s.to_vec()).into()));
        }
        kv
    }

    /// Total parameters of the language model.
    pub fn n_params(&self) -> u64 {
        self.tensors().iter().map(|t| t.dims.iter().product::<u64>()).sum()
    }
}

impl VisionPreset {
    /// The mmproj tensors, with the names `clip.cpp` loads for
    /// `PROJECTOR_TYPE_QWEN25VL` (Q/K/V split, two Conv2D patch kernels,
    /// RMS norms without bias, `mm.0` / `mm.2` merger MLP).
    pub fn tensors(&self) -> Vec<TensorSpec> {
        let e = self.n_embd;
        let p = u64::from(self.patch_size);
        let merged = e * u64::from(self.spatial_merge * self.spatial_merge);
        let mut v = vec![
            weight("v.patch_embd.weight".into(), &[p, p, 3, e]),
            weight("v.patch_embd.weight.1".into(), &[p, p, 3, e]),
        ];
        // patch kernels see p*p*3 inputs
        for t in &mut v {
            t.init = Init::Random {
                sigma: sigma(p * p * 3),
            };
        }
        for i in 0..self.n_layer {
            let n = |s: &str| format!("v.blk.{i}.{s}");
            v.push(norm(n("ln1.weight"), e));
            for qkv in ["attn_q", "attn_k", "attn_v"] {
                v.push(weight(n(&format!("{qkv}.weight")), &[e, e]));
                v.push(bias(n(&format!("{qkv}.bias")), e));
            }
            v.push(weight(n("attn_out.weight"), &[e, e]));
            v.push(bias(n("attn_out.bias"), e));
            v.push(norm(n("ln2.weight"), e));
            v.push(weight(n("ffn_gate.weight"), &[e, self.n_ff]));
            v.push(bias(n("ffn_gate.bias"), self.n_ff));
            v.push(weight(n("ffn_up.weight"), &[e, self.n_ff]));
            v.push(bias(n("ffn_up.bias"), self.n_ff));
            v.push(weight(n("ffn_down.weight"), &[self.n_ff, e]));
            v.push(bias(n("ffn_down.bias"), e));
        }
        v.push(norm("v.post_ln.weight".into(), e));
        v.push(weight("mm.0.weight".into(), &[merged, merged]));
        v.push(bias("mm.0.bias".into(), merged));
        v.push(weight("mm.2.weight".into(), &[merged, self.projection_dim]));
        v.push(bias("mm.2.bias".into(), self.projection_dim));
        v
    }

    /// mmproj metadata (`clip.*`), as `convert_hf_to_gguf.py --mmproj`
    /// writes it for Qwen2.5-VL.
    pub fn metadata(&self, model_name: &str) -> Vec<(String, GgufValue)> {
        let u = |x: u64| GgufValue::U32(x as u32);
        vec![
            ("general.architecture".into(), "clip".into()),
            ("general.type".into(), "mmproj".into()),
            (
                "general.name".into(),
                format!("{}{model_name} mmproj", super::NAME_PREFIX).into(),
            ),
            ("clip.projector_type".into(), "qwen2.5vl_merger".into()),
            ("clip.has_vision_encoder".into(), true.into()),
            ("clip.use_silu".into(), true.into()),
            ("clip.vision.image_size".into(), self.image_size.into()),
            ("clip.vision.patch_size".into(), self.patch_size.into()),
            ("clip.vision.embedding_length".into(), u(self.n_embd)),
            ("clip.vision.feed_forward_length".into(), u(self.n_ff)),
            ("clip.vision.projection_dim".into(), u(self.projection_dim)),
            ("clip.vision.block_count".into(), self.n_layer.into()),
            ("clip.vision.attention.head_count".into(), u(self.n_head)),
            ("clip.vision.attention.layer_norm_epsilon".into(), self.eps.into()),
            ("clip.vision.spatial_merge_size".into(), self.spatial_merge.into()),
            ("clip.vision.n_wa_pattern".into(), self.n_wa_pattern.into()),
            (
                "clip.vision.image_mean".into(),
                GgufArray::F32(vec![0.481_454_66, 0.457_827_5, 0.408_210_73]).into(),
            ),
            (
                "clip.vision.image_std".into(),
                GgufArray::F32(vec![0.268_629_54, 0.261_302_6, 0.275_777_1]).into(),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn lookup_and_helpful_error() {
        assert_eq!(by_name("qwen3-30b-a3b").unwrap().arch, "qwen3moe");
        assert_eq!(by_name("LLAMA3.1-8B").unwrap().n_layer, 32);
        let e = by_name("gpt-5").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("unknown preset 'gpt-5'"), "{msg}");
        assert!(
            msg.contains("llama3.1-8b") && msg.contains("tiny-qwen2.5-vl-7b"),
            "{msg}"
        );
        // every real preset has a tiny twin with the same architecture
        for p in all().iter().filter(|p| !p.name.starts_with("tiny-")) {
            let t = by_name(&format!("tiny-{}", p.name)).unwrap();
            assert_eq!(t.arch, p.arch);
            assert_eq!(t.qk_norm, p.qk_norm);
            assert_eq!(t.qkv_bias, p.qkv_bias);
            assert_eq!(t.is_moe(), p.is_moe());
            assert_eq!(t.vision.is_some(), p.vision.is_some());
            assert_eq!(t.tokenizer.kind, p.tokenizer.kind);
        }
    }

    #[test]
    fn names_are_unique_and_valid() {
        for p in all() {
            let ts = p.tensors();
            let names: HashSet<&str> = ts.iter().map(|t| t.name.as_str()).collect();
            assert_eq!(names.len(), ts.len(), "{}", p.name);
            assert!(ts.iter().all(|t| t.name.len() < 64));
            assert_eq!(p.tokenizer.n_vocab as u64, p.n_vocab, "{}", p.name);
            if let Some(rs) = p.rope_sections {
                assert_eq!(rs.iter().sum::<i32>() as u64 * 2, p.head_dim, "{}", p.name);
            }
        }
    }

    #[test]
    fn llama31_8b_shape() {
        let p = by_name("llama3.1-8b").unwrap();
        let ts = p.tensors();
        assert_eq!(ts.len(), 291);
        let params = p.n_params();
        assert_eq!(params, 8_030_261_248);
        let q = ts.iter().find(|t| t.name == "blk.0.attn_k.weight").unwrap();
        assert_eq!(q.dims, vec![4096, 1024]);
    }

    #[test]
    fn qwen3_presets() {
        let p = by_name("qwen3-8b").unwrap();
        assert_eq!(p.tensors().len(), 3 + 36 * 11);
        let params = p.n_params() as f64;
        assert!((params / 8.19e9 - 1.0).abs() < 0.01, "{params}");

        let p = by_name("qwen3-30b-a3b").unwrap();
        let ts = p.tensors();
        assert_eq!(ts.len(), 3 + 48 * 12);
        let params = p.n_params() as f64;
        assert!((params / 30.5e9 - 1.0).abs() < 0.01, "{params}");
        let up = ts.iter().find(|t| t.name == "blk.0.ffn_up_exps.weight").unwrap();
        assert_eq!(up.dims, vec![2048, 768, 128]);
        let q = ts.iter().find(|t| t.name == "blk.0.attn_q.weight").unwrap();
        assert_eq!(q.dims, vec![2048, 4096]);

        let p = by_name("qwen3-235b-a22b").unwrap();
        let params = p.n_params() as f64;
        assert!((params / 235.1e9 - 1.0).abs() < 0.01, "{params}");
    }

    #[test]
    fn minitron_and_qwen25vl() {
        let p = by_name("mistral-nemo-minitron-8b").unwrap();
        assert_eq!(p.tensors().len(), 3 + 40 * 9);
        let params = p.n_params() as f64;
        assert!((params / 8.41e9 - 1.0).abs() < 0.01, "{params}");

        let p = by_name("qwen2.5-vl-7b").unwrap();
        let ts = p.tensors();
        assert_eq!(ts.len(), 3 + 28 * 12);
        let params = p.n_params() as f64;
        // Qwen2.5-7B language model: 7.61e9 parameters
        assert!((params / 7.61e9 - 1.0).abs() < 0.01, "{params}");
        let v = p.vision.unwrap();
        let vt = v.tensors();
        assert_eq!(vt.len(), 2 + 32 * 16 + 5);
        let vparams: u64 = vt.iter().map(|t| t.dims.iter().product::<u64>()).sum();
        // the HF vision tower has 676.6e6 parameters (one Conv3D kernel)
        assert!((vparams as f64 / 676.6e6 - 1.0).abs() < 0.01, "{vparams}");
        let mm2 = vt.iter().find(|t| t.name == "mm.2.weight").unwrap();
        assert_eq!(mm2.dims, vec![5120, 3584]);
    }
}
