//! Block layouts of the architectures whose layers are not Llama's: the
//! tensors and metadata keys each one's loader in the pinned llama.cpp
//! (`src/models/<arch>.cpp`, `load_arch_hparams` / `load_arch_tensors`)
//! reads.

use super::presets::{bias, norm, weight, ArchPreset, TensorSpec};
use super::quantize::Init;
use crate::gguf::{GgufArray, GgufValue};

/// The layout of a preset's blocks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Family {
    /// Llama-style blocks: what the plain [`ArchPreset`] fields describe.
    Plain,
    /// `gpt-oss`: every layer MoE with biased experts and router, Q/K/V/O
    /// biases, attention sinks, and sliding-window attention in every other
    /// layer (`load_swa_pattern(ml, 2)`).
    GptOss {
        /// `attention.sliding_window`.
        sliding_window: u32,
    },
    /// `gemma3`: Q/K norms, post-attention and post-FFN norms, five
    /// sliding-window layers to one global (`load_swa_pattern(ml, 6)`).
    Gemma3 {
        /// `attention.sliding_window`.
        sliding_window: u32,
    },
    /// `gemma4`, its MoE variant: Q/K norms and a V norm without weight,
    /// five sliding-window layers to one global with wider heads and fewer
    /// KV heads (K and V of one projection there), and in every layer a
    /// dense FFN beside the routed experts (their gate and up in one
    /// tensor), each with its own norms.
    Gemma4(Gemma4),
    /// `qwen35moe`: Gated-DeltaNet (recurrent) layers with one full
    /// attention layer in every `full_attention_interval`, a gated Q
    /// projection, and MoE with a gated shared expert in every layer.
    Qwen35Moe(GatedDeltaNet),
    /// `glm4moe`: Q/K/V biases, a post-attention norm in front of the FFN,
    /// dense leading layers, sigmoid routing with a selection bias, shared
    /// experts.
    Glm4Moe {
        /// `leading_dense_block_count`.
        n_dense_lead: u32,
        /// `expert_shared_count`.
        n_expert_shared: u32,
        /// `rope.dimension_count` (partial rotary).
        n_rot: u64,
    },
    /// `deepseek2`: multi-head latent attention (compressed KV) and MoE
    /// with shared experts after dense leading layers.
    Deepseek2(Mla),
}

/// Gated-DeltaNet dimensions (`ssm.*` keys of `qwen35moe`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GatedDeltaNet {
    /// Every n-th layer is full attention (`full_attention_interval`).
    pub full_attention_interval: u32,
    /// `ssm.conv_kernel`.
    pub conv_kernel: u64,
    /// Key heads (`ssm.group_count`).
    pub n_k_heads: u64,
    /// Value heads (`ssm.time_step_rank`).
    pub n_v_heads: u64,
    /// Key and value head size (`ssm.state_size`).
    pub head_dim: u64,
    /// Shared expert FFN size (`expert_shared_feed_forward_length`).
    pub n_ff_shexp: u64,
    /// `rope.dimension_count` (partial rotary).
    pub n_rot: u64,
}

/// The global layers and the sliding window of `gemma4`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemma4 {
    /// `attention.sliding_window`.
    pub sliding_window: u32,
    /// Every n-th layer is global (`layer_types`), the others slide.
    pub global_interval: u32,
    /// Head size of the global layers (`global_head_dim`); the preset's
    /// `head_dim` is the sliding layers'.
    pub head_dim_global: u64,
    /// KV heads of the global layers (`num_global_key_value_heads`).
    pub n_head_kv_global: u64,
    /// `rope.freq_base_swa`.
    pub rope_theta_swa: f32,
    /// `final_logit_softcapping`.
    pub final_logit_softcapping: f32,
}

impl Gemma4 {
    /// Whether layer `il` uses the sliding window.
    pub fn is_swa(&self, il: u32) -> bool {
        (il + 1) % self.global_interval != 0
    }
}

