//! Placement hooks from patch 0002, on the CPU: the tensor callback sees
//! every weight, and the offload callback sees every op with a host weight,
//! with the ubatch size of the tier it runs in. And the weight-streaming
//! schedule of patch 0003 (the scheduler's own code): slot rotation and the
//! order of copies, events and computes; and that the hybrid-expert hooks
//! of patches 0005/0006 change nothing without a GPU. And the dense row
//! split of patch 0017 on the CPU alone: the same rows, split in two ops;
//! with patch 0039 the CPU's rows from its repacked copy of the weight.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use pipeshard::engine::{
    argmax, buffer_types, stream_schedule, Context, ContextParams, Model, ModelParams, MoeSplitPolicy, Offload,
    OffloadPolicy, OpKind, RowSplitPolicy, SamplingParams, StreamStep, TensorPlacement,
};
use pipeshard::generate::{generate, GenerateRequest};

/// The default model with every layer on the CPU and each weight's buffer
/// type chosen by `placement`.
fn load_placed(path: &std::path::Path, placement: TensorPlacement) -> Model {
    Model::load(
        path,
        ModelParams {
            n_gpu_layers: 0,
            placement: Some(placement),
            ..Default::default()
        },
    )
    .unwrap()
}

/// The default model with every weight in plain CPU buffers, where patch
/// 0017 can split it: a repacked weight (CPU_REPACK) is never split.
fn load_on_plain_cpu_buffers() -> Model {
    pipeshard::engine::init(None).unwrap();
    let path = common::default_model_path();
    let cpu = buffer_types().into_iter().find(|b| b.name() == "CPU").unwrap();
    let placement: TensorPlacement = Arc::new(move |_: &str| Some(cpu));
    load_placed(&path, placement)
}

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
    let model = load_placed(&path, placement);
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
    let req = GenerateRequest::new(prompt.clone(), 4, SamplingParams::greedy());
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

/// Split patterns: which splits of a graph stream weights.
fn split_patterns() -> Vec<Vec<bool>> {
    let mut v = vec![vec![], vec![false; 5], vec![true; 7]];
    // A dense layer: attention resident, gate/up/down streamed.
    v.push((0..32).flat_map(|_| [false, true, true, true]).collect());
    // Pseudo-random mixes.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for len in [1usize, 2, 3, 9, 40, 97] {
        v.push(
            (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % 3 != 0
                })
                .collect(),
        );
    }
    v
}

#[test]
fn stream_schedule_rotates_slots_in_order_of_use() {
    for streams in split_patterns() {
        for n_slots in 1..=4 {
            let sched = stream_schedule(&streams, n_slots);
            assert_eq!(sched.len(), streams.len());
            let users: Vec<usize> = (0..streams.len()).filter(|&i| streams[i]).collect();
            for (i, step) in sched.iter().enumerate() {
                assert_eq!(step.is_some(), streams[i], "split {i}: a slot iff it streams");
            }
            for (k, &i) in users.iter().enumerate() {
                let StreamStep { slot, issue_after } = sched[i].unwrap();
                assert_eq!(slot, k % n_slots, "the k-th streaming split uses slot k mod n");
                // Its copy is issued after the previous user of the slot, the
                // (k - n)-th streaming split, or up front for the first n.
                let expected = k.checked_sub(n_slots).map(|p| users[p]);
                assert_eq!(issue_after, expected, "split {i} (streaming #{k}, {n_slots} slots)");
            }
        }
    }
}

