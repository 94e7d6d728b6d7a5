//! The safe engine on the real default model, on the CPU.

mod common;

use pipeshard::engine::{
    apply_chat_template, buffer_types, ChatMessage, Context, ContextParams, FlashAttention, Model, SamplingParams,
    Token,
};
use pipeshard::generate::{generate, GenerateRequest, StopReason};

fn ctx_params() -> ContextParams {
    ContextParams {
        n_ctx: 1024,
        n_batch: 256,
        n_ubatch: 128,
        n_threads: Some(2),
        ..Default::default()
    }
}

fn greedy(model: &Model, prompt: &str, n: usize) -> (Vec<Token>, String) {
    let mut ctx = Context::new(model, ctx_params()).unwrap();
    let req = GenerateRequest::new(
        model.tokenize(prompt, true, false).unwrap(),
        n,
        SamplingParams::greedy(),
    );
    let mut streamed = String::new();
    let out = generate(&mut ctx, &req, |p| {
        streamed.push_str(p);
        true
    })
    .unwrap();
    assert_eq!(streamed, out.text, "streamed pieces add up to the text");
    (out.tokens, out.text)
}

/// The plain path: decode, take the argmax of the raw logits, no sampler chain.
fn argmax_loop(model: &Model, prompt: &str, n: usize) -> Vec<Token> {
    let mut ctx = Context::new(model, ctx_params()).unwrap();
    let prompt = model.tokenize(prompt, true, false).unwrap();
    ctx.decode_tokens(&prompt, 0, true).unwrap();
    let mut pos = prompt.len() as i32;
    let mut out = Vec::new();
    while out.len() < n {
        let logits = ctx.logits(-1).unwrap();
        let best = logits
            .iter()
            .enumerate()
            .fold(
                (0usize, f32::NEG_INFINITY),
                |b, (i, &v)| {
                    if v > b.1 {
                        (i, v)
                    } else {
                        b
                    }
                },
            )
            .0 as Token;
        if model.is_eog(best) {
            break;
        }
        out.push(best);
        ctx.decode_tokens(&[best], pos, true).unwrap();
        pos += 1;
    }
    out
}

#[test]
fn greedy_generation_is_deterministic_and_equals_plain_argmax() {
    let model = common::load_default_model();
    let prompt = "The three primary colors are";
    let (a, text) = greedy(&model, prompt, 32);
    let (b, _) = greedy(&model, prompt, 32);
    assert_eq!(a, b, "greedy output differs between runs");
    assert!(a.len() >= 8, "too few tokens: {text:?}");
    assert_eq!(
        a,
        argmax_loop(&model, prompt, a.len()),
        "sampler chain disagrees with the raw argmax"
    );
    assert!(text.chars().any(char::is_alphabetic), "not text: {text:?}");
}

#[test]
fn backend_greedy_sampling_takes_the_argmax_tokens() {
    let model = common::load_default_model();
    let prompt = "The three primary colors are";
    let expected = argmax_loop(&model, prompt, 32);
    assert!(expected.len() >= 8, "too few tokens: {expected:?}");

    // The same loop with the argmax in the graph: each step reads the token
    // llama.cpp's backend sampling chose, never the logits.
    let mut ctx = Context::new(
        &model,
        ContextParams {
            backend_greedy: true,
            ..ctx_params()
        },
    )
    .unwrap();
    let tokens = model.tokenize(prompt, true, false).unwrap();
    ctx.decode_tokens(&tokens, 0, true).unwrap();
    let mut pos = tokens.len() as i32;
    let mut got = Vec::new();
    while got.len() < expected.len() {
        let t = ctx.sampled_token(-1).expect("backend sampling chose no token");
        got.push(t);
        ctx.decode_tokens(&[t], pos, true).unwrap();
        pos += 1;
    }
    assert_eq!(got, expected, "backend sampling disagrees with the host's argmax");

    // The sampler chain of `generate` takes the backend's token as it is.
    let req = GenerateRequest::new(tokens.clone(), expected.len(), SamplingParams::greedy());
    assert_eq!(generate(&mut ctx, &req, |_| true).unwrap().tokens, expected);

    // Without it there is no sampled token, only logits.
    let mut plain = Context::new(&model, ctx_params()).unwrap();
    plain.decode_tokens(&tokens, 0, true).unwrap();
    assert_eq!(plain.sampled_token(-1), None);
    assert!(plain.logits(-1).is_ok());
}

