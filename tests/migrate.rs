//! Live weight migration (patch 0023) on the CPU: weights move between
//! buffers of a loaded model between two decodes, their old memory is freed,
//! the context rebuilds its graphs, and greedy decoding goes on with the
//! very tokens it would have produced without the move.

mod common;

use common::{cpu_buffer_type as cpu, greedy, load_on_plain_cpu as load};
use pipeshard::engine::{
    cancel_staged, commit_staged, migrate_weights, migrate_weights_to, move_weights, stage_state, stage_weights,
    stage_weights_to, BufferType, Context, ContextParams, EngineError, Model, Residence, StageState, Token, WeightMove,
};

const N_TOKENS: usize = 16;
const K_BEFORE_MOVE: usize = 6;

fn params() -> ContextParams {
    common::small_context_params()
}

fn prompt(model: &Model) -> Vec<Token> {
    model
        .tokenize("The capital of France is a city where", true, false)
        .unwrap()
}

fn model_bytes(ctx: &Context<'_>, buffer_type: &str) -> u64 {
    ctx.memory_breakdown()
        .iter()
        .filter(|m| m.buffer_type == buffer_type)
        .map(|m| m.model)
        .sum()
}

fn weight_names(model: &Model) -> Vec<String> {
    let gguf = pipeshard::gguf::GgufFile::open(model.path()).unwrap();
    gguf.tensors().iter().map(|t| t.name.clone()).collect()
}

/// Two layers' weights and the (tied) token embedding, used by get_rows at
/// the input and by the output matmul.
fn some_weights(model: &Model) -> Vec<String> {
    let last = model.n_layer() - 1;
    weight_names(model)
        .into_iter()
        .filter(|n| n.starts_with("blk.0.") || n.starts_with(&format!("blk.{last}.")) || n == "token_embd.weight")
        .collect()
}

#[test]
fn moved_weights_decode_the_same_tokens_and_free_their_old_buffers() {
    let model = load(false, true);
    let prompt = prompt(&model);
    let mut ctx = Context::new(&model, params()).unwrap();
    let reference = greedy(&mut ctx, &prompt, N_TOKENS, |_, _| {});

    let moved = some_weights(&model);
    assert!(moved.len() > 10, "{moved:?}");
    let (first_half, second_half) = moved.split_at(moved.len() / 2);
    let mut checked = false;
    let tokens = greedy(&mut ctx, &prompt, N_TOKENS, |i, ctx| {
        if i != K_BEFORE_MOVE {
            return;
        }
        let cpu_before = model_bytes(ctx, "CPU");

        // Through the residence API (without a GPU, Host is the CPU's
        // buffer type), then through explicit buffer types.
        let moves: Vec<WeightMove> = first_half
            .iter()
            .map(|n| WeightMove {
                tensor: n.clone(),
                to: Residence::Host,
            })
            .collect();
        let a = migrate_weights(ctx.context_ref(), &moves).unwrap();
        let explicit: Vec<(&str, BufferType)> = second_half.iter().map(|n| (n.as_str(), cpu())).collect();
        let b = migrate_weights_to(ctx.context_ref(), &explicit).unwrap();

        assert_eq!(a.moved + b.moved, moved.len());
        let expected: u64 = moved.iter().map(|n| model.tensor_alloc_size(n, cpu()).unwrap()).sum();
        assert_eq!(a.bytes_to_host + b.bytes_to_host, expected);
        assert_eq!(a.bytes_to_device + b.bytes_to_device, 0);
        assert_eq!(
            a.device_bytes_freed + b.device_bytes_freed,
            0,
            "no device buffer was involved"
        );
        // Each moved weight had a buffer of its own, freed when it left: the
        // weights take exactly the host memory they took before. (Without
        // the repoint, the old buffers would still hold their weights and
        // stay, and the total would grow by `expected`.)
        assert_eq!(model_bytes(ctx, "CPU"), cpu_before);
        for n in &moved {
            assert_eq!(ctx.context_ref().residence(n), Some(Residence::Host));
        }
        // Changing the streaming slots of a live context releases its
        // compute buffers again; the next decode reserves them.
        ctx.context_ref().set_stream_slots(2, 0);
        checked = true;
    });
    assert!(checked);
    assert_eq!(tokens, reference, "tokens after the move differ from the unmoved run");
}

