//! Getting a plan at load time, for `run`, `serve` and `bench`: from a saved
//! plan file, or made now from a budget and this machine's profile.

use std::path::{Path, PathBuf};

use super::apply::{apply, Applied, ApplyError};
use super::{make_plan, CostModel, Overheads, Plan, PlanError, PlanRequest, Speculation, Streaming, Workload};
use crate::engine;
use crate::profile::{self, MachineProfile, ProfileError, ProfileKey, ProfileMode};

/// Why no plan could be had.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
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
    #[error("checking the plan with a dry run: {0}")]
    DryRun(#[from] engine::EngineError),
}

/// The vision encoder's device memory, as the planner budgets it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VisionMemory {
    /// Held only while an image is encoded (compute buffers and streaming
    /// slots, released after each image), plus weights on the device.
    pub peak: u64,
    /// Held from the first image on: the encoder backend's own pools and
    /// library workspaces, which no reservation sees and nothing frees.
    pub resident: u64,
}

/// The device memory the vision encoder of `mmproj` needs for `image` with
/// `opts`, before the language model is loaded: llama.cpp's no-alloc
/// reservation of the encoder's graph, and the device memory measured while
/// the image is encoded once; what the measurement finds beyond the
/// reservation stays allocated afterwards.
pub fn vision_memory(
    model: &Path,
    mmproj: &Path,
    opts: engine::VisionOptions,
    image: &engine::PeakImage,
) -> Result<VisionMemory, RuntimeError> {
    let gpu = engine::first_device(engine::DeviceKind::Gpu).map(|d| d.index);
    let sampler = crate::bench::MemorySampler::start(gpu);
    let peak = engine::encoder_peak(model, mmproj, opts, image, gpu.is_some() && opts.use_gpu)?;
    let (measured, _) = sampler.stop();
    let reserved = peak.reserved + peak.weights;
    tracing::info!(
        "vision encoder: {} reserved, {} measured while encoding",
        super::fmt_bytes(reserved),
        super::fmt_bytes(measured)
    );
    Ok(VisionMemory {
        peak: reserved,
        resident: measured.saturating_sub(reserved),
    })
}

/// The device memory of the vision encoder of `mmproj` run with `opts`,
/// when the plan must budget it: with `measure` (a budget, not a saved
/// plan) and pipeshard's encoder (weights on the host, peaks kept apart),
/// it is measured for `image`; None otherwise, where the encoder runs as
/// upstream's does and the plan leaves it alone.
pub fn vision_setup(
    model: &Path,
    mmproj: Option<&Path>,
    opts: engine::VisionOptions,
    measure: bool,
    image: &engine::PeakImage,
) -> Result<Option<VisionMemory>, RuntimeError> {
    match mmproj {
        Some(mm) if opts.weights_on_host && opts.separate_peaks && measure => {
            Ok(Some(vision_memory(model, mm, opts, image)?))
        }
        _ => Ok(None),
    }
}

/// Where a plan comes from.
#[derive(Debug, Clone, Default)]
pub struct PlanSource {
    /// A saved plan (YAML or JSON from `pipeshard plan`).
    pub plan_file: Option<PathBuf>,
    /// A VRAM budget, bytes.
    pub budget: Option<u64>,
    /// A profile file; default: the one matching this machine.
    pub profile: Option<PathBuf>,
    /// Streaming slots (0: llama.cpp's synchronous copies).
    pub stream_slots: u32,
    /// Hybrid experts' GPU share ([`PlanRequest::hybrid_gpu_experts`]).
    pub hybrid_gpu_experts: Option<u32>,
    /// The vision encoder's device memory; the plan budgets the larger of
    /// its peak and the language model's compute peak, not their sum.
    pub vision: VisionMemory,
    /// Contexts beside the main one that share the model (the server's
    /// vision worker and embedder), by their length in tokens: each holds
    /// its own KV cache and compute buffers, and all count in the budget.
    pub side_contexts: Vec<u64>,
    /// A draft model for speculative decoding, run beside this one.
    pub draft: Option<DraftSource>,
}

