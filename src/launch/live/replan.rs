//! Planning again for a new budget while the model runs: the same cost
//! model, profile and workload the launch plan was made with, and what the
//! running context cannot change held fixed (its ubatch and therefore its
//! tiers, the layers whose KV cache is on the GPU, the compute reservation
//! llama.cpp measured). Where the weights live, and the per-tier decisions
//! that follow from it, change; the streaming slots shrink only when even
//! the smallest placement with the launch's slots does not fit.

use std::collections::HashMap;

use crate::gguf::ModelInfo;
use crate::plan::{self, make_plan, Plan, PlanError, PlanRequest};
use crate::profile::MachineProfile;

/// The fewest streaming slots a re-plan shrinks to when the launch's do not
/// fit: two still let one weight's copy overlap the previous one's compute.
pub const MIN_SLOTS: u32 = 2;

/// What a re-plan needs, kept from the launch.
#[derive(Debug, Clone)]
pub struct ReplanBasis {
    pub info: ModelInfo,
    pub profile: MachineProfile,
    /// The launch's request, with the running context's shape fixed.
    pub request: PlanRequest,
}

/// A plan for a new budget.
#[derive(Debug, Clone)]
pub struct Replanned {
    pub plan: Plan,
    /// The budget asked for.
    pub budget: u64,
    /// False when even the smallest plan needs more than `budget`: `plan`
    /// is that smallest plan, over the budget.
    pub fits: bool,
}

impl ReplanBasis {
    /// The basis for re-planning `launched`, made from `request` (the
    /// launch's request) for `info` on `profile`.
    pub fn new(mut info: ModelInfo, profile: MachineProfile, request: PlanRequest, launched: &Plan) -> ReplanBasis {
        let mut r = request;
        r.ubatch = Some(launched.ubatch);
        r.kv_gpu_layers = Some(launched.kv_gpu_layers);
        // The draft's choice and its device memory are in the plan's
        // workload and reserve.
        r.workload = launched.workload;
        r.reserve = launched.vram.reserve;
        r.vision_peak = launched.vram.vision_peak;
        r.exact = launched.exact;
        r.pinned = launched.pinned;
        // A tied output stays where it was loaded: the context knows it by
        // the token embedding's name, so no move takes it elsewhere
        // (`moves::diff`). A re-plan holds its device bytes with the
        // reserve and places the other weights around them.
        if let Some(t) = launched.tensors.iter().find(|t| t.tied) {
            if t.resident {
                r.reserve += t.vram_bytes;
            }
            info.tensors.retain(|x| x.name != t.name);
            info.tied_output = false;
        }
        if launched.stream_slots > 0 {
            r.stream_slots = launched.stream_slots;
        }
        // The compute reservation as the launch measured it (the dry run
        // corrects the analytic estimate): scale the estimate to match.
        let mut basis = ReplanBasis {
            info,
            profile,
            request: r,
        };
        let small = plan::small_bytes(&basis.info);
        if let Ok(p) = basis.plan_exact(u64::MAX / 4, 1.0) {
            let estimate = p.vram.compute.saturating_sub(small).max(1) as f64;
            let measured = launched.vram.compute.saturating_sub(small) as f64;
            basis.request.compute_scale = (measured / estimate).max(0.05);
        }
        basis
    }

    fn plan_exact(&self, budget: u64, compute_scale: f64) -> Result<Plan, PlanError> {
        let mut r = self.request.clone();
        r.budget = budget;
        r.compute_scale = compute_scale;
        make_plan(&self.info, &self.profile, &r)
    }

    /// The best plan for `budget` with the launch's streaming slots; when
    /// none fits, with fewer slots (down to [`MIN_SLOTS`]: their device
    /// memory is what shrinks beside the weights); when none fits even
    /// then, the smallest plan.
    pub fn plan(&self, budget: u64) -> Result<Replanned, PlanError> {
        let launch_slots = self.request.stream_slots;
        let fewer = if launch_slots > MIN_SLOTS {
            (MIN_SLOTS..launch_slots).rev().collect()
        } else {
            Vec::new()
        };
        let mut smallest: Option<(u64, u32)> = None;
        for slots in std::iter::once(launch_slots).chain(fewer) {
            match self.plan_with(budget, slots) {
                Ok(plan) => {
                    return Ok(Replanned {
                        plan,
                        budget,
                        fits: true,
                    })
                }
                Err(PlanError::BudgetTooSmall { minimum, .. }) => {
                    if smallest.map_or(true, |(m, _)| minimum < m) {
                        smallest = Some((minimum, slots));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        let (minimum, slots) = smallest.expect("at least the launch's slots were tried");
        Ok(Replanned {
            plan: self.plan_with(minimum, slots)?,
            budget,
            fits: false,
        })
    }

    fn plan_with(&self, budget: u64, slots: u32) -> Result<Plan, PlanError> {
        let mut r = self.request.clone();
        r.budget = budget;
        r.stream_slots = slots;
        make_plan(&self.info, &self.profile, &r)
    }

    /// Seconds saved per VRAM byte by each weight made resident, under the
    /// plan in force's shape: the order promotions follow.
    pub fn value_per_byte(&self, plan: &Plan) -> HashMap<String, f64> {
        plan::value_per_byte(&self.info, &self.profile, &self.request, plan)
    }
}
