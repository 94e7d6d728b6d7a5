//! One path from options to a running plan, for every command and for the
//! server's load hook: pipeshard's options and the final model and context
//! parameters go in; a plan priced for exactly those parameters (context
//! length, sequences, KV types, flash attention, the work it will run)
//! comes out, checked with llama.cpp's own no-alloc reservation, ready to
//! install; installing it makes the model's running [`Session`]; after
//! loading, [`Session::verify_loaded`] holds the process to its budget.
//!
//! ```text
//! options ──► plan_for(model, params, workload) ──► Launch::install(params) ──► Session
//!                                                   └─► load ─► Session::verify_loaded
//! ```

pub mod across;
mod check;
mod decode;
pub mod devices;
mod draft;
pub mod live;
mod options;
mod overhead;
mod session;
pub mod tune;
pub mod tune_batch;
mod vision;

pub use check::{dry_run_bytes, llama_device_bytes, make_measured_plan, verify, warm_up, LoadedMemory};
pub use decode::{units_that_fit, DecodeEntry};
pub use draft::{draft_cost, plan_with_draft, DraftCost, DraftSource, DRAFT_UBATCH};
pub use options::{default_headroom, BudgetSpec, PipeshardOptions};
pub use overhead::{OverheadSource, ProcessOverhead, ASSUMED_CONTEXT_BYTES, RUNTIME_BYTES, RUNTIME_BYTES_PER_TOKEN};
pub use session::{Phase, PlanChanged, Session};
pub use tune::{tune_split, ShareSearch, SplitKnob, SplitSetting, SplitTuning};
pub use vision::{vision_memory, vision_options, vision_setup, VisionMemory};

use std::path::{Path, PathBuf};

use crate::engine::{self, ContextParams, FlashAttention, ModelParams};
use crate::gguf::{GgmlType, ModelInfo};
use crate::plan::apply::{apply, ApplyError};
use crate::plan::{fmt_bytes, KvStreams, Plan, PlanError, PlanRequest, Workload};
use crate::profile::{self, MachineProfile, Missing, ProfileError, ProfileKey, ProfileMode, TypesUsed};

/// Why a model cannot be launched as asked.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("{0}")]
    Options(String),
    #[error("--vram-budget auto needs a GPU")]
    AutoNeedsGpu,
    #[error("no device {name} on this machine; the devices that take a budget: {known}")]
    NoSuchDevice { name: String, known: String },
    #[error("reading the plan {path}: {source}")]
    PlanIo { path: PathBuf, source: std::io::Error },
    #[error("parsing the plan {path}: {message}")]
    PlanParse { path: PathBuf, message: String },
    #[error("reading {path}: {source}")]
    Model {
        path: PathBuf,
        source: Box<crate::gguf::InspectError>,
    },
    #[error(transparent)]
    Profile(#[from] ProfileError),
    #[error(
        "no GPU backend is loaded, so there is nothing to plan for (pass --profile to plan for another machine, or --backend-dir with libggml-cuda.so)"
    )]
    NoGpu,
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Apply(#[from] ApplyError),
    #[error("checking the plan with llama.cpp: {0}")]
    Engine(#[from] engine::EngineError),
    #[error(
        "over the VRAM budget: {what} come to {used}, over the budget of {budget}",
        used = fmt_bytes(*used),
        budget = fmt_bytes(*budget)
    )]
    OverBudget { what: String, used: u64, budget: u64 },
    #[error("the loaded model is not placed as planned: {0}")]
    Placement(String),
}

/// What to plan for, beside the model and context parameters.
#[derive(Debug, Clone)]
pub struct LaunchRequest<'a> {
    pub model: &'a Path,
    pub options: &'a PipeshardOptions,
    /// The budget for the process's device memory, resolved; None: upstream
    /// placement unless `options` names a saved plan.
    pub budget: Option<u64>,
    /// CPU threads (selects the profile).
    pub threads: i32,
    /// The work the plan is optimised for: the real prompt where it is known.
    pub workload: Workload,
    /// A fixed ubatch instead of the planner's choice.
    pub ubatch: Option<u32>,
    /// The vision encoder's device memory, when the plan budgets it.
    pub vision: VisionMemory,
    /// A draft model for speculative decoding, run beside this one.
    pub draft: Option<DraftSource>,
    /// Contexts beside the main one that share the model (their length in
    /// tokens): each holds its own KV cache and compute buffers.
    pub side_contexts: Vec<u64>,
    /// Plan for the longest prompt one sequence's share of the context
    /// holds, instead of `workload`'s prompt: a server's slots take prompts
    /// of any length up to it, and the compute reservation and KV placement
    /// made at load must serve the longest (shorter prompts still get
    /// their own tier's decisions per ubatch).
    pub full_slot_prompt: bool,
}

impl<'a> LaunchRequest<'a> {
    /// A request for `model` with `options`' own budget and `workload`.
    pub fn new(
        model: &'a Path,
        options: &'a PipeshardOptions,
        threads: i32,
        workload: Workload,
    ) -> Result<Self, LaunchError> {
        Self::with_budget(model, options, threads, workload, options.budget_bytes()?)
    }

