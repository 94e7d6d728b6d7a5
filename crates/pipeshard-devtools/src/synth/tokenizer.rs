//! A synthetic but working byte-level BPE tokenizer for random-weight models.
//!
//! The vocabulary has exactly the preset's size: the 256 GPT-2 byte tokens,
//! systematically generated merges (`a b`, `ab c`, …) filling the regular
//! range, and the model family's special tokens at their real ids
//! (`<|begin_of_text|>` = 128000 for Llama 3, `<|im_start|>` = 151644 for
//! Qwen, `<s>` = 1 for Tekken). The metadata follows what llama.cpp's
//! `llama_vocab::impl::load` requires for `tokenizer.ggml.model = "gpt2"`:
//! unique token strings, every regular token made of byte-level characters
//! (so that any sampled token can be detokenized), merges whose halves are
//! tokens, a known pre-tokenizer name and valid special-token ids.

use crate::gguf::{GgufArray, GgufValue};

/// `LLAMA_TOKEN_TYPE_NORMAL`.
pub const TOKEN_TYPE_NORMAL: i32 = 1;
/// `LLAMA_TOKEN_TYPE_CONTROL`.
pub const TOKEN_TYPE_CONTROL: i32 = 3;
/// `LLAMA_TOKEN_TYPE_USER_DEFINED`.
pub const TOKEN_TYPE_USER_DEFINED: i32 = 4;
/// `LLAMA_TOKEN_TYPE_UNUSED`.
pub const TOKEN_TYPE_UNUSED: i32 = 5;

/// Which model family's special tokens, pre-tokenizer and chat template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenizerKind {
    /// Llama 3: `llama-bpe`, 256 specials from `first_special`.
    Llama3,
    /// Qwen 2 / 2.5 / 2.5-VL: `qwen2`, ChatML, `[PAD…]` after the specials.
    Qwen2,
    /// Qwen 3: as Qwen 2 plus the tool-response and think tokens.
    Qwen3,
    /// Mistral Tekken: `tekken`, specials at ids `0..first_special`.
    Tekken,
}

/// Vocabulary layout of a preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenizerSpec {
    /// Family.
    pub kind: TokenizerKind,
    /// Total number of tokens (equals the embedding rows).
    pub n_vocab: u32,
    /// Llama 3 / Qwen: id of the first special token (regular tokens come
    /// before it). Tekken: number of special tokens, which come first.
    pub first_special: u32,
}

/// A generated vocabulary and its GGUF metadata values.
#[derive(Debug, Clone, PartialEq)]
pub struct Vocab {
    /// Token strings, by id.
    pub tokens: Vec<String>,
    /// Token types, by id.
    pub token_types: Vec<i32>,
    /// BPE merges, by rank (`"left right"`).
    pub merges: Vec<String>,
    /// `tokenizer.ggml.pre`.
    pub pre: &'static str,
    /// Beginning-of-sequence id.
    pub bos: u32,
    /// End-of-sequence id.
    pub eos: u32,
    /// End-of-turn id, if distinct.
    pub eot: Option<u32>,
    /// Padding id.
    pub pad: Option<u32>,
    /// Unknown-token id.
    pub unk: Option<u32>,
    /// Whether llama.cpp should prepend BOS.
    pub add_bos: bool,
    /// `tokenizer.chat_template` (Jinja).
    pub chat_template: &'static str,
}

/// Why a vocabulary could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenizerError {
    /// The layout leaves too little room for the byte tokens or specials.
    #[error("vocabulary of {n_vocab} tokens cannot hold {needed} {what}")]
    TooSmall {
        /// The requested size.
        n_vocab: u32,
        /// What did not fit.
        what: &'static str,
        /// How many were needed.
        needed: u32,
    },
}

const LLAMA3_TEMPLATE: &str = "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}";

const CHATML_TEMPLATE: &str = "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

const MISTRAL_TEMPLATE: &str = "{{- bos_token }}{%- for message in messages %}{%- if message['role'] == 'user' %}{{- '[INST]' + message['content'] + '[/INST]' }}{%- elif message['role'] == 'system' %}{{- '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}{%- else %}{{- message['content'] + eos_token }}{%- endif %}{%- endfor %}";

/// GPT-2's `bytes_to_unicode`: the printable character standing for each
/// byte, in GPT-2 vocabulary order (printable bytes first).
pub fn byte_tokens() -> Vec<(u8, char)> {
    let mut printable: Vec<u32> = (u32::from(b'!')..=u32::from(b'~')).collect();
    printable.extend(0xa1..=0xac);
    printable.extend(0xae..=0xff);
    let mut out: Vec<(u8, char)> = printable
        .iter()
        .map(|&b| (b as u8, char::from_u32(b).unwrap_or('?')))
        .collect();
    let mut n = 0u32;
    for b in 0u32..256 {
        if !printable.contains(&b) {
            out.push((b as u8, char::from_u32(256 + n).unwrap_or('?')));
            n += 1;
        }
    }
    out
}