/// Replays the order in which the scheduler issues work on the host
/// (ggml_backend_sched_compute_splits with streaming): the first copies up
/// front, then per split: wait for its copy, compute, release the slot, issue
/// the copy that follows. Checks every wait names a copy already issued, and
/// no slot is refilled before the split reading it has been released.
#[test]
fn stream_schedule_orders_copies_events_and_computes() {
    #[derive(Debug, PartialEq)]
    enum Ev {
        Copy { split: usize, slot: usize },
        Wait { split: usize, slot: usize },
        Compute { split: usize },
        Release { split: usize, slot: usize },
    }
    for streams in split_patterns() {
        for n_slots in 1..=4 {
            let sched = stream_schedule(&streams, n_slots);
            let mut log = Vec::new();
            for (i, step) in sched.iter().enumerate() {
                if let Some(StreamStep {
                    slot,
                    issue_after: None,
                }) = step
                {
                    log.push(Ev::Copy { split: i, slot: *slot });
                }
            }
            for (i, step) in sched.iter().enumerate() {
                if let Some(s) = step {
                    log.push(Ev::Wait { split: i, slot: s.slot });
                }
                log.push(Ev::Compute { split: i });
                if let Some(s) = step {
                    log.push(Ev::Release { split: i, slot: s.slot });
                    for (j, next) in sched.iter().enumerate() {
                        if let Some(n) = next {
                            if n.issue_after == Some(i) {
                                assert_eq!(n.slot, s.slot, "split {j} reuses the slot split {i} released");
                                log.push(Ev::Copy { split: j, slot: n.slot });
                            }
                        }
                    }
                }
            }
            let pos = |e: &Ev| log.iter().position(|x| x == e);
            // Which split's data each slot holds, replayed in order.
            let mut holds: Vec<Option<usize>> = vec![None; n_slots];
            let mut released: Vec<bool> = vec![true; n_slots];
            for e in &log {
                match *e {
                    Ev::Copy { split, slot } => {
                        assert!(released[slot], "slot {slot} refilled for split {split} while in use");
                        holds[slot] = Some(split);
                        released[slot] = false;
                    }
                    Ev::Wait { split, slot } => {
                        assert_eq!(holds[slot], Some(split), "split {split} waits on a copy not yet issued");
                    }
                    Ev::Compute { .. } => {}
                    Ev::Release { split, slot } => {
                        assert_eq!(holds[slot], Some(split));
                        released[slot] = true;
                    }
                }
            }
            for (i, step) in sched.iter().enumerate() {
                if let Some(s) = step {
                    let copy = pos(&Ev::Copy { split: i, slot: s.slot }).expect("every streaming split is copied");
                    let wait = pos(&Ev::Wait { split: i, slot: s.slot }).unwrap();
                    let compute = pos(&Ev::Compute { split: i }).unwrap();
                    assert!(copy < wait && wait < compute, "split {i}: copy, wait, compute");
                }
            }
        }
    }
}

#[test]
fn stream_slots_without_a_gpu_change_nothing() {
    let model = common::load_default_model();
    let params = common::small_context_params();
    let prompt = model.tokenize("The capital of France is", true, false).unwrap();
    let req = GenerateRequest::new(prompt, 8, SamplingParams::greedy());
    let mut plain = Context::new(&model, params.clone()).unwrap();
    let a = generate(&mut plain, &req, |_| true).unwrap();
    let mut streamed = Context::new(
        &model,
        ContextParams {
            stream_slots: 2,
            ..params
        },
    )
    .unwrap();
    let b = generate(&mut streamed, &req, |_| true).unwrap();
    assert_eq!(a.tokens, b.tokens);
}

#[test]
fn hybrid_experts_without_a_gpu_change_nothing() {
    // Patches 0005/0006 on a CPU-only machine: a MoE model with routed
    // streaming and a split policy asking for hybrid layers. Without a GPU
    // backend no layer can split, so the policy is never asked and the
    // tokens are those of the plain context.
    pipeshard::engine::init(None).unwrap();
    let dir = common::scratch_dir("hybrid-experts");
    let path = common::synth_tiny_model(&dir, "tiny-qwen3-30b-a3b", pipeshard_devtools::synth::Quant::Q8_0);
    let model = Model::load(&path, ModelParams::default()).unwrap();
    let params = common::small_context_params();
    let req = GenerateRequest::new(
        model.tokenize("hello world", true, false).unwrap(),
        8,
        SamplingParams::greedy(),
    );
    let mut plain = Context::new(&model, params.clone()).unwrap();
    let a = generate(&mut plain, &req, |_| true).unwrap();
    let asked = Arc::new(Mutex::new(0u32));
    let counter = asked.clone();
    let policy: MoeSplitPolicy = Arc::new(move |_layer, _n_tokens| {
        *counter.lock().unwrap() += 1;
        1
    });
    let mut split = Context::new(
        &model,
        ContextParams {
            stream_slots: 2,
            stream_routed_max: 64,
            moe_split: Some(policy),
            ..params
        },
    )
    .unwrap();
    let b = generate(&mut split, &req, |_| true).unwrap();
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(*asked.lock().unwrap(), 0, "asked without a GPU to split to");
}

