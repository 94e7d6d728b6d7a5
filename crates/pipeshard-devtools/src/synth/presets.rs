//! Architecture presets with the real hyper-parameters of popular models,
//! and tiny variants with the same tensor set for CI.
//!
//! Tensor names and shapes follow llama.cpp's loaders (`src/models/*.cpp`
//! `load_arch_tensors`, `tools/mtmd/clip.cpp`); shapes are listed ggml-style,
//! row length first.

pub use super::families::{Family, GatedDeltaNet, Gemma4, Mla};
use super::quantize::Init;
use super::tokenizer::{TokenizerKind, TokenizerSpec};
use crate::gguf::GgufArray;
use crate::gguf::GgufValue;

/// Hyper-parameters of one model architecture preset.
#[derive(Debug, Clone, PartialEq)]
pub struct ArchPreset {
    /// Preset name (`llama3.1-8b`, `tiny-qwen3-30b-a3b`, …).
    pub name: &'static str,
    /// `general.architecture` (`llama`, `qwen3`, `qwen3moe`, `qwen2vl`,
    /// `gpt-oss`, `qwen35moe`, `gemma3`, `gemma4`, `glm4moe`, `deepseek2`).
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
    /// Block layout beyond the fields above.
    pub family: Family,
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

pub(super) fn weight(name: String, dims: &[u64]) -> TensorSpec {
    TensorSpec {
        init: Init::Random { sigma: sigma(dims[0]) },
        name,
        dims: dims.to_vec(),
    }
}

pub(super) fn norm(name: String, n: u64) -> TensorSpec {
    TensorSpec {
        name,
        dims: vec![n],
        init: Init::Ones,
    }
}

pub(super) fn bias(name: String, n: u64) -> TensorSpec {
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
        family: Family::Plain,
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
    // The models of 2026. Each preset cites the published configuration its
    // hyper-parameters were checked against; the architecture names are
    // those of the pinned llama.cpp's `src/llama-arch.cpp`. The tokenizers
    // are synth's own byte-level BPE at the real vocabulary size.

    // openai/gpt-oss-20b, config.json
    // (https://huggingface.co/openai/gpt-oss-20b/blob/main/config.json):
    // 24 layers, hidden 2880, 64 heads of 64, 8 KV heads, 32 experts top-4
    // of 2880, sliding window 128 in every other layer, vocab 201088,
    // rope_theta 150000, rms_norm_eps 1e-5, attention_bias true. The experts
    // are MXFP4 upstream; synth writes them in the scheme's type.
    let gpt_oss_20b = ArchPreset {
        name: "gpt-oss-20b",
        arch: "gpt-oss",
        n_layer: 24,
        n_embd: 2880,
        n_ff: 2880,
        n_head: 64,
        n_head_kv: 8,
        head_dim: 64,
        n_vocab: 201_088,
        n_ctx_train: 131_072,
        rope_theta: 150_000.0,
        rms_eps: 1e-5,
        n_expert: 32,
        n_expert_used: 4,
        n_ff_exp: 2880,
        qk_norm: false,
        qkv_bias: true,
        tied_embeddings: false,
        rope_sections: None,
        tokenizer: TokenizerSpec {
            kind: TokenizerKind::Qwen2,
            n_vocab: 201_088,
            first_special: 199_998,
        },
        vision: None,
        family: Family::GptOss { sliding_window: 128 },
    };
    // openai/gpt-oss-120b, config.json
    // (https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json):
    // as gpt-oss-20b with 36 layers and 128 experts.
    let gpt_oss_120b = ArchPreset {
        name: "gpt-oss-120b",
        n_layer: 36,
        n_expert: 128,
        ..gpt_oss_20b.clone()
    };
    // Qwen/Qwen3.6-35B-A3B, config.json text_config
    // (https://huggingface.co/Qwen/Qwen3.6-35B-A3B/blob/main/config.json),
    // model_type qwen3_5_moe: 40 layers, hidden 2048, full attention every
    // 4th layer (16 heads of 256, 2 KV heads, partial_rotary_factor 0.25,
    // mrope_section [11, 11, 10]), Gated-DeltaNet elsewhere (16 key heads,
    // 32 value heads of 128, conv kernel 4), 256 experts top-8 of 512 and a
    // shared expert of 512, vocab 248320, rope_theta 1e7, rms_norm_eps 1e-6.
    let qwen36_35b = ArchPreset {
        name: "qwen3.6-35b-a3b",
        arch: "qwen35moe",
        n_layer: 40,
        n_embd: 2048,
        n_ff: 512,
        n_head: 16,
        n_head_kv: 2,
        head_dim: 256,
        n_vocab: 248_320,
        n_ctx_train: 262_144,
        rope_theta: 10_000_000.0,
        rms_eps: 1e-6,
        n_expert: 256,
        n_expert_used: 8,
        n_ff_exp: 512,
        qk_norm: true,
        qkv_bias: false,
        tied_embeddings: false,
        rope_sections: Some([11, 11, 10, 0]),
        tokenizer: TokenizerSpec {
            kind: TokenizerKind::Qwen3,
            n_vocab: 248_320,
            first_special: 248_044,
        },
        vision: None,
        family: Family::Qwen35Moe(GatedDeltaNet {
            full_attention_interval: 4,
            conv_kernel: 4,
            n_k_heads: 16,
            n_v_heads: 32,
            head_dim: 128,
            n_ff_shexp: 512,
            n_rot: 64,
        }),
    };
    // google/gemma-3-27b-it, config.json text_config
    // (https://huggingface.co/google/gemma-3-27b-it/blob/main/config.json):
    // 62 layers, hidden 5376, FFN 21504, 32 heads of 128, 16 KV heads,
    // sliding window 1024 in five layers of six, vocab 262208, tied
    // embeddings, rope_theta 1e6, rms_norm_eps 1e-6.
    let gemma3_27b = ArchPreset {
        name: "gemma-3-27b",
        arch: "gemma3",
        n_layer: 62,
        n_embd: 5376,
        n_ff: 21504,
        n_head: 32,
        n_head_kv: 16,
        head_dim: 128,
        n_vocab: 262_208,
        n_ctx_train: 131_072,
        rope_theta: 1_000_000.0,
        rms_eps: 1e-6,
        n_expert: 0,
        n_expert_used: 0,
        n_ff_exp: 0,
        qk_norm: true,
        qkv_bias: false,
        tied_embeddings: true,
        rope_sections: None,
        tokenizer: TokenizerSpec {
            kind: TokenizerKind::Llama3,
            n_vocab: 262_208,
            first_special: 261_952,
        },
        vision: None,
        family: Family::Gemma3 { sliding_window: 1024 },
    };
    // google/gemma-4-26B-A4B-it, config.json text_config
    // (https://huggingface.co/google/gemma-4-26B-A4B-it/blob/main/config.json),
    // model_type gemma4_text, checked against the GGUF metadata of
    // `ollama.com/library/gemma4:26b-a4b-it-q4_K_M`: 30 layers, hidden 2816,
    // dense FFN 2112 in every layer beside 128 experts top-8 of 704, 16
    // heads; sliding window 1024 in five layers of six with 8 KV heads of
    // 256, the global layers 2 KV heads of 512 (global_head_dim) with K and
    // V of one projection (attention_k_eq_v), no per-layer embeddings
    // (hidden_size_per_layer_input 0) nor shared KV layers, vocab 262144,
    // tied embeddings, rope_theta 1e6 (global) and 1e4 (sliding),
    // rms_norm_eps 1e-6, final_logit_softcapping 30. The language model has
    // 25.23e9 parameters (the card's 25.2B; Ollama's 25.8B adds the
    // vision tower).
    let gemma4_26b = ArchPreset {
        name: "gemma-4-26b-a4b",
        arch: "gemma4",
        n_layer: 30,
        n_embd: 2816,
        n_ff: 2112,
        n_head: 16,
        n_head_kv: 8,
        head_dim: 256,
        n_vocab: 262_144,
        n_ctx_train: 262_144,
        rope_theta: 1_000_000.0,
        rms_eps: 1e-6,
        n_expert: 128,
        n_expert_used: 8,
        n_ff_exp: 704,
        qk_norm: true,
        qkv_bias: false,
        tied_embeddings: true,
        rope_sections: None,
        tokenizer: TokenizerSpec {
            kind: TokenizerKind::Llama3,
            n_vocab: 262_144,
            first_special: 261_888,
        },
        vision: None,
        family: Family::Gemma4(Gemma4 {
            sliding_window: 1024,
            global_interval: 6,
            head_dim_global: 512,
            n_head_kv_global: 2,
            rope_theta_swa: 10_000.0,
            final_logit_softcapping: 30.0,
        }),
    };
    // zai-org/GLM-4.5-Air, config.json
    // (https://huggingface.co/zai-org/GLM-4.5-Air/blob/main/config.json):
    // 46 layers (the first dense, FFN 10944), hidden 4096, 96 heads of 128,
    // 8 KV heads, partial_rotary_factor 0.5, attention_bias true, no QK
    // norm, 128 experts top-8 of 1408 and 1 shared expert, vocab 151552,
    // rope_theta 1e6, rms_norm_eps 1e-5. Its next-token-prediction layer
    // (num_nextn_predict_layers 1), which llama.cpp skips unless asked to
    // load it, is not written.
    let glm45_air = ArchPreset {
        name: "glm-4.5-air",
        arch: "glm4moe",
        n_layer: 46,
        n_embd: 4096,
        n_ff: 10944,
        n_head: 96,
        n_head_kv: 8,
        head_dim: 128,
        n_vocab: 151_552,
        n_ctx_train: 131_072,
        rope_theta: 1_000_000.0,
        rms_eps: 1e-5,
        n_expert: 128,
        n_expert_used: 8,
        n_ff_exp: 1408,
        qk_norm: false,
        qkv_bias: true,
        tied_embeddings: false,
        rope_sections: None,
        tokenizer: TokenizerSpec {
            kind: TokenizerKind::Qwen2,
            n_vocab: 151_552,
            first_special: 151_329,
        },
        vision: None,
        family: Family::Glm4Moe {
            n_dense_lead: 1,
            n_expert_shared: 1,
            n_rot: 64,
        },
    };
    // deepseek-ai/DeepSeek-V2-Lite, config.json
    // (https://huggingface.co/deepseek-ai/DeepSeek-V2-Lite/blob/main/config.json):
    // 27 layers (the first dense, FFN 10944), hidden 2048, 16 heads, MLA
    // with kv_lora_rank 512, no q_lora_rank, qk_nope_head_dim 128,
    // qk_rope_head_dim 64, v_head_dim 128; 64 experts top-6 of 1408 and 2
    // shared experts, vocab 102400, rope_theta 10000, rms_norm_eps 1e-6.
    let deepseek_v2_lite = ArchPreset {
        name: "deepseek-v2-lite",
        arch: "deepseek2",
        n_layer: 27,
        n_embd: 2048,
        n_ff: 10944,
        n_head: 16,
        n_head_kv: 16,
        head_dim: 192,
        n_vocab: 102_400,
        n_ctx_train: 163_840,
        rope_theta: 10_000.0,
        rms_eps: 1e-6,
        n_expert: 64,
        n_expert_used: 6,
        n_ff_exp: 1408,
        qk_norm: false,
        qkv_bias: false,
        tied_embeddings: false,
        rope_sections: None,
        tokenizer: TokenizerSpec {
            kind: TokenizerKind::Llama3,
            n_vocab: 102_400,
            first_special: 100_000,
        },
        vision: None,
        family: Family::Deepseek2(Mla {
            kv_lora_rank: 512,
            qk_rope: 64,
            qk_nope: 128,
            v_head: 128,
            n_dense_lead: 1,
            n_expert_shared: 2,
        }),
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
    // Tiny twins of the models of 2026: every tensor role of the real one,
    // windows and state small enough that a short context exercises them.
    let tiny_gpt_oss_20b = ArchPreset {
        name: "tiny-gpt-oss-20b",
        n_layer: 4,
        n_embd: 256,
        n_ff: 128,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_vocab: 1280,
        n_ctx_train: 4096,
        n_expert: 8,
        n_expert_used: 2,
        n_ff_exp: 128,
        tokenizer: TokenizerSpec {
            kind: TokenizerKind::Qwen2,
            n_vocab: 1280,
            first_special: 1000,
        },
        family: Family::GptOss { sliding_window: 32 },
        ..gpt_oss_20b.clone()
    };
    let tiny_gpt_oss_120b = ArchPreset {
        name: "tiny-gpt-oss-120b",
        n_layer: 6,
        n_expert: 16,
        n_expert_used: 4,
        ..tiny_gpt_oss_20b.clone()
    };
    let tiny_qwen36_35b = ArchPreset {
        name: "tiny-qwen3.6-35b-a3b",
        n_layer: 4,
        n_embd: 256,
        n_ff: 128,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_vocab: 1280,
        n_ctx_train: 4096,
        n_expert: 16,
        n_expert_used: 4,
        n_ff_exp: 128,
        rope_sections: Some([3, 3, 2, 0]),
        tokenizer: TINY_QWEN3_TOK,
        family: Family::Qwen35Moe(GatedDeltaNet {
            full_attention_interval: 4,
            conv_kernel: 4,
            n_k_heads: 2,
            n_v_heads: 4,
            head_dim: 64,
            n_ff_shexp: 128,
            n_rot: 16,
        }),
        ..qwen36_35b.clone()
    };
    let tiny_gemma3_27b = ArchPreset {
        name: "tiny-gemma-3-27b",
        n_layer: 6,
        n_embd: 256,
        n_ff: 512,
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
        family: Family::Gemma3 { sliding_window: 32 },
        ..gemma3_27b.clone()
    };
    let tiny_gemma4_26b = ArchPreset {
        name: "tiny-gemma-4-26b-a4b",
        n_layer: 6,
        n_embd: 256,
        n_ff: 256,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_vocab: 1024,
        n_ctx_train: 4096,
        n_expert: 16,
        n_expert_used: 4,
        n_ff_exp: 128,
        tokenizer: TokenizerSpec {
            kind: TokenizerKind::Llama3,
            n_vocab: 1024,
            first_special: 768,
        },
        family: Family::Gemma4(Gemma4 {
            sliding_window: 32,
            global_interval: 6,
            head_dim_global: 128,
            n_head_kv_global: 1,
            rope_theta_swa: 10_000.0,
            final_logit_softcapping: 30.0,
        }),
        ..gemma4_26b.clone()
    };
    let tiny_glm45_air = ArchPreset {
        name: "tiny-glm-4.5-air",
        n_layer: 3,
        n_embd: 256,
        n_ff: 512,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_vocab: 1280,
        n_ctx_train: 4096,
        n_expert: 16,
        n_expert_used: 4,
        n_ff_exp: 128,
        tokenizer: TokenizerSpec {
            kind: TokenizerKind::Qwen2,
            n_vocab: 1280,
            first_special: 1000,
        },
        family: Family::Glm4Moe {
            n_dense_lead: 1,
            n_expert_shared: 1,
            n_rot: 32,
        },
        ..glm45_air.clone()
    };
    let tiny_deepseek_v2_lite = ArchPreset {
        name: "tiny-deepseek-v2-lite",
        n_layer: 3,
        n_embd: 256,
        n_ff: 512,
        n_head: 4,
        n_head_kv: 4,
        head_dim: 96,
        n_vocab: 1280,
        n_ctx_train: 4096,
        n_expert: 16,
        n_expert_used: 4,
        n_ff_exp: 128,
        tokenizer: TokenizerSpec {
            kind: TokenizerKind::Llama3,
            n_vocab: 1280,
            first_special: 1024,
        },
        family: Family::Deepseek2(Mla {
            kv_lora_rank: 64,
            qk_rope: 32,
            qk_nope: 64,
            v_head: 64,
            n_dense_lead: 1,
            n_expert_shared: 2,
        }),
        ..deepseek_v2_lite.clone()
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
        gpt_oss_20b,
        gpt_oss_120b,
        qwen36_35b,
        gemma3_27b,
        gemma4_26b,
        glm45_air,
        deepseek_v2_lite,
        tiny_llama,
        tiny_llama32_1b,
        tiny_qwen3,
        tiny_qwen3_06b,
        tiny_qwen3_30b,
        tiny_qwen3_235b,
        tiny_minitron,
        tiny_qwen25vl,
        tiny_gpt_oss_20b,
        tiny_gpt_oss_120b,
        tiny_qwen36_35b,
        tiny_gemma3_27b,
        tiny_gemma4_26b,
        tiny_glm45_air,
        tiny_deepseek_v2_lite,
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

    /// Rotary dimensions of each head (`rope.dimension_count`).
    pub fn n_rot(&self) -> u64 {
        match self.family {
            Family::Qwen35Moe(g) => g.n_rot,
            Family::Glm4Moe { n_rot, .. } => n_rot,
            Family::Deepseek2(m) => m.qk_rope,
            Family::Gemma4(g) => g.head_dim_global,
            Family::Plain | Family::GptOss { .. } | Family::Gemma3 { .. } => self.head_dim,
        }
    }

    /// Whether the preset has routed experts.
    pub fn is_moe(&self) -> bool {
        self.n_expert > 0
    }

    /// The language model's tensors, in file order (token embedding, blocks,
    /// final norm, LM head), with shapes as llama.cpp's loader expects.
    pub fn tensors(&self) -> Vec<TensorSpec> {
        if self.family != Family::Plain {
            return super::families::tensors(self);
        }
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
        super::families::metadata(self, &mut kv);
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
                assert_eq!(rs.iter().sum::<i32>() as u64 * 2, p.n_rot(), "{}", p.name);
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
    fn models_of_2026_match_their_published_sizes() {
        // gpt-oss: the model card's exact counts (biases and sinks included)
        assert_eq!(by_name("gpt-oss-20b").unwrap().n_params(), 20_914_757_184);
        assert_eq!(by_name("gpt-oss-120b").unwrap().n_params(), 116_829_156_672);
        // the language models without vision towers and MTP layers
        for (name, billions) in [
            ("qwen3.6-35b-a3b", 34.66),
            ("gemma-3-27b", 27.01),
            ("gemma-4-26b-a4b", 25.23),
            ("glm-4.5-air", 106.85),
            ("deepseek-v2-lite", 15.71),
        ] {
            let params = by_name(name).unwrap().n_params() as f64 / 1e9;
            assert!((params / billions - 1.0).abs() < 0.005, "{name}: {params}");
        }
        let p = by_name("qwen3.6-35b-a3b").unwrap();
        let ts = p.tensors();
        let has = |n: &str| ts.iter().any(|t| t.name == n);
        // layers 0-2 recurrent, 3 full attention
        assert!(has("blk.0.ssm_conv1d.weight") && has("blk.0.ssm_a") && !has("blk.0.attn_q.weight"));
        assert!(has("blk.3.attn_q.weight") && !has("blk.3.ssm_out.weight"));
        let q = ts.iter().find(|t| t.name == "blk.3.attn_q.weight").unwrap();
        assert_eq!(q.dims, vec![2048, 2 * 16 * 256]);
        let p = by_name("deepseek-v2-lite").unwrap();
        let ts = p.tensors();
        let kb = ts.iter().find(|t| t.name == "blk.1.attn_k_b.weight").unwrap();
        assert_eq!(kb.dims, vec![128, 512, 16]);
        assert!(ts.iter().any(|t| t.name == "blk.0.ffn_up.weight"));
        assert!(ts.iter().any(|t| t.name == "blk.1.ffn_up_shexp.weight"));
        let meta = p.metadata();
        let get = |k: &str| meta.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("deepseek2.attention.key_length"), Some(GgufValue::U32(576)));
        assert_eq!(get("deepseek2.attention.head_count_kv"), Some(GgufValue::U32(1)));
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