/// A draft model for speculative decoding, as the plan of the model it
/// drafts for sees it: the draft runs whole, on the GPU (its device memory
/// comes out of the budget) or on the CPU, and the plan adds a tier for
/// verifying its tokens.
#[derive(Debug, Clone)]
pub struct DraftSource {
    pub path: PathBuf,
    /// Whether the draft runs on the GPU; None: wherever the plan predicts
    /// the workload finishes sooner.
    pub on_gpu: Option<bool>,
    /// Draft tokens per step (`--spec-draft-n-max`).
    pub draft_tokens: u32,
    /// The assumed chance that each draft token is accepted.
    pub acceptance: f64,
}

/// The draft model's ubatch.
pub const DRAFT_UBATCH: u64 = 512;

/// What a draft model adds to a plan.
#[derive(Debug, Clone, Copy)]
pub struct DraftCost {
    pub speculation: Speculation,
    /// Device bytes of the draft's weights, KV cache and compute buffers.
    pub device_bytes: u64,
}

/// Price the draft model of `draft` (`info`, read from its GGUF) for a
/// context of `n_ctx` tokens and the depth `depth` where it decodes: its
/// device memory from llama.cpp's own reservation when a GPU backend is
/// loaded (else from the GGUF: weights, KV cache and a compute estimate),
/// its time per token from `profile`.
pub fn draft_cost(
    draft: &DraftSource,
    info: &crate::gguf::ModelInfo,
    on_gpu: bool,
    profile: &MachineProfile,
    n_ctx: u64,
    depth: u64,
) -> Result<DraftCost, RuntimeError> {
    let device_bytes = if !on_gpu {
        0
    } else if engine::has_gpu() {
        let mp = engine::ModelParams {
            n_gpu_layers: -1,
            ..Default::default()
        };
        let cp = engine::ContextParams {
            n_ctx: n_ctx.min(u32::MAX as u64) as u32,
            n_ubatch: DRAFT_UBATCH as u32,
            flash_attention: engine::FlashAttention::On,
            ..Default::default()
        };
        engine::dry_run_device_bytes(&draft.path, mp, cp)?
    } else {
        let req = PlanRequest::new(u64::MAX, n_ctx);
        let weights: u64 = info.tensors.iter().map(|t| t.cuda_alloc_size()).sum();
        weights + super::kv_bytes(info, &req, info.n_layer) + super::compute_bytes(info, DRAFT_UBATCH, 0)
    };
    let cm = CostModel::new(info, profile, Streaming::Synchronous, true, Overheads::default(), None);
    // The draft reads the prompt in ubatches of 512 (its context's).
    let draft_prompt_s = (0..depth)
        .step_by(DRAFT_UBATCH as usize)
        .map(|start| cm.unsplit_seconds(on_gpu, DRAFT_UBATCH.min(depth - start), start))
        .sum();
    Ok(DraftCost {
        speculation: Speculation {
            draft_tokens: draft.draft_tokens,
            acceptance: draft.acceptance,
            draft_token_s: cm.unsplit_seconds(on_gpu, 1, depth),
            draft_prompt_s,
            draft_on_gpu: on_gpu,
        },
        device_bytes,
    })
}

/// Read a plan saved by `pipeshard plan --format yaml|json`.
pub fn load_plan(path: &Path) -> Result<Plan, RuntimeError> {
    let text = std::fs::read_to_string(path).map_err(|source| RuntimeError::PlanIo {
        path: path.to_path_buf(),
        source,
    })?;
    let parsed = if text.trim_start().starts_with('{') {
        serde_json::from_str(&text).map_err(|e| e.to_string())
    } else {
        serde_yaml::from_str(&text).map_err(|e| e.to_string())
    };
    parsed.map_err(|message| RuntimeError::PlanParse {
        path: path.to_path_buf(),
        message,
    })
}