#[test]
fn the_decode_after_a_move_rebuilds_its_graph() {
    // The graphs of the previous ubatch point at the weights' old memory (on
    // a GPU, a captured CUDA graph would replay it): the first decode after a
    // move must not reuse them, and the ones after it reuse the new graph.
    let model = load(false, true);
    let prompt = prompt(&model);
    let mut ctx = Context::new(&model, params()).unwrap();
    let reference = greedy(&mut ctx, &prompt, N_TOKENS, |_, _| {});
    let names = some_weights(&model);
    let mut reused_at_move = None;
    let mut reused = Vec::new();
    let tokens = greedy(&mut ctx, &prompt, N_TOKENS, |i, ctx| {
        reused.push(ctx.graphs_reused());
        if i == K_BEFORE_MOVE {
            let moves: Vec<(&str, BufferType)> = names.iter().map(|n| (n.as_str(), cpu())).collect();
            migrate_weights_to(ctx.context_ref(), &moves).unwrap();
            reused_at_move = Some(ctx.graphs_reused());
        }
    });
    assert_eq!(tokens, reference);
    // reused[i] is read before token i is decoded: the decode of token
    // K_BEFORE_MOVE (the first after the move) shows in reused[K + 1].
    let k = K_BEFORE_MOVE;
    assert!(
        reused[k] > reused[k - 1],
        "decodes before the move reuse their graph: {reused:?}"
    );
    assert_eq!(
        reused[k + 1],
        reused[k],
        "the first decode after the move reused a stale graph: {reused:?}"
    );
    assert!(
        reused[k + 2] > reused[k + 1],
        "the rebuilt graph is reused again: {reused:?}"
    );
    assert_eq!(reused_at_move, Some(reused[k]));
}

#[test]
fn a_shared_buffer_is_freed_once_its_last_weight_leaves() {
    // Memory-mapped weights share one CPU_Mapped buffer (movable_weights
    // never splits a mapping): it stays while any weight is left in it, and
    // is freed when the last one moves out.
    let model = load(true, true);
    let prompt = prompt(&model);
    let mut ctx = Context::new(&model, params()).unwrap();
    let reference = greedy(&mut ctx, &prompt, N_TOKENS, |_, _| {});
    let mapped = model_bytes(&ctx, "CPU_Mapped");
    assert!(mapped > 0, "{:?}", ctx.memory_breakdown());
    assert_eq!(model_bytes(&ctx, "CPU"), 0);

    let names = weight_names(&model);
    let (last, rest) = names.split_last().unwrap();
    let tokens = greedy(&mut ctx, &prompt, N_TOKENS, |i, ctx| {
        if i == K_BEFORE_MOVE {
            let moves: Vec<(&str, BufferType)> = rest.iter().map(|n| (n.as_str(), cpu())).collect();
            migrate_weights_to(ctx.context_ref(), &moves).unwrap();
            assert_eq!(
                model_bytes(ctx, "CPU_Mapped"),
                mapped,
                "one weight is still in the mapping"
            );
            let r = ctx.context_ref();
            assert_eq!(r.weight_buffer_type(&rest[0]).map(|b| b.name()), Some("CPU".into()));
            assert_eq!(r.weight_buffer_type(last).map(|b| b.name()), Some("CPU_Mapped".into()));
        }
        if i == K_BEFORE_MOVE + 3 {
            migrate_weights_to(ctx.context_ref(), &[(last.as_str(), cpu())]).unwrap();
            assert_eq!(model_bytes(ctx, "CPU_Mapped"), 0, "{:?}", ctx.memory_breakdown());
            let all: u64 = names.iter().map(|n| model.tensor_alloc_size(n, cpu()).unwrap()).sum();
            assert_eq!(model_bytes(ctx, "CPU"), all);
        }
    });
    assert_eq!(tokens, reference);
}

