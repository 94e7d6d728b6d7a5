//! The decode tier on a GPU, measured within one process: load a model
//! under a budget through the launch path, fill the context to a depth with
//! one prompt, then alternate blocks of decode steps with the decode tier
//! in force and without it (`Session::enter_decode` / `leave_decode`), the
//! same steps at the same depth each time. Host drift between processes is
//! as large as the tier's effect; alternating in one process is not.
//!
//! ```sh
//! ./dev cargo run --release --example decode_tier_gpu -- MODEL.gguf BUDGET PROFILE.yaml [ROUNDS] [GEN_TOKENS]
//! ```
//! GEN_TOKENS is the workload the plan is made for (default 512, where
//! the tier pays for its switch for both reference models). Prints one
//! JSON object per block and a summary; exits non-zero when the tier is
//! not planned or the process goes over its budget.

use std::time::Instant;

use anyhow::{bail, Result};
use pipeshard::engine::{self, Context, ContextParams, FlashAttention, ModelParams, Token};
use pipeshard::launch::{plan_for, LaunchRequest, PipeshardOptions};
use pipeshard::plan::Workload;

const DEPTH: u32 = 4096;
const SETTLE: usize = 3;
const TIMED: usize = 16;

fn device_bytes() -> u64 {
    engine::process_device_bytes().map_or(0, |(b, _)| b)
}

/// Median seconds of `TIMED` single-token decodes at `DEPTH`, after
/// `SETTLE` others; their cells are removed again.
fn block(ctx: &mut Context<'_>, n_vocab: u64) -> Result<f64> {
    let mut times = Vec::new();
    let mut tok: Token = 1;
    for i in 0..SETTLE + TIMED {
        let t = Instant::now();
        ctx.decode_tokens(&[tok], (DEPTH as usize + i) as i32, true)?;
        tok = (ctx.greedy_token(-1)? as u64 % n_vocab) as Token;
        if i >= SETTLE {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    if !ctx.seq0().seq_rm(DEPTH as i32, -1) {
        bail!("the model's memory cannot drop the decoded cells (a recurrent state)");
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        bail!("usage: decode_tier_gpu MODEL.gguf BUDGET PROFILE.yaml [ROUNDS] [GEN_TOKENS]");
    }
    let model_path = std::path::PathBuf::from(&args[0]);
    let rounds: usize = args.get(3).map_or(Ok(6), |s| s.parse())?;
    let gen_tokens: u64 = args.get(4).map_or(Ok(512), |s| s.parse())?;
    pipeshard::logging::init(0);
    engine::init(None)?;
    let options = PipeshardOptions {
        vram_budget: Some(args[1].clone()),
        profile: Some(args[2].clone().into()),
        ..Default::default()
    };
    let req = LaunchRequest::new(
        &model_path,
        &options,
        16,
        Workload {
            prompt_tokens: DEPTH as u64,
            gen_tokens,
            speculation: None,
            parallel: 1,
        },
    )?;
    // The reference context: 4096 + 64 tokens, rounded up to 256.
    let n_ctx = (DEPTH + 64).div_ceil(256) * 256;
    let mut cp = ContextParams {
        n_ctx,
        n_batch: DEPTH,
        n_threads: Some(16),
        n_threads_batch: Some(16),
        flash_attention: FlashAttention::On,
        backend_greedy: true,
        ..Default::default()
    };
    let Some(launch) = plan_for(&req, &cp, |_, _| {})? else {
        bail!("no plan (no budget or no GPU)");
    };
    let Some(tier) = launch.plan.decode_tier.clone() else {
        bail!("the plan has no decode tier for {gen_tokens} generated tokens");
    };
    let mut mp = ModelParams::default();
    let mut session = launch.install(&mut mp, &mut cp)?;
    let model = engine::Model::load(&model_path, mp)?;
    let mut ctx = Context::new(&model, cp)?;
    let n_vocab = model.n_vocab().max(2) as u64;
    let prompt: Vec<Token> = (0..DEPTH).map(|i| (i as u64 * 7919 % n_vocab) as Token).collect();
    ctx.decode_tokens(&prompt, 0, true)?;
    ctx.greedy_token(-1)?;
    let mut peak = device_bytes();
    println!(
        "{}",
        serde_json::json!({
            "plan_ubatch": launch.plan.ubatch, "tier_units": tier.units.len(), "tier_bytes": tier.bytes(),
            "tier_compute": tier.compute, "predicted_decode": launch.plan.predicted.decode_tok_s,
            "predicted_tier_decode": tier.predicted_decode_tok_s, "split": launch.plan.hybrid_gpu_experts,
            "row_share": launch.plan.row_split_share,
        })
    );
    // The plan's own split, not tuned: both arms run the same share.
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        // Alternate which arm goes first.
        for arm in if r % 2 == 0 { [true, false] } else { [false, true] } {
            let t = Instant::now();
            let entry = if arm { session.enter_decode(&mut ctx)? } else { None };
            let switch_s = t.elapsed().as_secs_f64();
            let step = block(&mut ctx, n_vocab)?;
            peak = peak.max(device_bytes());
            if arm {
                session.leave_decode(&mut ctx)?;
                on.push(step);
            } else {
                off.push(step);
            }
            println!(
                "{}",
                serde_json::json!({
                    "round": r, "tier": arm, "step_ms": step * 1e3, "switch_ms": switch_s * 1e3,
                    "units": entry.as_ref().map(|e| e.units), "process_bytes": device_bytes(),
                    "llama_bytes": ctx.device_bytes(),
                })
            );
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let over = peak > launch.budget;
    println!(
        "{}",
        serde_json::json!({
            "summary": true, "on_ms": mean(&on) * 1e3, "off_ms": mean(&off) * 1e3,
            "on_tok_s": 1.0 / mean(&on), "off_tok_s": 1.0 / mean(&off),
            "speedup": mean(&off) / mean(&on), "peak_bytes": peak, "budget": launch.budget, "over_budget": over,
        })
    );
    if over {
        bail!("the process went over its budget: {peak} > {}", launch.budget);
    }
    Ok(())
}