    /// A request for `model` with `options` and `budget` (None for a plan
    /// across devices, whose budgets are each device's).
    pub fn with_budget(
        model: &'a Path,
        options: &'a PipeshardOptions,
        threads: i32,
        workload: Workload,
        budget: Option<u64>,
    ) -> Result<Self, LaunchError> {
        options.check()?;
        Ok(LaunchRequest {
            model,
            options,
            budget,
            threads,
            workload,
            ubatch: None,
            vision: VisionMemory::default(),
            draft: None,
            side_contexts: Vec::new(),
            full_slot_prompt: false,
        })
    }
}

/// A plan ready to install, with what it was made against. Installed, it
/// runs as a [`Session`].
#[derive(Debug, Clone)]
pub struct Launch {
    pub plan: Plan,
    /// The budget for the process's device memory.
    pub budget: u64,
    /// The process's memory outside llama.cpp's buffers that the plan budgets.
    pub overhead: ProcessOverhead,
    /// What re-planning it for another budget needs, with `--vram-budget
    /// auto` (the budget then follows the card while the model runs).
    pub replan: Option<live::ReplanBasis>,
    /// The decode split the plan leaves to be chosen at run time, if it has
    /// one the user did not force ([`tune::tune_split`]).
    pub split_knob: Option<SplitKnob>,
}

impl Launch {
    /// Put the plan into the parameters the model and context are made
    /// with, and start its [`Session`], whose decisions the context's
    /// per-op callbacks ask; fails without the GPU the plan places weights
    /// on.
    pub fn install(&self, mp: &mut ModelParams<'_>, cp: &mut ContextParams) -> Result<Session, LaunchError> {
        let applied = apply(&self.plan)?;
        applied.configure_model(mp);
        applied.configure_context(cp);
        let session = Session::new(self);
        session.install_callbacks(cp);
        Ok(session)
    }
}

/// Read a plan saved by `pipeshard plan --format yaml|json`.
pub fn load_plan(path: &Path) -> Result<Plan, LaunchError> {
    let text = std::fs::read_to_string(path).map_err(|source| LaunchError::PlanIo {
        path: path.to_path_buf(),
        source,
    })?;
    let parsed = if text.trim_start().starts_with('{') {
        serde_json::from_str(&text).map_err(|e| e.to_string())
    } else {
        serde_yaml::from_str(&text).map_err(|e| e.to_string())
    };
    parsed.map_err(|message| LaunchError::PlanParse {
        path: path.to_path_buf(),
        message,
    })
}

/// The profile named by `explicit`, or the one in the profile directory
/// matching this machine, measured (fast mode) and saved when missing.
/// A matching or new profile without the expert and beside-copies samples
/// of the types in `used` has them measured now and saved (a model's first
/// use on this machine); a named profile (another machine's) is used as is.
/// `progress` gets (done, total) steps while measuring.
pub fn machine_profile(
    explicit: Option<&Path>,
    threads: i32,
    used: &TypesUsed,
    mut progress: impl FnMut(u64, u64),
) -> Result<MachineProfile, LaunchError> {
    if let Some(p) = explicit {
        return Ok(MachineProfile::load(p)?);
    }
    if !engine::has_gpu() {
        return Err(LaunchError::NoGpu);
    }
    let dir = profile::default_dir()?;
    let key = ProfileKey::current(threads);
    let path = dir.join(key.file_name());
    let (mut p, mut changed) = match MachineProfile::load_matching(&dir, &key) {
        Some(p) => {
            tracing::info!("using the profile {}", path.display());
            (p, false)
        }
        None => {
            tracing::info!("no profile for this machine yet; measuring one (fast mode)");
            (profile::measure(ProfileMode::Fast, threads, &mut progress)?, true)
        }
    };
    let missing = Missing::of(&p, used);
    if !missing.is_empty() {
        tracing::info!(
            "measuring this model's types for the profile: experts {:?}, beside the link's copies {:?}",
            missing.experts,
            missing.beside_copies
        );
        profile::measure_missing(&mut p, &missing, threads, &mut progress)?;
        changed = true;
    }
    if changed {
        if let Err(e) = p.save(&path) {
            tracing::warn!("could not save the profile to {}: {e}", path.display());
        }
    }
    Ok(p)
}

/// The KV cache type of a context's parameters, as the planner prices it.
fn kv_type(t: Option<engine::ffi::ggml_type>) -> GgmlType {
    t.and_then(GgmlType::from_id).unwrap_or(GgmlType::F16)
}