#[test]
fn without_movable_weights_a_partial_move_frees_nothing() {
    // One buffer holds every weight: moving some of them out allocates their
    // new memory and cannot free the old, so the weights' memory grows by
    // the bytes moved (which is why the option exists), and decoding is
    // still right.
    let model = load(false, false);
    let prompt = prompt(&model);
    let mut ctx = Context::new(&model, params()).unwrap();
    let reference = greedy(&mut ctx, &prompt, N_TOKENS, |_, _| {});
    let names = some_weights(&model);
    let tokens = greedy(&mut ctx, &prompt, N_TOKENS, |i, ctx| {
        if i == K_BEFORE_MOVE {
            let before = model_bytes(ctx, "CPU");
            let moves: Vec<(&str, BufferType)> = names.iter().map(|n| (n.as_str(), cpu())).collect();
            let r = migrate_weights_to(ctx.context_ref(), &moves).unwrap();
            assert_eq!(model_bytes(ctx, "CPU"), before + r.bytes_to_host);
        }
    });
    assert_eq!(tokens, reference);
}

#[test]
fn another_context_of_the_model_follows_a_move() {
    // The model counts its moves: a second context, idle during the move,
    // rebuilds its graphs and reserves its buffers at its next decode.
    let model = load(false, true);
    let prompt = prompt(&model);
    let mut mover = Context::new(&model, params()).unwrap();
    let mut ctx = Context::new(&model, params()).unwrap();
    let reference = greedy(&mut ctx, &prompt, N_TOKENS, |_, _| {});
    let names = some_weights(&model);
    let mut reused = Vec::new();
    let tokens = greedy(&mut ctx, &prompt, N_TOKENS, |i, ctx| {
        reused.push(ctx.graphs_reused());
        if i == K_BEFORE_MOVE {
            let moves: Vec<(&str, BufferType)> = names.iter().map(|n| (n.as_str(), cpu())).collect();
            migrate_weights_to(mover.context_ref(), &moves).unwrap();
        }
    });
    assert_eq!(tokens, reference);
    let k = K_BEFORE_MOVE;
    assert_eq!(
        reused[k + 1],
        reused[k],
        "the other context reused a stale graph: {reused:?}"
    );
    assert!(reused[k + 2] > reused[k + 1], "{reused:?}");
    // The mover itself still decodes right.
    assert_eq!(greedy(&mut mover, &prompt, N_TOKENS, |_, _| {}), reference);
}

#[test]
fn a_bad_move_is_a_clean_error_and_moves_nothing() {
    let model = load(false, true);
    let prompt = prompt(&model);
    let mut ctx = Context::new(&model, params()).unwrap();
    let reference = greedy(&mut ctx, &prompt, N_TOKENS, |_, _| {});
    let before = ctx.memory_breakdown();

    let good = "blk.0.attn_q.weight";
    let err = migrate_weights(
        ctx.context_ref(),
        &[
            WeightMove {
                tensor: good.into(),
                to: Residence::Host,
            },
            WeightMove {
                tensor: "blk.0.no_such.weight".into(),
                to: Residence::Host,
            },
        ],
    )
    .unwrap_err();
    assert!(
        matches!(&err, EngineError::UnknownWeight { name } if name == "blk.0.no_such.weight"),
        "{err}"
    );
    assert!(err.to_string().contains("blk.0.no_such.weight"), "{err}");
    let err = migrate_weights_to(ctx.context_ref(), &[("bad\0name", cpu())]).unwrap_err();
    assert!(matches!(err, EngineError::UnknownWeight { .. }), "{err}");
    // The same weight twice in one call.
    let err = migrate_weights_to(ctx.context_ref(), &[(good, cpu()), (good, cpu())]).unwrap_err();
    assert!(
        matches!(&err, EngineError::WeightMove { name, .. } if name == good),
        "{err}"
    );

    let after = ctx.memory_breakdown();
    assert_eq!(
        format!("{before:?}"),
        format!("{after:?}"),
        "a refused move changed the memory"
    );
    let empty = migrate_weights(ctx.context_ref(), &[]).unwrap();
    assert_eq!(empty.moved, 0);
    assert_eq!(greedy(&mut ctx, &prompt, N_TOKENS, |_, _| {}), reference);
}