/// Special tokens of a family as `(offset, text, type)`, where the offset is
/// relative to the start of the special range.
fn specials(kind: TokenizerKind) -> Vec<(&'static str, i32)> {
    let c = TOKEN_TYPE_CONTROL;
    let u = TOKEN_TYPE_USER_DEFINED;
    match kind {
        TokenizerKind::Llama3 => vec![
            ("<|begin_of_text|>", c),
            ("<|end_of_text|>", c),
            ("<|reserved_special_token_0|>", c),
            ("<|reserved_special_token_1|>", c),
            ("<|finetune_right_pad_id|>", c),
            ("<|reserved_special_token_2|>", c),
            ("<|start_header_id|>", c),
            ("<|end_header_id|>", c),
            ("<|eom_id|>", c),
            ("<|eot_id|>", c),
            ("<|python_tag|>", c),
        ],
        TokenizerKind::Qwen2 | TokenizerKind::Qwen3 => {
            let mut v = vec![
                ("<|endoftext|>", c),
                ("<|im_start|>", c),
                ("<|im_end|>", c),
                ("<|object_ref_start|>", c),
                ("<|object_ref_end|>", c),
                ("<|box_start|>", c),
                ("<|box_end|>", c),
                ("<|quad_start|>", c),
                ("<|quad_end|>", c),
                ("<|vision_start|>", c),
                ("<|vision_end|>", c),
                ("<|vision_pad|>", c),
                ("<|image_pad|>", c),
                ("<|video_pad|>", c),
                ("<tool_call>", u),
                ("</tool_call>", u),
                ("<|fim_prefix|>", c),
                ("<|fim_middle|>", c),
                ("<|fim_suffix|>", c),
                ("<|fim_pad|>", c),
                ("<|repo_name|>", c),
                ("<|file_sep|>", c),
            ];
            if kind == TokenizerKind::Qwen3 {
                v.extend([
                    ("<tool_response>", u),
                    ("</tool_response>", u),
                    ("<think>", u),
                    ("</think>", u),
                ]);
            }
            v
        }
        TokenizerKind::Tekken => vec![
            ("<unk>", c),
            ("<s>", c),
            ("</s>", c),
            ("[INST]", c),
            ("[/INST]", c),
            ("[AVAILABLE_TOOLS]", c),
            ("[/AVAILABLE_TOOLS]", c),
            ("[TOOL_RESULTS]", c),
            ("[/TOOL_RESULTS]", c),
            ("[TOOL_CALLS]", c),
            ("[IMG]", c),
            ("<pad>", c),
            ("[IMG_BREAK]", c),
            ("[IMG_END]", c),
            ("[PREFIX]", c),
            ("[MIDDLE]", c),
            ("[SUFFIX]", c),
            ("[SYSTEM_PROMPT]", c),
            ("[/SYSTEM_PROMPT]", c),
            ("[TOOL_CONTENT]", c),
        ],
    }
}

/// Generates `n` regular tokens: the 256 byte tokens, then merged tokens
/// built breadth-first over a small alphabet (`Ġ` and `a`–`z`), each with
/// the merge that creates it.
fn regular_tokens(n: usize) -> (Vec<String>, Vec<String>) {
    let mut tokens: Vec<String> = byte_tokens().iter().map(|(_, c)| c.to_string()).collect();
    tokens.truncate(n);
    let mut merges = Vec::new();
    let alphabet: Vec<String> = std::iter::once('\u{120}').chain('a'..='z').map(String::from).collect();
    let mut level: Vec<String> = alphabet.clone();
    'outer: while tokens.len() < n {
        let mut next = Vec::with_capacity(level.len() * alphabet.len());
        for left in &level {
            for right in &alphabet {
                if tokens.len() >= n {
                    break 'outer;
                }
                let t = format!("{left}{right}");
                merges.push(format!("{left} {right}"));
                tokens.push(t.clone());
                next.push(t);
            }
        }
        level = next;
    }
    (tokens, merges)
}