#[test]
fn seeded_sampling_is_reproducible() {
    let model = common::load_default_model();
    let run = |seed| {
        let mut ctx = Context::new(&model, ctx_params()).unwrap();
        let sampling = SamplingParams {
            temperature: 1.0,
            seed,
            ..Default::default()
        };
        let req = GenerateRequest::new(model.tokenize("Once upon a time", true, false).unwrap(), 24, sampling);
        generate(&mut ctx, &req, |_| true).unwrap().tokens
    };
    assert_eq!(run(7), run(7));
}

#[test]
fn flash_attention_does_not_change_greedy_tokens() {
    let model = common::load_default_model();
    let run = |fa| {
        let mut ctx = Context::new(
            &model,
            ContextParams {
                flash_attention: fa,
                ..ctx_params()
            },
        )
        .unwrap();
        let req = GenerateRequest::new(
            model.tokenize("List three fruits:", true, false).unwrap(),
            16,
            SamplingParams::greedy(),
        );
        generate(&mut ctx, &req, |_| true).unwrap().tokens
    };
    assert_eq!(run(FlashAttention::On), run(FlashAttention::Off));
}

#[test]
fn tokenize_detokenize_round_trip() {
    let model = common::load_default_model();
    for text in [
        "Hello, world!",
        "  leading spaces and trailing ones  ",
        "Unicode: naïve café — 東京 🚀",
        "code: fn main() { println!(\"hi\"); }\n\ttabs",
    ] {
        let toks = model.tokenize(text, false, false).unwrap();
        assert!(!toks.is_empty());
        assert_eq!(model.detokenize(&toks, false, false).unwrap(), text);
        let bytes: Vec<u8> = toks
            .iter()
            .flat_map(|&t| model.token_to_bytes(t, false).unwrap())
            .collect();
        assert_eq!(String::from_utf8(bytes).unwrap(), text);
    }
    assert!(
        model.token_to_bytes(model.n_vocab(), false).is_err(),
        "out-of-range token accepted"
    );
    assert!(model.detokenize(&[-1], false, false).is_err());
}

#[test]
fn special_tokens_are_known() {
    let model = common::load_default_model();
    let eos = model.token_eos().expect("an EOS token");
    assert!(model.is_eog(eos));
    let im_start = model.tokenize("<|im_start|>", false, true).unwrap();
    assert_eq!(im_start.len(), 1, "special token text parses to one token");
    let literal = model.tokenize("<|im_start|>", false, false).unwrap();
    assert!(literal.len() > 1, "without parse_special it stays plain text");
}

#[test]
fn chat_template_renders_like_upstream() {
    let model = common::load_default_model();
    let tmpl = model.chat_template(None).expect("SmolLM2 ships a chat template");
    let msgs = vec![
        ChatMessage {
            role: "system".into(),
            content: "Be brief.".into(),
        },
        ChatMessage {
            role: "user".into(),
            content: "Hi!".into(),
        },
    ];
    let text = apply_chat_template(&tmpl, &msgs, true).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    );
    let no_gen = apply_chat_template(&tmpl, &msgs, false).unwrap();
    assert!(!no_gen.ends_with("assistant\n"));
}

#[test]
fn common_chat_template_renders_like_the_server() {
    // common's Jinja rendering of the GGUF's own template: what `run --chat`
    // and llama.cpp's server send. SmolLM2's template adds its default system
    // prompt when the conversation has none.
    let model = common::load_default_model();
    let user = ChatMessage {
        role: "user".into(),
        content: "Hi!".into(),
    };
    let text = model
        .apply_common_chat_template(std::slice::from_ref(&user), true)
        .unwrap();
    assert!(
        text.starts_with("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"),
        "{text}"
    );
    assert!(
        text.ends_with("<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"),
        "{text}"
    );
    let system = ChatMessage {
        role: "system".into(),
        content: "Be brief.".into(),
    };
    let text = model.apply_common_chat_template(&[system, user], false).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
    );
}

