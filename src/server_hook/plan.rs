//! The plan for a model the server loads: made for exactly the parameters
//! upstream resolved, and installed into them.

use std::path::Path;
use std::sync::Mutex;

use super::options::{Budget, ServerOptions};
use super::ServeError;
use crate::engine::{self, ContextParams, LoadDecision, LoadRequest, LoadRole, ModelParams};
use crate::plan::runtime::{self, DraftSource, PlanSource};
use crate::plan::{self, Plan};

/// What the server's plan decided, for later loads (the draft) and for
/// reports (/props, /metrics).
#[derive(Debug, Clone)]
pub struct Installed {
    pub plan: Plan,
    /// The plan's place for the draft model: Some(true) on the GPU.
    pub draft_on_gpu: Option<bool>,
}

static INSTALLED: Mutex<Option<Installed>> = Mutex::new(None);

/// The plan installed at the last target-model load, if any.
pub fn installed() -> Option<Installed> {
    INSTALLED.lock().ok().and_then(|g| g.clone())
}

/// The load hook: plan the target model for upstream's parameters (and its
/// draft), and place the draft where that plan put it.
pub fn on_load(
    opts: &ServerOptions,
    req: &LoadRequest,
    mp: &mut ModelParams<'static>,
    cp: &mut ContextParams,
) -> Result<LoadDecision, ServeError> {
    match req.role {
        LoadRole::Target => {
            let Some(installed) = plan_target(opts, req, mp, cp)? else {
                return Ok(LoadDecision::Upstream);
            };
            *INSTALLED.lock().map_err(|_| ServeError::Poisoned)? = Some(installed);
            Ok(LoadDecision::Placed)
        }
        LoadRole::Draft => match installed().and_then(|i| i.draft_on_gpu) {
            Some(on_gpu) => {
                mp.n_gpu_layers = if on_gpu { -1 } else { 0 };
                tracing::info!(
                    "draft {}: on the {}, as planned",
                    req.model.display(),
                    if on_gpu { "GPU" } else { "CPU" }
                );
                Ok(LoadDecision::Placed)
            }
            None => Ok(LoadDecision::Upstream),
        },
    }
}

/// The one place the server turns options and upstream's parameters into
/// an installed plan (`None`: no budget and no plan, upstream placement).
// TODO(launch): call launch's planner with `mp`/`cp` as they are, once it
// lands; it plans for n_seq_max, KV types and flash attention too.
fn plan_target(
    opts: &ServerOptions,
    req: &LoadRequest,
    mp: &mut ModelParams<'static>,
    cp: &mut ContextParams,
) -> Result<Option<Installed>, ServeError> {
    if !opts.plans() {
        return Ok(None);
    }
    let budget = match opts.vram_budget {
        None => None,
        Some(Budget::Bytes(b)) => Some(b),
        Some(Budget::Auto) => {
            let gpu = engine::first_device(engine::DeviceKind::Gpu).ok_or(ServeError::AutoBudgetNoGpu)?;
            Some(gpu.free_bytes.saturating_sub((gpu.total_bytes / 20).max(512 << 20)))
        }
    };
    let n_ctx = context_length(&req.model, cp.n_ctx)?;
    let source = PlanSource {
        plan_file: opts.plan.clone(),
        budget,
        profile: opts.profile.clone(),
        stream_slots: opts.stream_slots,
        hybrid_gpu_experts: opts.hybrid_experts,
        draft: req.draft.clone().map(|path| DraftSource {
            path,
            on_gpu: None,
            draft_tokens: DRAFT_N_MAX,
            acceptance: opts.draft_acceptance,
        }),
        ..Default::default()
    };
    let threads = cp.n_threads.unwrap_or_else(engine::default_threads);
    let planned =
        runtime::plan_for_model(&source, &req.model, n_ctx, threads, |_, _| {}).map_err(|source| ServeError::Plan {
            model: req.model.clone(),
            source,
        })?;
    let Some((plan, applied)) = planned else {
        return Ok(None);
    };
    let upstream_outputs = cp.n_outputs_max;
    applied.configure_model(mp);
    applied.configure_context(cp);
    // Upstream sizes its outputs for what it samples (speculative checks);
    // never fewer than that.
    if upstream_outputs != 0 {
        cp.n_outputs_max = cp.n_outputs_max.max(upstream_outputs);
    }
    tracing::info!(
        "pipeshard plan for {}: ubatch {}, {} of weights resident, VRAM {} of {}, {} stream slots, predicted {:.1} tok/s",
        req.model.display(),
        plan.ubatch,
        plan::fmt_bytes(plan.resident_bytes()),
        plan::fmt_bytes(plan.vram.total),
        plan::fmt_bytes(plan.vram.budget),
        plan.stream_slots,
        plan.predicted.decode_tok_s,
    );
    let draft_on_gpu = plan.workload.speculation.map(|s| s.draft_on_gpu);
    Ok(Some(Installed { plan, draft_on_gpu }))
}

/// Upstream's default `--spec-draft-n-max`.
const DRAFT_N_MAX: u32 = 3;

/// The context length upstream will create: `n_ctx`, or the model's
/// training length when it is 0.
fn context_length(model: &Path, n_ctx: u32) -> Result<u64, ServeError> {
    if n_ctx != 0 {
        return Ok(n_ctx as u64);
    }
    let (_, info) = crate::gguf::inspect(model).map_err(|e| ServeError::Model {
        model: model.to_path_buf(),
        message: e.to_string(),
    })?;
    Ok(info.n_ctx_train.unwrap_or(4096))
}