/// Builds the vocabulary for `spec`.
pub fn build(spec: &TokenizerSpec) -> Result<Vocab, TokenizerError> {
    let n_vocab = spec.n_vocab;
    let sp = specials(spec.kind);
    let too_small = |what, needed| TokenizerError::TooSmall { n_vocab, what, needed };
    match spec.kind {
        TokenizerKind::Tekken => {
            let n_special = spec.first_special;
            if n_special < sp.len() as u32 {
                return Err(too_small("named special tokens", sp.len() as u32));
            }
            if n_vocab < n_special + 256 + 1 {
                return Err(too_small("special and byte tokens", n_special + 257));
            }
            let mut tokens = Vec::with_capacity(n_vocab as usize);
            let mut types = Vec::with_capacity(n_vocab as usize);
            for (t, ty) in &sp {
                tokens.push((*t).to_owned());
                types.push(*ty);
            }
            for i in sp.len() as u32..n_special {
                tokens.push(format!("<SPECIAL_{i}>"));
                types.push(TOKEN_TYPE_CONTROL);
            }
            let (regular, merges) = regular_tokens((n_vocab - n_special) as usize);
            types.extend(std::iter::repeat(TOKEN_TYPE_NORMAL).take(regular.len()));
            tokens.extend(regular);
            Ok(Vocab {
                tokens,
                token_types: types,
                merges,
                pre: "tekken",
                bos: 1,
                eos: 2,
                eot: None,
                pad: Some(11),
                unk: Some(0),
                add_bos: true,
                chat_template: MISTRAL_TEMPLATE,
            })
        }
        TokenizerKind::Llama3 | TokenizerKind::Qwen2 | TokenizerKind::Qwen3 => {
            let first = spec.first_special;
            if first < 257 {
                return Err(too_small("byte tokens before the specials", 257));
            }
            let needed = first + sp.len() as u32;
            if n_vocab < needed {
                return Err(too_small("regular and special tokens", needed));
            }
            let (mut tokens, merges) = regular_tokens(first as usize);
            let mut types = vec![TOKEN_TYPE_NORMAL; tokens.len()];
            for (t, ty) in &sp {
                tokens.push((*t).to_owned());
                types.push(*ty);
            }
            let llama = spec.kind == TokenizerKind::Llama3;
            let mut k = 3;
            while tokens.len() < n_vocab as usize {
                if llama {
                    tokens.push(format!("<|reserved_special_token_{k}|>"));
                    types.push(TOKEN_TYPE_CONTROL);
                    k += 1;
                } else {
                    tokens.push(format!("[PAD{}]", tokens.len()));
                    types.push(TOKEN_TYPE_UNUSED);
                }
            }
            Ok(if llama {
                Vocab {
                    tokens,
                    token_types: types,
                    merges,
                    pre: "llama-bpe",
                    bos: first,
                    eos: first + 9,
                    eot: Some(first + 9),
                    pad: None,
                    unk: None,
                    add_bos: true,
                    chat_template: LLAMA3_TEMPLATE,
                }
            } else {
                Vocab {
                    tokens,
                    token_types: types,
                    merges,
                    pre: "qwen2",
                    bos: first,
                    eos: first + 2,
                    eot: Some(first + 2),
                    pad: Some(first),
                    unk: None,
                    add_bos: false,
                    chat_template: CHATML_TEMPLATE,
                }
            })
        }
    }
}