/// Multi-head latent attention dimensions (`deepseek2`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mla {
    /// `attention.kv_lora_rank`.
    pub kv_lora_rank: u64,
    /// Rotary part of each Q/K head (`rope.dimension_count`).
    pub qk_rope: u64,
    /// Non-rotary part of each Q/K head.
    pub qk_nope: u64,
    /// Value head size.
    pub v_head: u64,
    /// `leading_dense_block_count`.
    pub n_dense_lead: u32,
    /// `expert_shared_count`.
    pub n_expert_shared: u32,
}

impl GatedDeltaNet {
    /// Whether layer `il` is recurrent, as llama.cpp derives it from the
    /// interval.
    pub fn is_recurrent(&self, il: u32) -> bool {
        (il + 1) % self.full_attention_interval != 0
    }

    fn key_dim(&self) -> u64 {
        self.head_dim * self.n_k_heads
    }

    fn value_dim(&self) -> u64 {
        self.head_dim * self.n_v_heads
    }
}

/// The language model's tensors of a preset of a non-plain family.
pub fn tensors(p: &ArchPreset) -> Vec<TensorSpec> {
    let e = p.n_embd;
    let mut v = vec![TensorSpec {
        name: "token_embd.weight".into(),
        dims: vec![e, p.n_vocab],
        init: Init::Random { sigma: 0.02 },
    }];
    if let Family::Gemma4(g) = p.family {
        // the global layers' RoPE frequency factors (upstream: 1 for the
        // rotated quarter, 1e30 for the rest; all rotated here)
        v.push(norm("rope_freqs.weight".into(), g.head_dim_global / 2));
    }
    for i in 0..p.n_layer {
        let n = |s: &str| format!("blk.{i}.{s}");
        match p.family {
            Family::Plain => unreachable!("plain presets lay out their own blocks"),
            Family::GptOss { .. } => gpt_oss_block(p, &n, &mut v),
            Family::Gemma3 { .. } => gemma3_block(p, &n, &mut v),
            Family::Gemma4(g) => gemma4_block(p, &g, i, &n, &mut v),
            Family::Qwen35Moe(g) => qwen35moe_block(p, &g, i, &n, &mut v),
            Family::Glm4Moe {
                n_dense_lead,
                n_expert_shared,
                ..
            } => glm4moe_block(p, i < n_dense_lead, n_expert_shared, &n, &mut v),
            Family::Deepseek2(m) => deepseek2_block(p, &m, i, &n, &mut v),
        }
    }
    v.push(norm("output_norm.weight".into(), e));
    if !p.tied_embeddings {
        v.push(weight("output.weight".into(), &[e, p.n_vocab]));
    }
    v
}

/// Q, K and V projections with optional biases, and the output projection.
fn qkvo(p: &ArchPreset, q_width: u64, with_bias: bool, n: &dyn Fn(&str) -> String, v: &mut Vec<TensorSpec>) {
    let (e, kv) = (p.n_embd, p.n_embd_kv());
    for (t, w) in [("attn_q", q_width), ("attn_k", kv), ("attn_v", kv)] {
        v.push(weight(n(&format!("{t}.weight")), &[e, w]));
        if with_bias {
            v.push(bias(n(&format!("{t}.bias")), w));
        }
    }
    v.push(weight(n("attn_output.weight"), &[p.n_embd_q(), e]));
}

/// Stacked routed experts: gate, up and down.
fn experts(p: &ArchPreset, n: &dyn Fn(&str) -> String, v: &mut Vec<TensorSpec>) {
    let (e, f, x) = (p.n_embd, p.n_ff_exp, u64::from(p.n_expert));
    v.push(weight(n("ffn_gate_inp.weight"), &[e, x]));
    v.push(weight(n("ffn_gate_exps.weight"), &[e, f, x]));
    v.push(weight(n("ffn_down_exps.weight"), &[f, e, x]));
    v.push(weight(n("ffn_up_exps.weight"), &[e, f, x]));
}

