//! Cancelling a staged promotion (patch 0028) gives its memory back: on the
//! CPU the staged buffers are host memory the C allocator hands out, so
//! its figure of bytes in use rises by the staged bytes while they are
//! staged and falls back when the stage is cancelled. (A test of its own:
//! that figure is the whole process's, which other tests running beside
//! it would move.)

mod common;

use std::time::{Duration, Instant};

use common::load_on_plain_cpu as load;
use pipeshard::engine::{
    cancel_staged, heap_in_use, stage_state, stage_weights, Context, Residence, StageState, WeightMove,
};

#[test]
#[cfg_attr(
    not(all(target_os = "linux", target_env = "gnu")),
    ignore = "the C allocator's bytes in use are read through glibc's mallinfo2 only"
)]
fn cancelling_a_staged_promotion_frees_its_memory() {
    assert!(heap_in_use().is_some(), "glibc's mallinfo2 gave no figure");
    let model = load(false, true);
    let mut ctx = Context::new(&model, common::small_context_params()).unwrap();
    let prompt = model.tokenize("The capital of France is", true, false).unwrap();
    ctx.decode_tokens(&prompt, 0, true).unwrap();

    let last = model.n_layer() - 1;
    let gguf = pipeshard::gguf::GgufFile::open(model.path()).unwrap();
    let moves: Vec<WeightMove> = gguf
        .tensors()
        .iter()
        .filter(|t| t.name == "token_embd.weight" || t.name.starts_with(&format!("blk.{last}.")))
        .map(|t| WeightMove {
            tensor: t.name.clone(),
            to: Residence::Device,
        })
        .collect();
    assert!(moves.len() > 5);

    for round in 0..3 {
        let before = heap_in_use().unwrap();
        stage_weights(ctx.context_ref(), &moves).unwrap();
        let start = Instant::now();
        let staged = loop {
            match stage_state(&ctx.context_ref()) {
                StageState::Ready { staged_bytes, .. } => break staged_bytes,
                StageState::Copying { .. } if start.elapsed() < Duration::from_secs(30) => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                other => panic!("{other:?}"),
            }
        };
        assert!(staged > 10 << 20, "{staged}");
        let during = heap_in_use().unwrap();
        assert!(
            during >= before + staged - staged / 10,
            "round {round}: staged {staged} bytes, the allocator's bytes in use went from {before} to {during}"
        );
        cancel_staged(ctx.context_ref());
        let after = heap_in_use().unwrap();
        assert!(
            after <= before + staged / 10,
            "round {round}: cancelling freed too little: {before} before staging, {during} staged, {after} after"
        );
    }
    // Decoding goes on.
    ctx.decode_tokens(&prompt[..1], prompt.len() as i32, true).unwrap();
}