impl Vocab {
    /// The `tokenizer.*` GGUF metadata for this vocabulary.
    pub fn metadata(&self) -> Vec<(String, GgufValue)> {
        let mut kv: Vec<(String, GgufValue)> = vec![
            ("tokenizer.ggml.model".into(), "gpt2".into()),
            ("tokenizer.ggml.pre".into(), self.pre.into()),
            (
                "tokenizer.ggml.tokens".into(),
                GgufArray::String(self.tokens.clone()).into(),
            ),
            (
                "tokenizer.ggml.token_type".into(),
                GgufArray::I32(self.token_types.clone()).into(),
            ),
            (
                "tokenizer.ggml.merges".into(),
                GgufArray::String(self.merges.clone()).into(),
            ),
            ("tokenizer.ggml.bos_token_id".into(), self.bos.into()),
            ("tokenizer.ggml.eos_token_id".into(), self.eos.into()),
        ];
        if let Some(eot) = self.eot {
            kv.push(("tokenizer.ggml.eot_token_id".into(), eot.into()));
        }
        if let Some(pad) = self.pad {
            kv.push(("tokenizer.ggml.padding_token_id".into(), pad.into()));
        }
        if let Some(unk) = self.unk {
            kv.push(("tokenizer.ggml.unknown_token_id".into(), unk.into()));
        }
        kv.push(("tokenizer.ggml.add_bos_token".into(), self.add_bos.into()));
        kv.push(("tokenizer.ggml.add_eos_token".into(), false.into()));
        kv.push(("tokenizer.chat_template".into(), self.chat_template.into()));
        kv
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    fn check(v: &Vocab, n_vocab: u32) {
        assert_eq!(v.tokens.len(), n_vocab as usize);
        assert_eq!(v.token_types.len(), n_vocab as usize);
        let set: HashSet<&String> = v.tokens.iter().collect();
        assert_eq!(set.len(), v.tokens.len(), "token strings must be unique");
        // every merge joins two existing tokens into an existing token, and
        // both halves exist before the merge's rank
        let ids: HashMap<&str, usize> = v.tokens.iter().enumerate().map(|(i, t)| (t.as_str(), i)).collect();
        for m in &v.merges {
            let (l, r) = m.split_once(' ').unwrap();
            assert!(ids.contains_key(l) && ids.contains_key(r), "{m}");
            assert!(ids.contains_key(format!("{l}{r}").as_str()), "{m}");
        }
        // regular tokens are made of byte-level characters only
        let bytechars: HashSet<char> = byte_tokens().iter().map(|(_, c)| *c).collect();
        for (t, &ty) in v.tokens.iter().zip(&v.token_types) {
            if ty == TOKEN_TYPE_NORMAL {
                assert!(t.chars().all(|c| bytechars.contains(&c)), "{t}");
            }
        }
        // all 256 byte tokens present, newline included
        for c in &bytechars {
            assert!(ids.contains_key(c.to_string().as_str()));
        }
        assert!(ids.contains_key("\u{10a}"));
        for id in [Some(v.bos), Some(v.eos), v.eot, v.pad, v.unk].into_iter().flatten() {
            assert!(id < n_vocab);
        }
    }

    #[test]
    fn byte_token_table() {
        let t = byte_tokens();
        assert_eq!(t.len(), 256);
        assert_eq!(t[0], (b'!', '!'));
        let map: HashMap<u8, char> = t.into_iter().collect();
        assert_eq!(map.len(), 256);
        assert_eq!(map[&b' '], '\u{120}');
        assert_eq!(map[&b'\n'], '\u{10a}');
    }

    #[test]
    fn llama3_layout() {
        let spec = TokenizerSpec {
            kind: TokenizerKind::Llama3,
            n_vocab: 128_256,
            first_special: 128_000,
        };
        let v = build(&spec).unwrap();
        check(&v, 128_256);
        assert_eq!(v.tokens[128_000], "<|begin_of_text|>");
        assert_eq!(v.tokens[128_009], "<|eot_id|>");
        assert_eq!(v.tokens[128_011], "<|reserved_special_token_3|>");
        assert_eq!(v.tokens[128_255], "<|reserved_special_token_247|>");
        assert_eq!((v.bos, v.eos), (128_000, 128_009));
        assert_eq!(v.merges.len(), 128_000 - 256);
        assert_eq!(v.pre, "llama-bpe");
    }

    #[test]
    fn qwen_layouts() {
        let v = build(&TokenizerSpec {
            kind: TokenizerKind::Qwen3,
            n_vocab: 151_936,
            first_special: 151_643,
        })
        .unwrap();
        check(&v, 151_936);
        assert_eq!(v.tokens[151_644], "<|im_start|>");
        assert_eq!(v.tokens[151_668], "</think>");
        assert_eq!(v.tokens[151_669], "[PAD151669]");
        assert_eq!(v.token_types[151_669], TOKEN_TYPE_UNUSED);
        assert_eq!(v.eos, 151_645);

        let v = build(&TokenizerSpec {
            kind: TokenizerKind::Qwen2,
            n_vocab: 1280,
            first_special: 1000,
        })
        .unwrap();
        check(&v, 1280);
        assert_eq!(v.tokens[1012], "<|image_pad|>");
    }

    #[test]
    fn tekken_layout() {
        let v = build(&TokenizerSpec {
            kind: TokenizerKind::Tekken,
            n_vocab: 131_072,
            first_special: 1000,
        })
        .unwrap();
        check(&v, 131_072);
        assert_eq!(v.tokens[1], "<s>");
        assert_eq!(v.tokens[999], "<SPECIAL_999>");
        assert_eq!(v.tokens[1000], "!");
        assert_eq!(v.pre, "tekken");
    }

    #[test]
    fn too_small() {
        let e = build(&TokenizerSpec {
            kind: TokenizerKind::Llama3,
            n_vocab: 300,
            first_special: 290,
        });
        assert!(matches!(e, Err(TokenizerError::TooSmall { .. })));
        let e = build(&TokenizerSpec {
            kind: TokenizerKind::Qwen2,
            n_vocab: 300,
            first_special: 200,
        });
        assert!(matches!(e, Err(TokenizerError::TooSmall { .. })));
    }

    #[test]
    fn metadata_keys() {
        let v = build(&TokenizerSpec {
            kind: TokenizerKind::Llama3,
            n_vocab: 1024,
            first_special: 768,
        })
        .unwrap();
        let kv = v.metadata();
        let keys: Vec<&str> = kv.iter().map(|(k, _)| k.as_str()).collect();
        for k in [
            "tokenizer.ggml.model",
            "tokenizer.ggml.pre",
            "tokenizer.ggml.tokens",
            "tokenizer.ggml.token_type",
            "tokenizer.ggml.merges",
            "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id",
            "tokenizer.chat_template",
        ] {
            assert!(keys.contains(&k), "{k}");
        }
    }
}
