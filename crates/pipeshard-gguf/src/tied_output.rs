//! Tied embeddings: models that ship no `output.weight` and use the token
//! embedding as the output projection (Gemma, SmolLM2, small Qwen3, ...).
//!
//! llama.cpp loads the embedding a second time as the output
//! (`TENSOR_DUPLICATED` in the architectures' `load_tensors`), placed with
//! the output layer; pipeshard's placement patch asks for it by the name
//! [`OUTPUT`]. The loaded tensor keeps the embedding's name, [`EMBEDDING`],
//! which is the name the graph's callbacks see for the output's matmul.

use super::model_info::{ModelTensor, TensorRole};

/// The output projection's name, by which the placement callback is asked
/// for a tied output.
pub const OUTPUT: &str = "output.weight";

/// The token embedding's name, which a tied output keeps once loaded.
pub const EMBEDDING: &str = "token_embd.weight";

/// The architectures (GGUF names) whose loader in the pinned llama.cpp
/// falls back to the duplicated token embedding when `output.weight` is
/// absent (`src/models/*.cpp`). Not the models that compute no logits:
/// encoder-only `t5encoder`, the embedding model `gemma-embedding`, and the
/// BERT family, which have no output projection.
const TYING: &[&str] = &[
    "afmoe",
    "arcee",
    "arctic",
    "bailingmoe3",
    "bloom",
    "chameleon",
    "chatglm",
    "cogvlm",
    "cohere2",
    "cohere2moe",
    "command-r",
    "deci",
    "deepseek",
    "deepseek2",
    "deepseek2-ocr",
    "deepseek32",
    "deepseek4",
    "dflash",
    "dots3note",
    "dream",
    "ernie4_5",
    "exaone",
    "exaone-moe",
    "exaone4",
    "falcon",
    "falcon-h1",
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3n",
    "gemma4",
    "gemma4-assistant",
    "glm-dsa",
    "glm4",
    "glm4moe",
    "gpt2",
    "granite",
    "granite_swa",
    "granitehybrid",
    "granitemoe",
    "graniteswitch",
    "grok",
    "grovemoe",
    "hrm_text",
    "hunyuan-moe",
    "hunyuan_vl",
    "hy_v3",
    "jais2",
    "jamba",
    "laguna",
    "lfm2",
    "lfm2moe",
    "llada",
    "llama",
    "llama4",
    "maincoder",
    "mamba",
    "mamba2",
    "minicpm",
    "minicpm3",
    "minimax-01",
    "mistral3",
    "mpt",
    "nanbeige",
    "nemotron_h",
    "olmo",
    "openelm",
    "pangu-embedded",
    "phi3",
    "plamo2",
    "plamo3",
    "plm",
    "pockettts",
    "qwen2",
    "qwen2vl",
    "qwen3",
    "qwen35",
    "qwen35moe",
    "qwen3moe",
    "qwen3next",
    "qwen3vl",
    "qwen3vlmoe",
    "qwen4exp",
    "refact",
    "rnd1",
    "seed_oss",
    "smallthinker",
    "smollm3",
    "spark2_5",
    "starcoder",
    "starcoder2",
    "t5",
];

/// The output projection llama.cpp loads from the token embedding for a
/// model of architecture `arch` with the file's `tensors`: the embedding's
/// type, shape and bytes under the name [`OUTPUT`]; `None` where the model
/// has its own output, no embedding, or an architecture that does not tie.
pub fn tied_output(arch: &str, tensors: &[ModelTensor]) -> Option<ModelTensor> {
    if !TYING.contains(&arch) || tensors.iter().any(|t| t.name == OUTPUT) {
        return None;
    }
    let embedding = tensors.iter().find(|t| t.name == EMBEDDING)?;
    Some(ModelTensor {
        name: OUTPUT.to_owned(),
        role: TensorRole::Output,
        ..embedding.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::GgmlType;

    fn tensor(name: &str) -> ModelTensor {
        ModelTensor {
            name: name.to_owned(),
            layer: None,
            role: TensorRole::from_name(name),
            ty: GgmlType::Q6_K,
            dims: vec![5376, 262144],
            nbytes: 1_156_055_040,
        }
    }

    #[test]
    fn a_tying_model_without_output_gets_the_embedding_as_its_output() {
        let t = tied_output("gemma3", &[tensor(EMBEDDING)]).unwrap();
        assert_eq!((t.name.as_str(), t.role), (OUTPUT, TensorRole::Output));
        assert_eq!(
            (t.ty, t.dims.clone(), t.nbytes),
            (GgmlType::Q6_K, vec![5376, 262144], 1_156_055_040)
        );
    }

    #[test]
    fn an_own_output_or_an_architecture_without_logits_gets_none() {
        assert_eq!(tied_output("llama", &[tensor(EMBEDDING), tensor(OUTPUT)]), None);
        assert_eq!(tied_output("bert", &[tensor(EMBEDDING)]), None);
        assert_eq!(tied_output("t5encoder", &[tensor(EMBEDDING)]), None);
        assert_eq!(tied_output("gemma3", &[]), None);
    }
}
