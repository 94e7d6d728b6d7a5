//! A weight move whose allocation fails (patch 0023) moves nothing: every
//! destination is allocated before any weight changes, so the model keeps
//! its memory and decodes as before. A move keeps the context's compute
//! buffers, so that nothing else can take that memory before it reserves
//! again; and a decode whose compute reservation fails returns an error and
//! leaves the context usable. Its own test binary, because it caps the
//! address space of the whole process for a moment (with util-linux's
//! `prlimit`), which no other test may share (the tests take turns).

mod common;

use std::process::Command;
use std::sync::Mutex;

use common::{cpu_buffer_type, greedy, load_on_plain_cpu};
use pipeshard::engine::argmax;
use pipeshard::engine::{migrate_weights_to, move_weights, BufferType, Context, ContextParams, EngineError};

/// The address-space cap is the whole process's: one test at a time.
static CAP: Mutex<()> = Mutex::new(());

fn vm_size() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmSize in /proc/self/status");
    kb * 1024
}

fn set_soft_as_limit(limit: &str) {
    let pid = std::process::id().to_string();
    let out = Command::new("prlimit")
        .args(["--pid", &pid, &format!("--as={limit}:")])
        .output()
        .expect("running prlimit (util-linux)");
    assert!(
        out.status.success(),
        "prlimit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_failed_allocation_moves_nothing() {
    let _turn = CAP.lock().unwrap_or_else(|e| e.into_inner());
    let cpu: BufferType = cpu_buffer_type();
    // The weights start in the file's mapping (CPU_Mapped), so a half-done
    // move would show as weights in CPU buffers.
    let model = load_on_plain_cpu(true, true);
    let prompt = model.tokenize("Once upon a time", true, false).unwrap();
    let mut ctx = Context::new(&model, common::small_context_params()).unwrap();
    let reference = greedy(&mut ctx, &prompt, 12, |_, _| {});
    let before = format!("{:?}", ctx.memory_breakdown());

    let gguf = pipeshard::gguf::GgufFile::open(model.path()).unwrap();
    let names: Vec<String> = gguf.tensors().iter().map(|t| t.name.clone()).collect();
    let total: u64 = names.iter().map(|n| model.tensor_alloc_size(n, cpu).unwrap()).sum();
    let margin = 24u64 << 20;
    assert!(
        total > 2 * margin,
        "the model's weights ({total} bytes) must not fit the margin"
    );
    let moves: Vec<(&str, BufferType)> = names.iter().map(|n| (n.as_str(), cpu)).collect();

    // Room for a few of the new buffers, not for all of them.
    set_soft_as_limit(&(vm_size() + margin).to_string());
    let res = migrate_weights_to(ctx.context_ref(), &moves);
    set_soft_as_limit("unlimited");

    let err = res.expect_err("the move had no room and still succeeded");
    assert!(matches!(err, EngineError::WeightAlloc { done: 0, .. }), "{err}");
    assert!(err.to_string().contains("none of the weights"), "{err}");
    assert_eq!(
        format!("{:?}", ctx.memory_breakdown()),
        before,
        "a failed move kept memory"
    );
    assert_eq!(greedy(&mut ctx, &prompt, 12, |_, _| {}), reference);

    assert_eq!(
        ctx.context_ref().weight_buffer_type(&names[0]).map(|b| b.name()),
        Some("CPU_Mapped".into())
    );

    // With room again, the same move goes through.
    let r = migrate_weights_to(ctx.context_ref(), &moves).unwrap();
    assert_eq!(r.bytes_to_host, total);
    let model_bytes = |name: &str| -> u64 {
        ctx.memory_breakdown()
            .iter()
            .filter(|m| m.buffer_type == name)
            .map(|m| m.model)
            .sum()
    };
    assert_eq!((model_bytes("CPU_Mapped"), model_bytes("CPU")), (0, total));
    assert_eq!(greedy(&mut ctx, &prompt, 12, |_, _| {}), reference);
}

#[test]
fn a_move_keeps_the_compute_buffers_and_a_failed_reservation_fails_the_decode_cleanly() {
    let _turn = CAP.lock().unwrap_or_else(|e| e.into_inner());
    let cpu: BufferType = cpu_buffer_type();
    let model = load_on_plain_cpu(false, true);
    let prompt = model.tokenize("Once upon a time", true, false).unwrap();
    // A ubatch whose compute buffer is larger than glibc's largest mmap
    // threshold (32 MiB): freed, it goes back to the system, and allocated
    // again it needs new address space.
    let params = ContextParams {
        n_ubatch: 512,
        n_batch: 512,
        ..common::small_context_params()
    };
    let mut ctx = Context::new(&model, params).unwrap();
    let reference = greedy(&mut ctx, &prompt, 12, |_, _| {});
    let compute: u64 = ctx.memory_breakdown().iter().map(|m| m.compute).sum();
    // Room for building graphs, not for the compute buffers.
    let margin = compute / 2;
    assert!(
        margin > 32 << 20,
        "compute buffers of {compute} bytes are too small for this test"
    );

    ctx.clear();
    ctx.decode_tokens(&prompt, 0, true).unwrap();
    let mut out = Vec::new();
    for i in 0..12 {
        let t = argmax(ctx.logits(-1).unwrap());
        out.push(t);
        let pos = (prompt.len() + i) as i32;
        match i {
            3 => {
                // The move rebuilds the graphs; the reservation at the next
                // decode reuses the buffers the context already has.
                let r = move_weights(ctx.context_ref(), &[("output_norm.weight", cpu)]).unwrap();
                assert_eq!(r.moved, 1);
                set_soft_as_limit(&(vm_size() + margin).to_string());
                let res = ctx.decode_tokens(&[t], pos, true);
                set_soft_as_limit("unlimited");
                res.expect("the reservation after a move needed the compute buffers anew");
            }
            6 => {
                // The compute buffers are gone and there is no room for
                // them: the decode fails, twice, and then goes through.
                ctx.release_compute();
                set_soft_as_limit(&(vm_size() + margin).to_string());
                let first = ctx.decode_tokens(&[t], pos, true);
                let second = ctx.decode_tokens(&[t], pos, true);
                set_soft_as_limit("unlimited");
                for res in [first, second] {
                    let err = res.expect_err("the compute buffers fit the margin");
                    assert!(matches!(err, EngineError::Decode { code: -2 }), "{err}");
                }
                ctx.decode_tokens(&[t], pos, true).unwrap();
            }
            _ => ctx.decode_tokens(&[t], pos, true).unwrap(),
        }
    }
    assert_eq!(out, reference, "tokens changed across the move and the failed decodes");
}