/// The profile named by `explicit`, or the one in the profile directory
/// matching this machine, measured (fast mode) and saved when missing.
/// `progress` gets (done, total) steps while measuring.
pub fn machine_profile(
    explicit: Option<&Path>,
    threads: i32,
    progress: impl FnMut(u64, u64),
) -> Result<MachineProfile, RuntimeError> {
    if let Some(p) = explicit {
        return Ok(MachineProfile::load(p)?);
    }
    if !engine::has_gpu() {
        return Err(RuntimeError::NoGpu);
    }
    let dir = profile::default_dir();
    let key = ProfileKey::current(threads);
    if let Some(p) = MachineProfile::load_matching(&dir, &key) {
        tracing::info!("using the profile {}", dir.join(key.file_name()).display());
        return Ok(p);
    }
    tracing::info!("no profile for this machine yet; measuring one (fast mode)");
    let p = profile::measure(ProfileMode::Fast, threads, progress)?;
    let path = dir.join(key.file_name());
    if let Err(e) = p.save(&path) {
        tracing::warn!("could not save the profile to {}: {e}", path.display());
    }
    Ok(p)
}

/// Device bytes llama.cpp reserves for `plan` (weights, KV cache, compute
/// buffers and streaming slots), from its own no-alloc reservation of
/// exactly this placement and context: nothing is loaded or allocated.
pub fn dry_run_bytes(model: &Path, plan: &Plan, n_ctx: u64) -> Result<u64, RuntimeError> {
    let applied = apply(plan)?;
    let mut mp = engine::ModelParams::default();
    applied.configure_model(&mut mp);
    let mut cp = engine::ContextParams {
        n_ctx: n_ctx.min(u32::MAX as u64) as u32,
        flash_attention: engine::FlashAttention::On,
        ..Default::default()
    };
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
    info: &crate::gguf::ModelInfo,
    profile: &MachineProfile,
    mut req: PlanRequest,
) -> Result<Plan, RuntimeError> {
    let mut plan = make_plan(info, profile, &req)?;
    if !engine::has_gpu() {
        return Ok(plan);
    }
    for round in 0..3 {
        let measured = dry_run_bytes(model, &plan, req.n_ctx)?;
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
            super::fmt_bytes(measured),
            super::fmt_bytes(estimated)
        );
        let fits = measured + unseen + vision_extra <= req.budget;
        let close = measured.abs_diff(estimated) <= req.budget / 50;
        if fits && close {
            break;
        }
        // Correct the compute estimate (the only part not known exactly).
        let analytic = plan.vram.compute.saturating_sub(super::small_bytes(info)).max(1) as f64;
        let target = (analytic + measured as f64 - estimated as f64).max(analytic * 0.05);
        req.compute_scale *= target / analytic;
        plan = make_plan(info, profile, &req)?;
    }
    Ok(plan)
}

/// The plan for `budget` with what `source` adds to it (a vision encoder,
/// side contexts), `n_ctx` tokens in the main context, checked with
/// [`make_measured_plan`]; not applied.
pub fn budget_plan(
    source: &PlanSource,
    budget: u64,
    model: &Path,
    info: &crate::gguf::ModelInfo,
    profile: &MachineProfile,
    n_ctx: u64,
) -> Result<Plan, RuntimeError> {
    // The KV caches of every context, in one.
    let mut req = PlanRequest::new(budget, n_ctx + source.side_contexts.iter().sum::<u64>());
    req.workload = Workload {
        prompt_tokens: 4096.min(n_ctx / 2).max(1),
        gen_tokens: 64,
        speculation: None,
    };
    req.stream_slots = source.stream_slots;
    req.hybrid_gpu_experts = source.hybrid_gpu_experts;
    req.vision_peak = source.vision.peak;
    req.reserve += source.vision.resident;
    let draft = source.draft.as_ref();
    let plan = plan_with_draft(Some(model), info, profile, req.clone(), draft)?;
    if source.side_contexts.is_empty() {
        return Ok(plan);
    }
    // Each side context holds compute buffers and streaming slots like the
    // main one's, beside them.
    req.reserve += plan.vram.language_peak() * source.side_contexts.len() as u64;
    plan_with_draft(Some(model), info, profile, req, draft)
}