/// A dense or shared-expert FFN of width `f` (`suffix` "" or "_shexp").
fn ffn(e: u64, f: u64, suffix: &str, n: &dyn Fn(&str) -> String, v: &mut Vec<TensorSpec>) {
    v.push(weight(n(&format!("ffn_gate{suffix}.weight")), &[e, f]));
    v.push(weight(n(&format!("ffn_down{suffix}.weight")), &[f, e]));
    v.push(weight(n(&format!("ffn_up{suffix}.weight")), &[e, f]));
}

fn gpt_oss_block(p: &ArchPreset, n: &dyn Fn(&str) -> String, v: &mut Vec<TensorSpec>) {
    let (e, f, x) = (p.n_embd, p.n_ff_exp, u64::from(p.n_expert));
    v.push(norm(n("attn_norm.weight"), e));
    v.push(norm(n("post_attention_norm.weight"), e));
    qkvo(p, p.n_embd_q(), true, n, v);
    v.push(bias(n("attn_output.bias"), e));
    v.push(bias(n("attn_sinks.weight"), p.n_head));
    experts(p, n, v);
    v.push(bias(n("ffn_gate_inp.bias"), x));
    for (t, dims) in [
        ("ffn_gate_exps", [f, x]),
        ("ffn_down_exps", [e, x]),
        ("ffn_up_exps", [f, x]),
    ] {
        v.push(TensorSpec {
            name: n(&format!("{t}.bias")),
            dims: dims.to_vec(),
            init: Init::Zeros,
        });
    }
}

fn gemma3_block(p: &ArchPreset, n: &dyn Fn(&str) -> String, v: &mut Vec<TensorSpec>) {
    let e = p.n_embd;
    v.push(norm(n("attn_norm.weight"), e));
    qkvo(p, p.n_embd_q(), false, n, v);
    v.push(norm(n("post_attention_norm.weight"), e));
    v.push(norm(n("attn_k_norm.weight"), p.head_dim));
    v.push(norm(n("attn_q_norm.weight"), p.head_dim));
    v.push(norm(n("ffn_norm.weight"), e));
    ffn(e, p.n_ff, "", n, v);
    v.push(norm(n("post_ffw_norm.weight"), e));
}

fn gemma4_block(p: &ArchPreset, g: &Gemma4, il: u32, n: &dyn Fn(&str) -> String, v: &mut Vec<TensorSpec>) {
    let (e, f, x) = (p.n_embd, p.n_ff_exp, u64::from(p.n_expert));
    let swa = g.is_swa(il);
    let (hd, kv) = if swa {
        (p.head_dim, p.n_head_kv)
    } else {
        (g.head_dim_global, g.n_head_kv_global)
    };
    v.push(norm(n("attn_norm.weight"), e));
    v.push(weight(n("attn_q.weight"), &[e, hd * p.n_head]));
    v.push(weight(n("attn_k.weight"), &[e, hd * kv]));
    if swa {
        // a global layer's V is its K (attention_k_eq_v)
        v.push(weight(n("attn_v.weight"), &[e, hd * kv]));
    }
    v.push(weight(n("attn_output.weight"), &[hd * p.n_head, e]));
    v.push(norm(n("attn_q_norm.weight"), hd));
    v.push(norm(n("attn_k_norm.weight"), hd));
    v.push(norm(n("post_attention_norm.weight"), e));
    v.push(norm(n("layer_output_scale.weight"), 1));
    v.push(norm(n("ffn_norm.weight"), e));
    ffn(e, p.n_ff, "", n, v);
    v.push(norm(n("post_ffw_norm.weight"), e));
    v.push(weight(n("ffn_gate_inp.weight"), &[e, x]));
    v.push(norm(n("ffn_gate_inp.scale"), e));
    v.push(norm(n("pre_ffw_norm_2.weight"), e));
    v.push(norm(n("post_ffw_norm_1.weight"), e));
    v.push(norm(n("post_ffw_norm_2.weight"), e));
    v.push(weight(n("ffn_gate_up_exps.weight"), &[e, 2 * f, x]));
    v.push(weight(n("ffn_down_exps.weight"), &[f, e, x]));
    v.push(norm(n("ffn_down_exps.scale"), x));
}