/// A move and a change of streaming slots rebuild the graphs but keep the
/// compute buffers allocated: released, another program could take their
/// memory before the next decode reserves it again.
#[test]
fn a_move_keeps_the_compute_buffers() {
    let model = load(false, true);
    let prompt = prompt(&model);
    let mut ctx = Context::new(&model, params()).unwrap();
    let reference = greedy(&mut ctx, &prompt, N_TOKENS, |_, _| {});
    let compute = |ctx: &Context<'_>| -> u64 { ctx.memory_breakdown().iter().map(|m| m.compute).sum() };
    let before = compute(&ctx);
    assert!(before > 0);
    let moved = some_weights(&model);
    let moves: Vec<(&str, BufferType)> = moved.iter().map(|n| (n.as_str(), cpu())).collect();
    let tokens = greedy(&mut ctx, &prompt, N_TOKENS, |i, ctx| {
        if i != K_BEFORE_MOVE {
            return;
        }
        let r = move_weights(ctx.context_ref(), &moves).unwrap();
        assert_eq!(r.moved, moved.len());
        assert_eq!(compute(ctx), before, "the move released the compute buffers");
        ctx.context_ref().set_stream_slots(0, 0);
        assert_eq!(
            compute(ctx),
            before,
            "a change of stream slots released the compute buffers"
        );
    });
    assert_eq!(tokens, reference);
    assert_eq!(compute(&ctx), before);
}

fn promotions(names: &[String]) -> Vec<WeightMove> {
    names
        .iter()
        .map(|n| WeightMove {
            tensor: n.clone(),
            to: Residence::Device,
        })
        .collect()
}

/// A promotion staged on the side (patch 0028; without a GPU the device is
/// the CPU's buffer type, so staging allocates and copies on llama.cpp's
/// staging thread while the context decodes on): the decodes meanwhile
/// read the weights where they were, the staged buffers count in the
/// model's memory until the commit frees the old ones, and greedy decoding
/// keeps its tokens across the commit.
#[test]
fn a_staged_promotion_copies_while_decoding_goes_on_and_commits_between_two_decodes() {
    let model = load(false, true);
    let prompt = prompt(&model);
    let mut ctx = Context::new(&model, params()).unwrap();
    let reference = greedy(&mut ctx, &prompt, N_TOKENS, |_, _| {});

    let moved = some_weights(&model);
    let expected: u64 = moved.iter().map(|n| model.tensor_alloc_size(n, cpu()).unwrap()).sum();
    let mut cpu_before = 0;
    let (mut staged_at, mut committed_at) = (None, None);
    let mut report = None;
    let tokens = greedy(&mut ctx, &prompt, N_TOKENS, |i, ctx| {
        if i == 2 {
            cpu_before = model_bytes(ctx, "CPU");
            assert_eq!(stage_state(&ctx.context_ref()), StageState::None);
            stage_weights(ctx.context_ref(), &promotions(&moved)).unwrap();
            staged_at = Some(i);
            return;
        }
        if staged_at.is_none() || committed_at.is_some() {
            return;
        }
        match stage_state(&ctx.context_ref()) {
            StageState::Copying { .. } => {}
            StageState::Ready { staged_bytes, copy } => {
                assert_eq!(staged_bytes, expected);
                assert!(copy > std::time::Duration::ZERO);
                // Staged and old buffers both count until the commit.
                assert_eq!(model_bytes(ctx, "CPU"), cpu_before + expected);
                let r = commit_staged(ctx.context_ref(), None).unwrap();
                assert_eq!(stage_state(&ctx.context_ref()), StageState::None);
                // The weights point at the staged buffers; their old ones
                // are freed. (Without the repoint the old buffers would stay
                // and the model would keep `expected` more.)
                assert_eq!(model_bytes(ctx, "CPU"), cpu_before);
                report = Some(r);
                committed_at = Some(i);
            }
            other => panic!("{other:?}"),
        }
    });
    let r = report.expect("the staged copies completed and were committed");
    assert!(committed_at.unwrap() < N_TOKENS - 2, "{committed_at:?}");
    assert_eq!(r.moved, moved.len());
    assert_eq!(r.bytes_to_device, expected);
    assert!(r.side_copy > std::time::Duration::ZERO && r.elapsed > std::time::Duration::ZERO);
    assert_eq!(
        tokens, reference,
        "tokens across the staged promotion differ from the unmoved run"
    );
}