/// Plan `req` for `info` with `draft` running beside it: the draft on the
/// GPU or the CPU as it says, or, where it leaves that open, on the GPU, on
/// the CPU or not at all, whichever the plan predicts finishes the workload
/// soonest (on the GPU its device memory leaves less for the model's own
/// weights; on the CPU it reads the prompt slowly). The plan's
/// [`Workload::speculation`] says what was chosen. With the `model` file
/// the plan is checked with [`make_measured_plan`].
pub fn plan_with_draft(
    model: Option<&Path>,
    info: &crate::gguf::ModelInfo,
    profile: &MachineProfile,
    req: PlanRequest,
    draft: Option<&DraftSource>,
) -> Result<Plan, RuntimeError> {
    let plan = |req: PlanRequest| match model {
        Some(m) => make_measured_plan(m, info, profile, req),
        None => Ok(make_plan(info, profile, &req)?),
    };
    let Some(draft) = draft else {
        return plan(req);
    };
    let (_, draft_info) = crate::gguf::inspect(&draft.path).map_err(|source| RuntimeError::Model {
        path: draft.path.clone(),
        source: Box::new(source),
    })?;
    // Where the draft runs: None is no speculation at all, which the plan
    // also weighs when the placement is left open.
    let placements = match draft.on_gpu {
        Some(on_gpu) => vec![Some(on_gpu)],
        None => vec![Some(true), Some(false), None],
    };
    let mut best: Option<Plan> = None;
    let mut first_error = None;
    for placement in placements {
        let mut r = req.clone();
        if let Some(on_gpu) = placement {
            let cost = draft_cost(
                draft,
                &draft_info,
                on_gpu,
                profile,
                req.n_ctx,
                req.workload.prompt_tokens,
            )?;
            r.workload.speculation = Some(cost.speculation);
            r.reserve += cost.device_bytes;
        }
        match plan(r) {
            Ok(p) => {
                tracing::info!(
                    "{}: predicted {:.2} s for the workload",
                    match placement {
                        Some(true) => "draft on the GPU",
                        Some(false) => "draft on the CPU",
                        None => "without the draft",
                    },
                    p.predicted_seconds()
                );
                if best
                    .as_ref()
                    .map_or(true, |b| p.predicted_seconds() < b.predicted_seconds())
                {
                    best = Some(p);
                }
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match (best, first_error) {
        (Some(p), _) => Ok(p),
        (None, Some(e)) => Err(e),
        (None, None) => unreachable!("at least one draft placement is planned"),
    }
}

/// The plan for `model` with `n_ctx` tokens of context, applied; None when
/// the source names neither a plan nor a budget (upstream placement).
pub fn plan_for_model(
    source: &PlanSource,
    model: &Path,
    n_ctx: u64,
    threads: i32,
    progress: impl FnMut(u64, u64),
) -> Result<Option<(Plan, Applied)>, RuntimeError> {
    let plan = if let Some(path) = &source.plan_file {
        load_plan(path)?
    } else if let Some(budget) = source.budget {
        if source.profile.is_none() && !engine::has_gpu() {
            tracing::warn!(
                "--vram-budget {}: no GPU backend is loaded, so everything runs on the CPU and uses no VRAM",
                super::fmt_bytes(budget)
            );
            return Ok(None);
        }
        let (_, info) = crate::gguf::inspect(model).map_err(|source| RuntimeError::Model {
            path: model.to_path_buf(),
            source: Box::new(source),
        })?;
        let profile = machine_profile(source.profile.as_deref(), threads, progress)?;
        budget_plan(source, budget, model, &info, &profile, n_ctx)?
    } else {
        return Ok(None);
    };
    let applied = apply(&plan)?;
    Ok(Some((plan, applied)))
}
