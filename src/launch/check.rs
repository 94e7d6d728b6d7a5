//! Checking a plan against what llama.cpp really allocates, before loading
//! (its no-alloc reservation) and after (its buffers, and the process's
//! device memory as NVML reports it once the largest ubatch has run).

use std::path::Path;

use super::LaunchError;
use crate::engine::{self, Context, ContextParams, MemorySource, Token};
use crate::gguf::ModelInfo;
use crate::plan::{self, apply::apply, fmt_bytes, make_plan, Plan, PlanRequest};
use crate::profile::MachineProfile;

/// Device bytes llama.cpp reserves for `plan` (weights, KV cache, compute
/// buffers and streaming slots), from its own no-alloc reservation of
/// exactly this placement in the context `cp` will create (its length,
/// sequences, KV types, flash attention): nothing is loaded or allocated.
pub fn dry_run_bytes(model: &Path, plan: &Plan, cp: &ContextParams) -> Result<u64, LaunchError> {
    let applied = apply(plan)?;
    let mut mp = engine::ModelParams::default();
    applied.configure_model(&mut mp);
    let mut cp = cp.clone();
    applied.configure_context(&mut cp);
    Ok(engine::dry_run_device_bytes(model, mp, cp)?)
}

/// Make a plan and check it against llama.cpp's own reservation
/// ([`dry_run_bytes`]). When the reserved bytes differ from the plan's
/// estimate, the compute-buffer estimate is corrected by the difference and
/// the plan made again, at most three times; the last measurement is kept
/// in the plan. Without a GPU backend there is nothing to measure.
pub fn make_measured_plan(
    model: &Path,
    info: &ModelInfo,
    profile: &MachineProfile,
    mut req: PlanRequest,
    cp: &ContextParams,
) -> Result<Plan, LaunchError> {
    let mut plan = make_plan(info, profile, &req)?;
    if !engine::has_gpu() {
        return Ok(plan);
    }
    for round in 0..3 {
        let measured = dry_run_bytes(model, &plan, cp)?;
        plan.vram.measured = Some(measured);
        // What llama.cpp reserves: everything but the reserve and the
        // streaming overhead, which it does not see.
        let unseen = plan.vram.reserve + plan.vram.stream_overhead;
        let estimated = plan.vram.persistent() + plan.vram.language_peak() - unseen;
        // The vision encoder's peak beyond the language model's compute.
        let vision_extra = plan.vram.vision_peak.saturating_sub(plan.vram.language_peak());
        tracing::info!(
            "plan check {}: llama.cpp reserves {} on the GPU, the plan estimated {}",
            round + 1,
            fmt_bytes(measured),
            fmt_bytes(estimated)
        );
        let fits = measured + unseen + vision_extra <= req.budget;
        let close = measured.abs_diff(estimated) <= req.budget / 50;
        if fits && close {
            break;
        }
        // Correct the compute estimate (the only part not known exactly).
        let analytic = plan.vram.compute.saturating_sub(plan::small_bytes(info)).max(1) as f64;
        let target = (analytic + measured as f64 - estimated as f64).max(analytic * 0.05);
        req.compute_scale *= target / analytic;
        plan = make_plan(info, profile, &req)?;
    }
    Ok(plan)
}

/// Device memory of a loaded plan, checked against its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct LoadedMemory {
    pub budget: u64,
    /// llama.cpp's own device buffers (weights, KV caches, compute).
    pub llama: u64,
    /// What the plan budgets outside them.
    pub overhead: u64,
    /// The process's device memory as NVML reports it, after the warm-up,
    /// and how it was read; None without NVML.
    pub process: Option<(u64, MemorySource)>,
}