#[test]
fn row_split_on_the_cpu_computes_the_same_rows() {
    // Patch 0017 without a GPU: both parts of a split weight run on the CPU
    // (the first backend is the CPU itself). Each output row is the same dot
    // product as in the whole op, so the logits are bit for bit those of the
    // plain context, in the prompt's ubatch and in decode alike. Patch 0043
    // splits the weights outside the feed-forward too (attention, the output
    // projection), the GPU's rows in parts of at most 1 MiB here: several
    // parts for the output projection.
    let model = load_on_plain_cpu_buffers();
    let params = common::small_context_params();
    let prompt = model.tokenize(&"the quick brown fox ".repeat(8), true, false).unwrap();
    let req = GenerateRequest::new(prompt.clone(), 12, SamplingParams::greedy());

    let mut plain = Context::new(&model, params.clone()).unwrap();
    let a = generate(&mut plain, &req, |_| true).unwrap();
    plain.clear();
    plain.decode_tokens(&prompt, 0, true).unwrap();
    let logits_a = plain.logits(-1).unwrap().to_vec();

    let asked: Arc<Mutex<BTreeMap<String, BTreeSet<u32>>>> = Arc::default();
    let seen = asked.clone();
    let policy: RowSplitPolicy = Arc::new(move |name: &str, rows: u64, n_tokens: u32| {
        seen.lock()
            .unwrap()
            .entry(name.to_string())
            .or_default()
            .insert(n_tokens);
        // An odd share of whole blocks: the GPU's part starts mid-matrix.
        rows / 32 * 11 / 32 * 32
    });
    let mut split = Context::new(
        &model,
        ContextParams {
            row_split: Some(policy),
            row_split_part_bytes: 1 << 20,
            ..params
        },
    )
    .unwrap();
    let b = generate(&mut split, &req, |_| true).unwrap();
    assert_eq!(a.tokens, b.tokens);
    split.clear();
    split.decode_tokens(&prompt, 0, true).unwrap();
    let logits_b = split.logits(-1).unwrap().to_vec();
    assert!(logits_a == logits_b, "split logits differ from the whole ops'");

    let asked = asked.lock().unwrap().clone();
    let n_layer = model.n_layer() as usize;
    for role in ["ffn_up", "ffn_gate", "ffn_down"] {
        let n = asked.keys().filter(|k| k.contains(role)).count();
        assert_eq!(n, n_layer, "{role} asked in {n} of {n_layer} layers: {asked:?}");
    }
    let tiers: BTreeSet<u32> = asked.values().flatten().copied().collect();
    assert!(tiers.contains(&1), "decode not asked: {tiers:?}");
    assert!(tiers.iter().any(|&n| n > 1), "the prompt not asked: {tiers:?}");
    for role in ["attn_q", "attn_output"] {
        let n = asked.keys().filter(|k| k.contains(role)).count();
        assert_eq!(n, n_layer, "{role} asked in {n} of {n_layer} layers: {asked:?}");
    }
    // SmolLM2 ties its output projection to the token embeddings.
    assert!(
        asked.contains_key("output.weight") || asked.contains_key("token_embd.weight"),
        "the output projection not asked: {asked:?}"
    );
}

