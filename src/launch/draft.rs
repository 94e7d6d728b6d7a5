//! A draft model for speculative decoding, as the plan of the model it
//! drafts for prices it.

use std::path::{Path, PathBuf};

use super::check::make_measured_plan;
use super::LaunchError;
use crate::engine::{self, ContextParams};
use crate::gguf::ModelInfo;
use crate::plan::{self, make_plan, CostModel, Overheads, Plan, PlanRequest, Speculation, Streaming};
use crate::profile::MachineProfile;

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
    info: &ModelInfo,
    on_gpu: bool,
    profile: &MachineProfile,
    n_ctx: u64,
    depth: u64,
) -> Result<DraftCost, LaunchError> {
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
        weights + plan::kv_bytes(info, &req, info.n_layer, DRAFT_UBATCH) + plan::compute_bytes(info, DRAFT_UBATCH, 0)
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

/// Plan `req` for `info` with `draft` running beside it: the draft on the
/// GPU or the CPU as it says, or, where it leaves that open, on the GPU, on
/// the CPU or not at all, whichever the plan predicts finishes the workload
/// soonest (on the GPU its device memory leaves less for the model's own
/// weights; on the CPU it reads the prompt slowly). The plan's
/// [`plan::Workload::speculation`] says what was chosen. With the `model`
/// file and the context it runs in, the plan is checked with
/// [`make_measured_plan`].
pub fn plan_with_draft(
    model: Option<(&Path, &ContextParams)>,
    info: &ModelInfo,
    profile: &MachineProfile,
    req: PlanRequest,
    draft: Option<&DraftSource>,
) -> Result<Plan, LaunchError> {
    let plan = |req: PlanRequest| match model {
        Some((m, cp)) => make_measured_plan(m, info, profile, req, cp),
        None => Ok(make_plan(info, profile, &req)?),
    };
    let Some(draft) = draft else {
        return plan(req);
    };
    let (_, draft_info) = crate::gguf::inspect(&draft.path).map_err(|source| LaunchError::Model {
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