fn qwen35moe_block(p: &ArchPreset, g: &GatedDeltaNet, il: u32, n: &dyn Fn(&str) -> String, v: &mut Vec<TensorSpec>) {
    let e = p.n_embd;
    v.push(norm(n("attn_norm.weight"), e));
    v.push(norm(n("post_attention_norm.weight"), e));
    if g.is_recurrent(il) {
        let (key, value) = (g.key_dim(), g.value_dim());
        v.push(weight(n("attn_qkv.weight"), &[e, 2 * key + value]));
        v.push(weight(n("attn_gate.weight"), &[e, value]));
        v.push(weight(n("ssm_conv1d.weight"), &[g.conv_kernel, 2 * key + value]));
        v.push(bias(n("ssm_dt.bias"), g.n_v_heads));
        v.push(TensorSpec {
            name: n("ssm_a"),
            dims: vec![g.n_v_heads],
            // no decay: a random positive A would grow the state
            init: Init::Zeros,
        });
        v.push(weight(n("ssm_beta.weight"), &[e, g.n_v_heads]));
        v.push(weight(n("ssm_alpha.weight"), &[e, g.n_v_heads]));
        v.push(norm(n("ssm_norm.weight"), g.head_dim));
        v.push(weight(n("ssm_out.weight"), &[value, e]));
    } else {
        // Q and its output gate come from one projection.
        qkvo(p, 2 * p.n_embd_q(), false, n, v);
        v.push(norm(n("attn_q_norm.weight"), p.head_dim));
        v.push(norm(n("attn_k_norm.weight"), p.head_dim));
    }
    experts(p, n, v);
    v.push(TensorSpec {
        name: n("ffn_gate_inp_shexp.weight"),
        dims: vec![e],
        init: Init::Random { sigma: 0.02 },
    });
    ffn(e, g.n_ff_shexp, "_shexp", n, v);
}

fn glm4moe_block(p: &ArchPreset, dense: bool, shared: u32, n: &dyn Fn(&str) -> String, v: &mut Vec<TensorSpec>) {
    let e = p.n_embd;
    v.push(norm(n("attn_norm.weight"), e));
    qkvo(p, p.n_embd_q(), true, n, v);
    v.push(norm(n("post_attention_norm.weight"), e));
    if dense {
        ffn(e, p.n_ff, "", n, v);
        return;
    }
    experts(p, n, v);
    v.push(bias(n("exp_probs_b.bias"), u64::from(p.n_expert)));
    ffn(e, p.n_ff_exp * u64::from(shared), "_shexp", n, v);
}

fn deepseek2_block(p: &ArchPreset, m: &Mla, il: u32, n: &dyn Fn(&str) -> String, v: &mut Vec<TensorSpec>) {
    let (e, h) = (p.n_embd, p.n_head);
    v.push(norm(n("attn_norm.weight"), e));
    v.push(norm(n("attn_kv_a_norm.weight"), m.kv_lora_rank));
    v.push(weight(n("attn_q.weight"), &[e, h * (m.qk_nope + m.qk_rope)]));
    v.push(weight(n("attn_kv_a_mqa.weight"), &[e, m.kv_lora_rank + m.qk_rope]));
    v.push(weight(n("attn_k_b.weight"), &[m.qk_nope, m.kv_lora_rank, h]));
    v.push(weight(n("attn_v_b.weight"), &[m.kv_lora_rank, m.v_head, h]));
    v.push(weight(n("attn_output.weight"), &[h * m.v_head, e]));
    v.push(norm(n("ffn_norm.weight"), e));
    if il < m.n_dense_lead {
        ffn(e, p.n_ff, "", n, v);
        return;
    }
    experts(p, n, v);
    ffn(e, p.n_ff_exp * u64::from(m.n_expert_shared), "_shexp", n, v);
}

/// Sets `key` in `kv`, replacing an earlier value.
fn set(kv: &mut Vec<(String, GgufValue)>, key: String, value: GgufValue) {
    match kv.iter_mut().find(|(k, _)| *k == key) {
        Some(slot) => slot.1 = value,
        None => kv.push((key, value)),
    }
}

