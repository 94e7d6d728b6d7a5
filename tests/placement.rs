//! Placement hooks from patch 0002, on the CPU: the tensor callback sees
//! every weight, and the offload callback sees every op with a host weight,
//! with the ubatch size of the tier it runs in.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use pipeshard::engine::{
    buffer_types, Context, ContextParams, Model, ModelParams, Offload, OffloadPolicy, OpKind, SamplingParams,
    TensorPlacement,
};
use pipeshard::generate::{generate, GenerateRequest};

#[test]
fn tensor_callback_is_asked_for_every_weight() {
    pipeshard::engine::init(None).unwrap();
    let path = common::default_model_path();
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let cpu = buffer_types().into_iter().find(|b| b.name() == "CPU").unwrap();
    let seen2 = seen.clone();
    let placement: TensorPlacement = Arc::new(move |name: &str| {
        seen2.lock().unwrap().insert(name.to_string());
        Some(cpu)
    });
    let model = Model::load(
        &path,
        ModelParams {
            n_gpu_layers: 0,
            placement: Some(placement),
            ..Default::default()
        },
    )
    .unwrap();
    let gguf = pipeshard::gguf::GgufFile::open(&path).unwrap();
    let expected: BTreeSet<String> = gguf.tensors().iter().map(|t| t.name.clone()).collect();
    let seen = seen.lock().unwrap().clone();
    // SmolLM2 ties its output to token_embd, so llama.cpp asks for `output.weight`
    // too (and then duplicates token_embd); every GGUF tensor must be asked for.
    assert!(
        expected.is_subset(&seen),
        "not asked: {:?}",
        expected.difference(&seen).collect::<Vec<_>>()
    );
    assert!(model.n_params() > 100_000_000);
}

#[test]
fn offload_callback_sees_each_weight_op_with_its_tier() {
    let model = common::load_default_model();
    let calls: Arc<Mutex<BTreeMap<(String, i64), OpKind>>> = Arc::default();
    let c2 = calls.clone();
    let policy: OffloadPolicy = Arc::new(move |q| {
        c2.lock().unwrap().insert((q.weight.to_string(), q.n_tokens), q.op);
        Offload::Cpu
    });
    let params = ContextParams {
        n_ctx: 512,
        n_batch: 64,
        n_ubatch: 64,
        n_threads: Some(2),
        offload: Some(policy.clone()),
        ..Default::default()
    };
    let mut ctx = Context::new(&model, params.clone()).unwrap();
    let prompt = model.tokenize(&"word ".repeat(40), true, false).unwrap();
    let req = GenerateRequest {
        prompt: prompt.clone(),
        n_predict: 4,
        sampling: SamplingParams::greedy(),
        stop: vec![],
    };
    let with_policy = generate(&mut ctx, &req, |_| true).unwrap();
    let calls = calls.lock().unwrap().clone();

    let tiers: BTreeSet<i64> = calls.keys().map(|(_, n)| *n).collect();
    assert!(tiers.contains(&1), "decode tier not seen: {tiers:?}");
    assert!(
        tiers.contains(&(prompt.len() as i64)),
        "prompt tier {} not seen: {tiers:?}",
        prompt.len()
    );
    for w in ["blk.0.attn_q.weight", "blk.0.ffn_up.weight", "blk.29.ffn_down.weight"] {
        assert_eq!(calls.get(&(w.to_string(), 1)), Some(&OpKind::MulMat), "{w} at n=1");
    }

    // The policy must not change the math: same tokens as without it.
    let mut plain = Context::new(
        &model,
        ContextParams {
            offload: None,
            ..params
        },
    )
    .unwrap();
    let without = generate(&mut plain, &req, |_| true).unwrap();
    assert_eq!(with_policy.tokens, without.tokens);
}
