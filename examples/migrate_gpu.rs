//! Live weight migration on a GPU (patch 0023), measured: load a model with
//! an exact-mode plan under a budget and with movable weights, decode
//! greedily, demote about `DEMOTE_MIB` of device weights to pinned host
//! memory between two decodes, go on decoding, promote them back, go on
//! again; the tokens must be those of the run without moves, and the
//! process's device memory (NVML) must drop by about what was demoted.
//!
//! ```sh
//! ./dev cargo run --release --example migrate_gpu -- MODEL.gguf BUDGET PROFILE.yaml [DEMOTE_MIB] [N_TOKENS]
//! ```
//! Prints one JSON object per line; exits non-zero when a check fails.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use anyhow::{bail, Context as _, Result};
use pipeshard::engine::argmax;
use pipeshard::engine::{
    self, migrate_weights, Context, ContextParams, ModelParams, Offload, OffloadPolicy, Residence, Token, WeightMove,
};
use pipeshard::launch::{plan_for, LaunchRequest, PipeshardOptions};
use pipeshard::plan::Workload;

fn device_bytes() -> u64 {
    engine::process_device_bytes().map_or(0, |(b, _)| b)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        bail!("usage: migrate_gpu MODEL.gguf BUDGET PROFILE.yaml [DEMOTE_MIB] [N_TOKENS]");
    }
    let model_path = std::path::PathBuf::from(&args[0]);
    let demote_bytes = args.get(3).map_or(Ok(1024), |s| s.parse::<u64>())? << 20;
    let n_tokens: usize = args.get(4).map_or(Ok(48), |s| s.parse())?;
    let (k_demote, k_promote) = (n_tokens / 3, 2 * n_tokens / 3);
    // The engine's "moved weights" line (with the compute reservation's
    // share of each move) goes to stderr.
    pipeshard::logging::init(0);
    engine::init(None)?;
    let threads = engine::default_threads();

    let options = PipeshardOptions {
        vram_budget: Some(args[1].clone()),
        profile: Some(args[2].clone().into()),
        exact: true,
        ..Default::default()
    };
    let prompt_text = "The history of the printing press begins";
    let req = LaunchRequest::new(
        &model_path,
        &options,
        threads,
        Workload {
            prompt_tokens: 16,
            gen_tokens: n_tokens as u64,
            speculation: None,
            parallel: 1,
        },
    )?;
    let mut cp = ContextParams {
        n_ctx: 4096,
        n_threads: Some(threads),
        n_threads_batch: Some(threads),
        ..Default::default()
    };
    let launch = plan_for(&req, &cp, |_, _| {})?.context("no plan: is the GPU backend loaded?")?;
    let mut mp = ModelParams::default();
    launch.install(&mut mp, &mut cp)?;
    mp.movable_weights = true;
    let plan_slots = cp.stream_slots;

    // Exact mode: every op of a demoted weight runs on the GPU (streamed),
    // as a re-plan in exact mode would decide.
    let demoted: Arc<RwLock<HashSet<String>>> = Arc::default();
    let base = cp.offload.clone();
    let seen = demoted.clone();
    let policy: OffloadPolicy = Arc::new(move |q| {
        if seen.read().unwrap().contains(q.weight) {
            Offload::Gpu
        } else {
            base.as_ref().map_or(Offload::Default, |b| b(q))
        }
    });
    cp.offload = Some(policy);

    let t = Instant::now();
    let model = engine::Model::load(&model_path, mp)?;
    let mut ctx = Context::new(&model, cp)?;
    let (gpu, _) = engine::residence_buffer_types()?;
    println!(
        "{}",
        serde_json::json!({"event": "loaded", "s": t.elapsed().as_secs_f64(), "device_bytes": device_bytes(),
            "resident_bytes": launch.plan.resident_bytes(), "budget": launch.budget, "stream_slots": plan_slots})
    );

    // The weights to demote: feed-forward weights the plan keeps on the
    // device, from the first layer on, up to `demote_bytes`.
    let mut names = Vec::new();
    let mut total = 0;
    for t in launch
        .plan
        .tensors
        .iter()
        .filter(|t| t.resident && t.name.contains(".ffn_"))
    {
        if total >= demote_bytes {
            break;
        }
        total += model.tensor_alloc_size(&t.name, gpu).unwrap_or(t.vram_bytes);
        names.push(t.name.clone());
    }
    if names.is_empty() {
        bail!("the plan keeps no feed-forward weight on the device");
    }

    let prompt = model.tokenize(prompt_text, true, false)?;
    let run = |ctx: &mut Context<'_>,
               between: &mut dyn FnMut(usize, &mut Context<'_>) -> Result<()>|
     -> Result<(Vec<Token>, Vec<f64>)> {
        ctx.clear();
        ctx.decode_tokens(&prompt, 0, true)?;
        let (mut out, mut ms) = (Vec::new(), Vec::new());
        for i in 0..n_tokens {
            let tok = argmax(ctx.logits(-1)?);
            out.push(tok);
            between(i, ctx)?;
            let t = Instant::now();
            ctx.decode_tokens(&[tok], (prompt.len() + i) as i32, true)?;
            ctx.logits(-1)?;
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        Ok((out, ms))
    };
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };

    let (reference, ref_ms) = run(&mut ctx, &mut |_, _| Ok(()))?;
    println!(
        "{}",
        serde_json::json!({"event": "reference", "tokens": reference.len(), "decode_ms_median": median(&ref_ms),
            "device_bytes": device_bytes()})
    );

    let report_move = |what: &str, ctx: &mut Context<'_>, to: Residence| -> Result<()> {
        let before = device_bytes();
        if to == Residence::Host {
            demoted.write().unwrap().extend(names.iter().cloned());
            if plan_slots == 0 {
                ctx.context_ref()
                    .set_stream_slots(pipeshard::plan::DEFAULT_STREAM_SLOTS, 0);
            }
        } else if plan_slots == 0 {
            ctx.context_ref().set_stream_slots(0, 0);
        }
        let moves: Vec<WeightMove> = names.iter().map(|n| WeightMove { tensor: n.clone(), to }).collect();
        let r = migrate_weights(ctx.context_ref(), &moves)?;
        if to == Residence::Device {
            demoted.write().unwrap().clear();
        }
        let after = device_bytes();
        let residence_ok = names.iter().all(|n| ctx.context_ref().residence(n) == Some(to));
        println!(
            "{}",
            serde_json::json!({"event": what, "moved": r.moved, "bytes_to_host": r.bytes_to_host,
                "bytes_to_device": r.bytes_to_device, "device_bytes_freed": r.device_bytes_freed, "to_home": r.to_home,
                "ms": r.elapsed.as_secs_f64() * 1e3, "nvml_before": before, "nvml_after": after,
                "nvml_delta": after as i64 - before as i64, "residence_ok": residence_ok})
        );
        Ok(())
    };
    let (tokens, ms) = run(&mut ctx, &mut |i, ctx| match i {
        _ if i == k_demote => report_move("demote", ctx, Residence::Host),
        _ if i == k_promote => report_move("promote", ctx, Residence::Device),
        _ => Ok(()),
    })?;
    let same = tokens == reference;
    println!(
        "{}",
        serde_json::json!({"event": "moved_run", "identical_tokens": same,
            "first_difference": tokens.iter().zip(&reference).position(|(a, b)| a != b),
            "decode_ms_median_before": median(&ms[1..=k_demote]),
            "decode_ms_median_demoted": median(&ms[k_demote + 2..=k_promote]),
            "decode_ms_median_promoted": median(&ms[k_promote + 2..]),
            "device_bytes": device_bytes()})
    );
    if !same {
        bail!("tokens after the moves differ from the run without moves");
    }
    Ok(())
}