#[test]
fn row_split_from_repacked_cpu_copies_computes_the_same_rows() {
    // Patch 0039 without a GPU: a Q4_0 model with every weight in plain CPU
    // buffers, loaded once as is and once with repacked CPU copies of its
    // feed-forward weights (CPU_REPACK, interleaved 8x8). Split by rows as
    // in patch 0017, the CPU's first rows of each weight come from the copy:
    // the same dot products over the same Q8_0 activations, summed in
    // another order. So the logits differ from the plain split's (which
    // shows the copies are used) by no more than twice what llama.cpp's own
    // repacking of the weights changes (0.022 at logits up to 1.8 here),
    // and the greedy tokens are the same. A part taken from the wrong place
    // in the interleaved layout would compute other rows.
    pipeshard::engine::init(None).unwrap();
    let dir = common::scratch_dir("cpu-copies");
    let path = common::synth_tiny_model(&dir, "tiny-llama3.1-8b", pipeshard_devtools::synth::Quant::Q4_0);
    let cpu = buffer_types().into_iter().find(|b| b.name() == "CPU").unwrap();
    let load = |repack: bool, copies: bool| {
        Model::load(
            &path,
            ModelParams {
                n_gpu_layers: 0,
                placement: Some(Arc::new(move |_: &str| Some(cpu))),
                // Without it, the weights stay in plain CPU buffers.
                repack,
                cpu_weight_copies: copies,
                ..Default::default()
            },
        )
        .unwrap()
    };
    let asked = Arc::new(Mutex::new(0u32));
    let counter = asked.clone();
    let policy: RowSplitPolicy = Arc::new(move |_name: &str, rows: u64, _n_tokens: u32| {
        *counter.lock().unwrap() += 1;
        rows / 32 * 11 / 32 * 32
    });
    let params = ContextParams {
        row_split: Some(policy),
        ..common::small_context_params()
    };
    let run = |model: &Model| {
        let prompt = model.tokenize(&"the quick brown fox ".repeat(8), true, false).unwrap();
        let req = GenerateRequest::new(prompt.clone(), 12, SamplingParams::greedy());
        let mut ctx = Context::new(model, params.clone()).unwrap();
        let tokens = generate(&mut ctx, &req, |_| true).unwrap().tokens;
        ctx.clear();
        ctx.decode_tokens(&prompt, 0, true).unwrap();
        (tokens, ctx.logits(-1).unwrap().to_vec())
    };
    let (plain_tokens, plain) = run(&load(false, false));
    let (copied_tokens, copied) = run(&load(false, true));
    // The reference for rounding: llama.cpp's own repacking of every weight
    // it can (a CPU choice with use_extra_bufts), against the plain weights.
    let (_, repacked) = run(&load(true, false));
    assert!(*asked.lock().unwrap() > 0, "the split policy was never asked");
    assert_eq!(plain_tokens, copied_tokens);
    let max_diff = |x: &[f32]| plain.iter().zip(x).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    let (diff, upstream) = (max_diff(&copied), max_diff(&repacked));
    assert!(
        diff > 0.0,
        "the logits are bit for bit the plain weights': the copies were not used"
    );
    assert!(
        diff <= 2.0 * upstream,
        "max |logit diff| {diff} from the copies against {upstream} from llama.cpp's own repacking"
    );
}

#[test]
fn rebuilt_graphs_ask_the_split_policy_again() {
    // The decode split chosen at run time (launch::tune) changes what the
    // row-split callback answers between two decodes; llama.cpp reads it
    // when it builds a graph, so `Context::rebuild_graphs` must make the
    // next decode build its graph again, and the context must go on
    // decoding the same tokens (both parts run on the CPU here: the same
    // rows, bit for bit).
    use std::sync::atomic::{AtomicU64, Ordering};
    let model = load_on_plain_cpu_buffers();
    let params = common::small_context_params();
    let prompt = model.tokenize(&"the quick brown fox ".repeat(8), true, false).unwrap();

    let step_tokens = |ctx: &mut Context<'_>, n: usize, pos: usize, first: i32| {
        let mut tok = first;
        let mut out = Vec::new();
        for i in 0..n {
            ctx.decode_tokens(&[tok], (pos + i) as i32, true).unwrap();
            tok = argmax(ctx.logits(-1).unwrap());
            out.push(tok);
        }
        out
    };
    let mut plain = Context::new(&model, params.clone()).unwrap();
    plain.decode_tokens(&prompt, 0, true).unwrap();
    let expected = step_tokens(&mut plain, 6, prompt.len(), prompt[0]);

    let decode_asks = Arc::new(AtomicU64::new(0));
    let eighths = Arc::new(AtomicU64::new(3));
    let (asks, share) = (decode_asks.clone(), eighths.clone());
    let policy: RowSplitPolicy = Arc::new(move |_: &str, rows: u64, n_tokens: u32| {
        if n_tokens == 1 {
            asks.fetch_add(1, Ordering::SeqCst);
        }
        rows / 32 * share.load(Ordering::SeqCst) / 8 * 32
    });
    let mut ctx = Context::new(
        &model,
        ContextParams {
            row_split: Some(policy),
            ..params
        },
    )
    .unwrap();
    ctx.decode_tokens(&prompt, 0, true).unwrap();
    let mut got = step_tokens(&mut ctx, 3, prompt.len(), prompt[0]);
    let before = decode_asks.load(Ordering::SeqCst);
    assert!(before > 0, "decode never asked");
    // Another share, in force from the next graph built.
    eighths.store(5, Ordering::SeqCst);
    ctx.rebuild_graphs();
    got.extend(step_tokens(&mut ctx, 3, prompt.len() + 3, got[2]));
    let after = decode_asks.load(Ordering::SeqCst);
    let n_ffn = 3 * model.n_layer() as u64;
    assert!(
        after >= before + n_ffn,
        "the rebuilt graph did not ask again: {before} then {after}"
    );
    assert_eq!(got, expected);
}