/// A shrink that arrives while a promotion is staged: the demotion
/// (`migrate_weights`) cancels the stage first and frees its buffers, and
/// an explicit cancel frees them too; the weights stay where they were and
/// the tokens are those of a run without it.
#[test]
fn a_staged_promotion_is_cancelled_cleanly_by_a_shrink() {
    let model = load(false, true);
    let prompt = prompt(&model);
    let mut ctx = Context::new(&model, params()).unwrap();
    let reference = greedy(&mut ctx, &prompt, N_TOKENS, |_, _| {});

    let moved = some_weights(&model);
    let (staged, demoted) = moved.split_at(moved.len() / 2);
    let mut checked = 0;
    let tokens = greedy(&mut ctx, &prompt, N_TOKENS, |i, ctx| {
        if i != 3 && i != 6 {
            return;
        }
        let cpu_before = model_bytes(ctx, "CPU");
        stage_weights(ctx.context_ref(), &promotions(staged)).unwrap();
        assert_ne!(stage_state(&ctx.context_ref()), StageState::None);
        if i == 3 {
            // The card shrinks: demote other weights.
            let moves: Vec<WeightMove> = demoted
                .iter()
                .map(|n| WeightMove {
                    tensor: n.clone(),
                    to: Residence::Host,
                })
                .collect();
            let r = migrate_weights(ctx.context_ref(), &moves).unwrap();
            assert_eq!(r.moved, demoted.len());
        } else {
            cancel_staged(ctx.context_ref());
            // Cancelling twice is harmless.
            cancel_staged(ctx.context_ref());
        }
        assert_eq!(stage_state(&ctx.context_ref()), StageState::None);
        assert_eq!(model_bytes(ctx, "CPU"), cpu_before, "the staged buffers were not freed");
        assert!(matches!(
            commit_staged(ctx.context_ref(), None),
            Err(EngineError::NothingStaged)
        ));
        checked += 1;
    });
    assert_eq!(checked, 2);
    assert_eq!(tokens, reference);
}

#[test]
fn a_bad_stage_is_a_clean_error_and_stages_nothing() {
    let model = load(false, true);
    let mut ctx = Context::new(&model, params()).unwrap();
    let names = some_weights(&model);
    let err = stage_weights(ctx.context_ref(), &promotions(&["blk.0.nope.weight".to_string()])).unwrap_err();
    assert!(matches!(err, EngineError::UnknownWeight { .. }), "{err}");
    let twice = vec![names[0].clone(), names[0].clone()];
    let err = stage_weights(ctx.context_ref(), &promotions(&twice)).unwrap_err();
    assert!(err.to_string().contains("listed twice"), "{err}");
    let to_host = [WeightMove {
        tensor: names[0].clone(),
        to: Residence::Host,
    }];
    assert!(stage_weights(ctx.context_ref(), &to_host).is_err());
    assert!(stage_weights_to(ctx.context_ref(), &[]).is_err());
    assert_eq!(stage_state(&ctx.context_ref()), StageState::None);

    stage_weights(ctx.context_ref(), &promotions(&names[..2])).unwrap();
    let err = stage_weights(ctx.context_ref(), &promotions(&names[2..4])).unwrap_err();
    assert!(err.to_string().contains("staged already"), "{err}");
    // The model is freed with its stage (the drop order: context, model).
}