/// The plan request for `info` run in a context made with `cp` on the
/// machine `profile` describes: its length (the model's training length
/// when 0), KV types and flash attention, what `req` adds, and the device
/// memory the process holds outside llama.cpp's buffers, which it returns
/// too.
pub fn plan_request(
    req: &LaunchRequest<'_>,
    info: &ModelInfo,
    cp: &ContextParams,
    budget: u64,
    profile: &MachineProfile,
) -> (PlanRequest, ProcessOverhead) {
    let n_ctx = match cp.n_ctx {
        0 => info.n_ctx_train.unwrap_or(4096),
        n => n as u64,
    };
    let mut pr = PlanRequest::new(budget, n_ctx + req.side_contexts.iter().sum::<u64>());
    pr.workload = req.workload;
    if req.full_slot_prompt {
        // A slot holds what llama-server gives it: its own stream (llama.cpp
        // pads it), or with a unified cache the whole context, unless the
        // workload has the slots decoding together: then each holds its
        // share.
        let kv = KvStreams::new(n_ctx, u64::from(cp.n_seq_max.max(1)), cp.kv_unified);
        let per_seq = match (kv.unified(), req.workload.parallel <= 1) {
            (false, _) => kv.cells,
            (true, true) => n_ctx,
            (true, false) => n_ctx / kv.n_seq,
        };
        pr.workload.prompt_tokens = per_seq.saturating_sub(pr.workload.gen_tokens).max(1);
    }
    pr.ubatch = req.ubatch;
    pr.kv_unified = cp.kv_unified;
    pr.type_k = kv_type(cp.type_k);
    pr.type_v = kv_type(cp.type_v);
    pr.flash_attention = cp.flash_attention != FlashAttention::Off;
    pr.stream_slots = req.options.stream_slots;
    pr.hybrid_gpu_experts = req.options.hybrid_experts;
    pr.dense_split = req.options.dense_split;
    pr.exact = req.options.exact;
    // The decode tier swaps residency between a prompt and its decoding,
    // which a server's loop (prompts and decoding of several slots in one
    // batch) and a live re-plan (which moves weights itself) do not do; a
    // draft model's verification batches are not single tokens.
    pr.decode_tier = req.options.decode_tier
        && !req.full_slot_prompt
        && !req.options.follows_card()
        && req.draft.is_none()
        && req.side_contexts.is_empty();
    pr.cpu_copies = req.options.cpu_copies;
    pr.host_available = host_available();
    pr.vision_peak = req.vision.peak;
    let overhead = ProcessOverhead::for_machine(Some(profile), pr.n_ctx);
    pr.reserve = overhead.total() + req.vision.resident;
    (pr, overhead)
}

/// Host memory available to this process now: Linux's MemAvailable, which
/// counts the page cache that can be dropped (None elsewhere).
fn host_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib << 10)
}

/// The plan for `req`'s model loaded with `mp` into a context made with
/// `cp`, not yet installed; None when neither a budget nor a saved plan is
/// given (upstream placement), or when a budget is given without a GPU
/// (everything runs on the CPU and uses no VRAM). `progress` follows the
/// profile's measurement when this machine has none yet.
pub fn plan_for(
    req: &LaunchRequest<'_>,
    cp: &ContextParams,
    progress: impl FnMut(u64, u64),
) -> Result<Option<Launch>, LaunchError> {
    let profile_path = req.options.profile.as_deref();
    let (plan, overhead, replan, split_knob) = if let Some(path) = &req.options.plan {
        let plan = load_plan(path)?;
        let overhead = ProcessOverhead::for_machine(None, cp.n_ctx as u64);
        // A saved plan is used as is.
        (plan, overhead, None, None)
    } else if let Some(budget) = req.budget {
        if profile_path.is_none() && !engine::has_gpu() {
            tracing::warn!(
                "--vram-budget {}: no GPU backend is loaded, so everything runs on the CPU and uses no VRAM",
                fmt_bytes(budget)
            );
            return Ok(None);
        }
        let (_, info) = crate::gguf::inspect(req.model).map_err(|source| LaunchError::Model {
            path: req.model.to_path_buf(),
            source: Box::new(source),
        })?;
        let profile = machine_profile(profile_path, req.threads, &TypesUsed::of(&info), progress)?;
        let (mut pr, overhead) = plan_request(req, &info, cp, budget, &profile);
        tracing::info!(
            "budget {}: {} of it outside llama.cpp's buffers (CUDA context {} {:?}, runtime {})",
            fmt_bytes(budget),
            fmt_bytes(pr.reserve),
            fmt_bytes(overhead.context),
            overhead.source,
            fmt_bytes(overhead.runtime)
        );
        // The dry run needs the GPU backend.
        let checked = engine::has_gpu().then_some((req.model, cp));
        let mut plan = plan_with_draft(checked, &info, &profile, pr.clone(), req.draft.as_ref())?;
        if !req.side_contexts.is_empty() {
            // Each side context holds compute buffers and streaming slots
            // like the main one's, beside them.
            pr.reserve += plan.vram.language_peak() * req.side_contexts.len() as u64;
            plan = plan_with_draft(checked, &info, &profile, pr.clone(), req.draft.as_ref())?;
        }
        let forced = req.options.hybrid_experts.is_some() || req.options.dense_split.is_some();
        let split_knob = req
            .options
            .split_tune
            .then(|| SplitKnob::of(&plan, info.n_expert_used, forced))
            .flatten();
        let replan = req
            .options
            .follows_card()
            .then(|| live::ReplanBasis::new(info, profile, pr, &plan));
        (plan, overhead, replan, split_knob)
    } else {
        return Ok(None);
    };
    Ok(Some(Launch {
        budget: plan.vram.budget,
        split_knob,
        plan,
        overhead,
        replan,
    }))
}