#[test]
fn chat_generation_stops_at_end_of_turn() {
    let model = common::load_default_model();
    let tmpl = model.chat_template(None).unwrap();
    let msgs = vec![ChatMessage {
        role: "user".into(),
        content: "What is the capital of France?".into(),
    }];
    let prompt = apply_chat_template(&tmpl, &msgs, true).unwrap();
    let mut ctx = Context::new(&model, ctx_params()).unwrap();
    let req = GenerateRequest::new(
        model.tokenize(&prompt, false, true).unwrap(),
        64,
        SamplingParams::greedy(),
    );
    let out = generate(&mut ctx, &req, |_| true).unwrap();
    assert_eq!(out.stats.stop, StopReason::Eos, "{:?}", out.text);
    assert!(out.text.contains("Paris"), "{:?}", out.text);
}

#[test]
fn memory_breakdown_and_tensor_sizes_from_patch_0001() {
    let model = common::load_default_model();
    let ctx = Context::new(&model, ctx_params()).unwrap();
    let mb = ctx.memory_breakdown();
    assert!(!mb.is_empty());
    let model_bytes: u64 = mb.iter().map(|m| m.model).sum();
    assert!(
        model_bytes >= model.size_bytes(),
        "{model_bytes} < {}",
        model.size_bytes()
    );
    assert!(mb.iter().map(|m| m.context).sum::<u64>() > 0, "KV cache not counted");
    assert!(
        mb.iter().map(|m| m.compute).sum::<u64>() > 0,
        "compute buffers not counted"
    );

    let cpu = buffer_types()
        .into_iter()
        .find(|b| b.name() == "CPU")
        .expect("a CPU buffer type");
    let gguf = pipeshard::gguf::GgufFile::open(model.path()).unwrap();
    for t in gguf.tensors() {
        let got = model
            .tensor_alloc_size(&t.name, cpu)
            .expect("every GGUF tensor is in the model");
        assert_eq!(got, t.nbytes, "{}", t.name);
    }
    assert_eq!(model.tensor_alloc_size("no.such.tensor", cpu), None);
}

#[test]
fn embeddings_are_finite_and_deterministic() {
    let model = common::load_default_model();
    let embed = |text: &str| {
        let mut ctx = Context::new(
            &model,
            ContextParams {
                embeddings: true,
                ..ctx_params()
            },
        )
        .unwrap();
        let toks = model.tokenize(text, true, false).unwrap();
        ctx.decode_tokens(&toks, 0, true).unwrap();
        ctx.embeddings(0).unwrap()
    };
    let a = embed("The cat sat on the mat.");
    assert_eq!(a.len(), model.n_embd() as usize);
    assert!(a.iter().all(|v| v.is_finite()));
    assert!(a.iter().any(|&v| v != 0.0));
    assert_eq!(a, embed("The cat sat on the mat."));
}

#[test]
fn context_overflow_is_an_error_not_a_crash() {
    let model = common::load_default_model();
    let mut ctx = Context::new(
        &model,
        ContextParams {
            n_ctx: 256,
            n_batch: 256,
            n_ubatch: 128,
            ..ctx_params()
        },
    )
    .unwrap();
    let long: Vec<Token> = vec![model.tokenize("a", false, false).unwrap()[0]; 300];
    assert!(ctx.decode_tokens(&long, 0, false).is_err());
    assert!(ctx.decode_tokens(&[model.n_vocab() + 5], 0, true).is_err());
}

/// `ModelParams::repack` (upstream's `--no-repack`): with it the CPU keeps
/// Q4_0 weights in its interleaved repack buffer, without it in a plain one.
#[test]
fn repack_off_keeps_cpu_weights_in_plain_buffers() {
    let dir = common::scratch_dir("repack");
    let path = common::synth_tiny_model(&dir, "tiny-llama3.1-8b", pipeshard_devtools::synth::Quant::Q4_0);
    let repacked_bytes = |repack: bool| -> u64 {
        let model = Model::load(
            &path,
            pipeshard::engine::ModelParams {
                n_gpu_layers: 0,
                repack,
                ..Default::default()
            },
        )
        .unwrap();
        let ctx = Context::new(&model, ctx_params()).unwrap();
        ctx.memory_breakdown()
            .iter()
            .filter(|m| m.buffer_type.contains("REPACK"))
            .map(|m| m.model)
            .sum()
    };
    assert!(repacked_bytes(true) > 0, "no weight was repacked by default");
    assert_eq!(repacked_bytes(false), 0);
}