/// Refuse a loaded model over its budget: llama.cpp's buffers plus the
/// overhead the plan budgets for the rest of the process, and the
/// process's own figure where NVML gives one.
pub fn verify(memory: LoadedMemory) -> Result<LoadedMemory, LaunchError> {
    let planned = memory.llama + memory.overhead;
    if planned > memory.budget {
        return Err(LaunchError::OverBudget {
            what: format!(
                "llama.cpp's buffers ({}) and the process overhead the plan budgets ({})",
                fmt_bytes(memory.llama),
                fmt_bytes(memory.overhead)
            ),
            used: planned,
            budget: memory.budget,
        });
    }
    if let Some((process, _)) = memory.process {
        if process > memory.budget {
            return Err(LaunchError::OverBudget {
                what: format!(
                    "the process's device memory as NVML reports it ({} of it in llama.cpp's buffers)",
                    fmt_bytes(memory.llama)
                ),
                used: process,
                budget: memory.budget,
            });
        }
    }
    Ok(memory)
}

/// llama.cpp's device bytes in `contexts` and their models.
pub fn llama_device_bytes(contexts: &[&Context<'_>]) -> u64 {
    contexts.iter().map(|c| c.device_bytes()).sum()
}

/// Run the largest ubatch `ctx` takes, then one token, and clear it: what
/// grows on first use (ggml-cuda's pool, cuBLAS, CUDA graphs) has grown,
/// so the process's figure after it is its peak.
pub fn warm_up(ctx: &mut Context<'_>, n_ubatch: u32) -> Result<(), LaunchError> {
    warm_up_to_depth(ctx, n_ubatch)?;
    ctx.clear();
    Ok(())
}

/// [`warm_up`] without the clearing: returns the cells of sequence 0 it
/// left in the cache.
fn warm_up_to_depth(ctx: &mut Context<'_>, n_ubatch: u32) -> Result<u32, LaunchError> {
    // A ubatch, then one token after it (decode's graph): both must fit the
    // context, so a ubatch as long as the context leaves the last cell.
    let n_ctx = ctx.n_ctx() as usize;
    let n = (n_ubatch as usize).min(n_ctx.saturating_sub(1)).max(1);
    let n_vocab = ctx.model().n_vocab().max(2) as u64;
    let tokens: Vec<Token> = (0..n as u64)
        .map(|i| ((i * 7919 + 1) % (n_vocab - 1)) as Token)
        .collect();
    ctx.decode_tokens(&tokens, 0, true)?;
    if n < n_ctx {
        ctx.decode_tokens(&tokens[..1], n as i32, true)?;
        return Ok(n as u32 + 1);
    }
    Ok(n as u32)
}

impl super::Session {
    /// Check the loaded context `main` and any `others` beside it (a
    /// draft's) against the budget, after warming `main` up at the plan's
    /// ubatch and choosing its decode split at the depth of that ubatch
    /// ([`super::tune::tune_split`]), so that the process's figure holds
    /// what every setting tried allocated.
    pub fn verify_loaded(
        &mut self,
        main: &mut Context<'_>,
        others: &[&Context<'_>],
    ) -> Result<LoadedMemory, LaunchError> {
        let gpu = engine::has_gpu();
        // The decode tier's residency, where the split is tuned, holds
        // other memory than the prompt's: both are checked.
        let mut decoding = None;
        if gpu {
            let depth = warm_up_to_depth(main, self.plan().ubatch)?;
            self.enter_decode(main)?;
            super::tune::tune_split(self, main, depth)?;
            decoding = engine::process_device_bytes();
            self.leave_decode(main)?;
            main.clear();
        }
        let mut contexts: Vec<&Context<'_>> = vec![main];
        contexts.extend_from_slice(others);
        let process = gpu.then(engine::process_device_bytes).flatten();
        let process = match (process, decoding) {
            (Some(p), Some(d)) if d.0 > p.0 => Some(d),
            (p, _) => p,
        };
        if gpu && process.is_none() {
            tracing::warn!(
                "NVML (libnvidia-ml.so.1) is not available: only llama.cpp's buffers and the budgeted overhead are checked against the budget, not the process's device memory"
            );
        }
        verify(LoadedMemory {
            budget: self.launch().budget,
            llama: llama_device_bytes(&contexts),
            overhead: self.launch().overhead.total(),
            process,
        })
    }
}
