//! Speculative decoding with a draft model: the text is the text plain
//! decoding gives, whatever the draft proposes.

mod common;

use pipeshard::engine::{Context, Model, ModelParams, SamplingParams, Token};
use pipeshard::generate::{generate, generate_speculative, DraftParams, GenerateRequest};
use pipeshard_devtools::synth::Quant;

fn request(model: &Model, prompt: &str, n_predict: usize, sampling: SamplingParams) -> GenerateRequest {
    GenerateRequest {
        ignore_eos: true,
        ..GenerateRequest::new(model.tokenize(prompt, true, false).unwrap(), n_predict, sampling)
    }
}

fn load(path: &std::path::Path) -> Model {
    pipeshard::engine::init(None).unwrap();
    Model::load(
        path,
        ModelParams {
            n_gpu_layers: 0,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Plain decoding, then speculative decoding with `draft`: both token lists
/// and the speculation counts (steps, drafted, accepted).
fn both(
    model: &Model,
    draft: &Model,
    req: &GenerateRequest,
    params: DraftParams,
) -> (Vec<Token>, Vec<Token>, pipeshard::generate::SpeculationStats) {
    let mut ctx = Context::new(model, common::small_context_params()).unwrap();
    let plain = generate(&mut ctx, req, |_| true).unwrap();
    let mut dctx = Context::new(draft, common::small_context_params()).unwrap();
    let (spec, stats) = generate_speculative(&mut ctx, &mut dctx, &params, req, |_| true).unwrap();
    assert_eq!(spec.tokens.len(), req.n_predict);
    assert_eq!(spec.stats.generated_tokens, req.n_predict);
    (plain.tokens, spec.tokens, stats)
}

#[test]
fn a_draft_of_the_model_itself_is_accepted_and_changes_no_token() {
    let model = common::load_default_model();
    let draft = common::load_default_model();
    let req = request(&model, "The capital of France is", 40, SamplingParams::greedy());
    let params = DraftParams {
        n_max: 4,
        ..Default::default()
    };
    let (plain, spec, s) = both(&model, &draft, &req, params);
    assert_eq!(spec, plain);
    assert!(s.drafted > 0);
    // Batched and single-token logits may round differently, so allow a
    // rare disagreement, but most steps must keep their whole draft.
    assert!(s.accepted * 10 >= s.drafted * 9, "{s:?}");
    assert!(s.steps < 40 / 2, "{} steps for 40 tokens", s.steps);
}

#[test]
fn sampled_text_is_the_same_with_a_draft() {
    // The model samples each position exactly as plain decoding would (one
    // draw per token, in order), so a seeded sample is unchanged, while the
    // greedy draft is often wrong about a sampled token.
    let model = common::load_default_model();
    let draft = common::load_default_model();
    let sampling = SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: 1234,
        ..Default::default()
    };
    let req = request(&model, "Once upon a time", 48, sampling);
    let params = DraftParams {
        n_max: 3,
        ..Default::default()
    };
    let (plain, spec, s) = both(&model, &draft, &req, params);
    assert_eq!(spec, plain);
    assert!(s.accepted > 0 && s.accepted < s.drafted, "{s:?}");
}

#[test]
fn a_draft_that_disagrees_changes_nothing() {
    // Two unrelated random-weight models with one tokenizer: the draft is
    // mostly wrong, so most steps roll both caches back.
    let dir = common::scratch_dir("spec-disagree");
    let model = load(&common::synth_tiny_model(&dir, "tiny-llama3.1-8b", Quant::Q8_0));
    let draft = load(&common::synth_tiny_model(&dir, "tiny-llama3.2-1b", Quant::Q8_0));
    let req = GenerateRequest {
        ignore_eos: true,
        ..GenerateRequest::new((10..40).collect(), 32, SamplingParams::greedy())
    };
    for n_max in [1, 5] {
        let params = DraftParams {
            n_max,
            ..Default::default()
        };
        let (plain, spec, s) = both(&model, &draft, &req, params);
        assert_eq!(spec, plain, "n_max {n_max}");
        assert!(s.accepted < s.drafted, "n_max {n_max}: {s:?}");
    }
    // A draft that is never sure enough drafts nothing: plain decoding.
    let params = DraftParams {
        n_max: 4,
        p_min: 1.1,
        ..Default::default()
    };
    let (plain, spec, s) = both(&model, &draft, &req, params);
    assert_eq!(spec, plain);
    assert_eq!((s.drafted, s.steps), (0, 31));
}

#[test]
fn a_draft_with_another_vocabulary_is_refused() {
    let dir = common::scratch_dir("spec-vocab");
    let model = common::load_default_model();
    let draft = load(&common::synth_tiny_model(&dir, "tiny-llama3.2-1b", Quant::Q8_0));
    let req = request(&model, "hello", 4, SamplingParams::greedy());
    let mut ctx = Context::new(&model, common::small_context_params()).unwrap();
    let mut dctx = Context::new(&draft, common::small_context_params()).unwrap();
    let err = generate_speculative(&mut ctx, &mut dctx, &DraftParams::default(), &req, |_| true).unwrap_err();
    assert!(err.to_string().contains("vocabulary"), "{err}");
}