/// Adds and overrides the `{arch}.*` keys a family's loader reads.
pub fn metadata(p: &ArchPreset, kv: &mut Vec<(String, GgufValue)>) {
    let k = |s: &str| format!("{}.{s}", p.arch);
    let u = |x: u64| GgufValue::U32(x as u32);
    set(kv, k("rope.dimension_count"), u(p.n_rot()));
    match p.family {
        Family::Plain => {}
        Family::GptOss { sliding_window } => {
            set(kv, k("attention.sliding_window"), sliding_window.into());
        }
        Family::Gemma3 { sliding_window } => {
            set(kv, k("attention.sliding_window"), sliding_window.into());
        }
        Family::Gemma4(g) => {
            let global = |il: u32| !g.is_swa(il);
            let heads_kv = (0..p.n_layer)
                .map(|il| if global(il) { g.n_head_kv_global } else { p.n_head_kv } as i32)
                .collect();
            let pattern = (0..p.n_layer).map(|il| g.is_swa(il)).collect();
            set(kv, k("attention.head_count_kv"), GgufArray::I32(heads_kv).into());
            set(kv, k("attention.sliding_window"), g.sliding_window.into());
            set(
                kv,
                k("attention.sliding_window_pattern"),
                GgufArray::Bool(pattern).into(),
            );
            set(kv, k("attention.key_length"), u(g.head_dim_global));
            set(kv, k("attention.value_length"), u(g.head_dim_global));
            set(kv, k("attention.key_length_swa"), u(p.head_dim));
            set(kv, k("attention.value_length_swa"), u(p.head_dim));
            set(kv, k("attention.shared_kv_layers"), 0u32.into());
            set(kv, k("rope.dimension_count_swa"), u(p.head_dim));
            set(kv, k("rope.freq_base_swa"), g.rope_theta_swa.into());
            set(kv, k("embedding_length_per_layer_input"), 0u32.into());
            set(kv, k("final_logit_softcapping"), g.final_logit_softcapping.into());
        }
        Family::Qwen35Moe(g) => {
            set(kv, k("expert_shared_feed_forward_length"), u(g.n_ff_shexp));
            set(kv, k("ssm.conv_kernel"), u(g.conv_kernel));
            set(kv, k("ssm.inner_size"), u(g.value_dim()));
            set(kv, k("ssm.state_size"), u(g.head_dim));
            set(kv, k("ssm.time_step_rank"), u(g.n_v_heads));
            set(kv, k("ssm.group_count"), u(g.n_k_heads));
            set(kv, k("full_attention_interval"), g.full_attention_interval.into());
        }
        Family::Glm4Moe {
            n_dense_lead,
            n_expert_shared,
            ..
        } => {
            set(kv, k("leading_dense_block_count"), n_dense_lead.into());
            set(kv, k("expert_shared_count"), n_expert_shared.into());
            set(kv, k("expert_weights_norm"), true.into());
            set(kv, k("expert_weights_scale"), 1.0f32.into());
            // LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
            set(kv, k("expert_gating_func"), 2u32.into());
        }
        Family::Deepseek2(m) => {
            // The loader's MLA layout: one KV head holding the compressed
            // latent and the rotary part; V is a view of it.
            set(kv, k("attention.head_count_kv"), 1u32.into());
            set(kv, k("attention.key_length"), u(m.kv_lora_rank + m.qk_rope));
            set(kv, k("attention.value_length"), u(m.kv_lora_rank));
            set(kv, k("attention.key_length_mla"), u(m.qk_nope + m.qk_rope));
            set(kv, k("attention.value_length_mla"), u(m.v_head));
            set(kv, k("attention.kv_lora_rank"), u(m.kv_lora_rank));
            set(kv, k("attention.q_lora_rank"), 0u32.into());
            set(kv, k("leading_dense_block_count"), m.n_dense_lead.into());
            set(kv, k("expert_shared_count"), m.n_expert_shared.into());
            set(kv, k("expert_weights_scale"), 1.0f32.into());
            // LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX
            set(kv, k("expert_gating_func"), 1u32.into());
        }
    }
}