/// Upstream's fit (`common_fit_params`) runs in process on the real model:
/// on a machine without a GPU there is nothing to fit, so it leaves the
/// defaults and moves no tensor; a file llama.cpp must not read is refused
/// before the fit sees it.
#[test]
fn upstream_fit_runs_on_the_model_and_refuses_bad_files() {
    let path = common::default_model_path();
    let fitted = pipeshard::engine::fit_params(&path, &ctx_params(), 512 << 20).unwrap();
    assert!(fitted.tensor_overrides.is_empty(), "{fitted:?}");
    let dir = common::scratch_dir("fit-bad");
    let bad = dir.join("bad.gguf");
    std::fs::write(&bad, b"GGUF\x03\0\0\0garbage").unwrap();
    let err = pipeshard::engine::fit_params(&bad, &ctx_params(), 0).unwrap_err();
    assert!(err.to_string().contains("is not a usable GGUF model"), "{err}");
    assert!(pipeshard::engine::fit_params(&dir.join("missing.gguf"), &ctx_params(), 0).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The warm-up before the budget check runs the plan's ubatch and one
/// token after it, also when the ubatch is as long as the context (it
/// failed with "inconsistent sequence positions" there).
#[test]
fn warm_up_fits_a_ubatch_as_long_as_the_context() {
    let model = common::load_default_model();
    for (n_ctx, ubatch) in [(256, 256), (256, 512), (256, 128)] {
        let mut ctx = Context::new(
            &model,
            ContextParams {
                n_ctx,
                n_batch: 512,
                n_ubatch: 512,
                n_threads: Some(2),
                ..Default::default()
            },
        )
        .unwrap();
        pipeshard::launch::warm_up(&mut ctx, ubatch).unwrap_or_else(|e| panic!("n_ctx {n_ctx}, ubatch {ubatch}: {e}"));
    }
}

/// Patch 0033: a live context's ubatch changes, and its compute buffers
/// with it. After a prompt at a ubatch of 128, the context goes to 1 (its
/// compute buffers shrink), decodes on, and returns to 128 for the next
/// prompt (they grow back); every greedy token is the one a context that
/// never changed decodes, including a prompt split into single tokens.
#[test]
fn a_live_context_changes_its_ubatch_and_its_compute_buffers_follow() {
    let model = common::load_default_model();
    let prompt = model
        .tokenize(&"the quick brown fox jumps ".repeat(6), true, false)
        .unwrap();
    assert!(prompt.len() > 8);
    let compute = |ctx: &Context<'_>| ctx.memory_breakdown().iter().map(|m| m.compute).sum::<u64>();

    let mut plain = Context::new(&model, ctx_params()).unwrap();
    let expected = common::greedy(&mut plain, &prompt, 8, |_, _| {});
    let at_prompt = compute(&plain);

    let mut ctx = Context::new(&model, ctx_params()).unwrap();
    let got = common::greedy(&mut ctx, &prompt, 8, |i, ctx| {
        if i == 0 {
            ctx.set_ubatch(1).unwrap();
            ctx.reserve_compute().unwrap();
        }
    });
    assert_eq!(got, expected);
    assert_eq!(ctx.n_ubatch(), 1);
    let at_one = compute(&ctx);
    assert!(
        at_one * 2 < at_prompt,
        "compute {at_one} at ubatch 1 against {at_prompt}"
    );

    // A prompt at ubatch 1 runs token by token, to the same tokens.
    assert_eq!(common::greedy(&mut ctx, &prompt, 8, |_, _| {}), expected);
    assert_eq!(compute(&ctx), at_one);

    ctx.set_ubatch(128).unwrap();
    assert_eq!(ctx.n_ubatch(), 128);
    assert_eq!(common::greedy(&mut ctx, &prompt, 8, |_, _| {}), expected);
    assert_eq!(compute(&ctx), at_prompt);
    // Beyond the batch, the ubatch is the batch's.
    ctx.set_ubatch(100_000).unwrap();
    assert_eq!(ctx.n_ubatch(), ctx_params().n_batch);
}
