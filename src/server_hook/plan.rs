//! The plan for a model the server loads: made for exactly the parameters
//! upstream resolved, and installed into them.

use std::path::Path;
use std::sync::Arc;

use super::state::ServerState;
use super::ServeError;
use crate::engine::{
    self, ContextParams, LoadDecision, LoadRequest, LoadRole, ModelParams, OffloadQuery, PeakImage, ProjectorParams,
};
use crate::launch::{self, Session};
use crate::plan::{self, Plan, Workload};

/// What the server's plan decided, for later loads (the draft) and for
/// reports (/props, /metrics).
#[derive(Debug, Clone)]
pub struct Installed {
    pub plan: Plan,
    /// The budget it was made for, bytes (None for a saved plan).
    pub budget: Option<u64>,
    /// Whether it came from `--plan`.
    pub from_file: bool,
    /// The plan's place for the draft model: Some(true) on the GPU.
    pub draft_on_gpu: Option<bool>,
}

impl ServerState {
    /// The load hook: plan the target model for upstream's parameters (and
    /// its draft), and place the draft where that plan put it.
    pub(super) fn on_load(
        &self,
        req: &LoadRequest,
        mp: &mut ModelParams<'static>,
        cp: &mut ContextParams,
    ) -> Result<LoadDecision, ServeError> {
        match req.role {
            LoadRole::Target => {
                let across =
                    launch::across::budgets_across(&self.opts.pipeshard).map_err(|source| ServeError::Plan {
                        model: req.model.clone(),
                        source,
                    })?;
                if let Some(budgets) = across {
                    let launched = self.place_across(req, mp, cp, budgets)?;
                    self.reports.install_across(launched);
                    *self.session.lock().map_err(|_| ServeError::Poisoned)? = None;
                    return Ok(LoadDecision::Placed);
                }
                // For benchmarks only (`--bench-routing`): the same seed as
                // `pipeshard bench`'s, a process per slot and request.
                cp.moe_route = self
                    .opts
                    .bench_routing
                    .and_then(|p| p.router(crate::bench::ROUTING_SEED))
                    .map(|r| r.policy());
                let Some((installed, session)) = self.plan_target(req, mp, cp)? else {
                    return Ok(LoadDecision::Upstream);
                };
                self.reports.install(installed, session.follower().cloned());
                // The session of an earlier load (the server slept and
                // reloads) ends here, its follower with it.
                *self.session.lock().map_err(|_| ServeError::Poisoned)? = Some(session);
                Ok(LoadDecision::Placed)
            }
            LoadRole::Draft => match self.reports.installed().and_then(|i| i.draft_on_gpu) {
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

    /// The one place the server turns options and upstream's parameters
    /// into an installed plan and its running session (`None`: no budget
    /// and no plan, upstream placement): the launch path every command
    /// takes, for the context upstream will create (its length, sequences,
    /// ubatch, KV types, flash attention).
    fn plan_target(
        &self,
        req: &LoadRequest,
        mp: &mut ModelParams<'static>,
        cp: &mut ContextParams,
    ) -> Result<Option<(Installed, Session)>, ServeError> {
        let opts = &self.opts;
        if !opts.plans() {
            return Ok(None);
        }
        let plan_err = |model: &Path| {
            let model = model.to_path_buf();
            move |source| ServeError::Plan { model, source }
        };
        let threads = cp.n_threads.unwrap_or_else(engine::default_threads);
        let mut launch_req = launch::LaunchRequest::new(&req.model, &opts.pipeshard, threads, slots_workload(cp))
            .map_err(plan_err(&req.model))?;
        // The vision encoder's peak, measured for the largest image it takes,
        // when the projector runs pipeshard's way (see `on_projector`).
        if let (Some(mmproj), Some(mut v), Some(_)) = (
            &req.mmproj,
            *self.vision.lock().map_err(|_| ServeError::Poisoned)?,
            launch_req.budget,
        ) {
            v.threads = threads;
            launch_req.vision = launch::vision_setup(&req.model, Some(mmproj), v, true, &PeakImage::Largest)
                .map_err(plan_err(mmproj))?
                .unwrap_or_default();
        }
        launch_req.full_slot_prompt = true;
        launch_req.draft = req.draft.clone().map(|path| launch::DraftSource {
            path,
            on_gpu: None,
            draft_tokens: DRAFT_N_MAX,
            acceptance: opts.draft_acceptance,
        });
        let Some(launched) = launch::plan_for(&launch_req, cp, |_, _| {}).map_err(plan_err(&req.model))? else {
            return Ok(None);
        };
        let upstream_outputs = cp.n_outputs_max;
        let mut session = launched.install(mp, cp).map_err(plan_err(&req.model))?;
        // The reports follow the plan in force.
        let reports = Arc::downgrade(&self.reports);
        session.on_plan_changed(Arc::new(move |plan, budget| {
            if let Some(r) = reports.upgrade() {
                r.plan_changed(plan, budget);
            }
        }));
        // The decode split is tuned before the first request, except where
        // the plan follows the card: a re-plan sets its own share and slots.
        session.tune_before_serving(cp);
        // --vram-budget auto: the plan follows the card while serving.
        if launched.replan.is_some() {
            // One buffer per weight, so that each weight moved frees its memory.
            mp.movable_weights = true;
            self.follow_card(&mut session);
        }
        // Upstream sizes its outputs for what it samples (speculative checks);
        // never fewer than that.
        if upstream_outputs != 0 {
            cp.n_outputs_max = cp.n_outputs_max.max(upstream_outputs);
        }
        // With the budget following the card, weights move between two batches
        // (the loop callback, patch 0024), so a batch is one ubatch: a change
        // waits for at most one ubatch in flight, not for several slots' prompts
        // (s10live-c: 1.76 s behind a batch of four 4096-token prompts).
        cp.n_batch = if launched.replan.is_some() {
            cp.n_ubatch
        } else {
            slots_batch(cp)
        };
        let plan = launched.plan;
        tracing::info!(
            "pipeshard plan for {}: ubatch {}, {} of weights resident, KV of {} of {} layers on the GPU ({}), VRAM {} of {} ({} outside llama.cpp's buffers), {} stream slots, predicted {:.1} tok/s",
            req.model.display(),
            plan.ubatch,
            plan::fmt_bytes(plan.resident_bytes()),
            plan.kv_gpu_layers,
            plan.n_layer,
            if cp.kv_unified || cp.n_seq_max <= 1 { "one stream" } else { "a stream per slot" },
            plan::fmt_bytes(plan.vram.total),
            plan::fmt_bytes(plan.vram.budget),
            plan::fmt_bytes(plan.vram.reserve),
            plan.stream_slots,
            plan.predicted.decode_tok_s,
        );
        // The offload policy sees every ubatch the scheduler places: its size
        // is the plan tier /metrics reports.
        if let Some(inner) = cp.offload.take() {
            let reports = Arc::clone(&self.reports);
            cp.offload = Some(Arc::new(move |q: &OffloadQuery<'_>| {
                reports.note_ubatch(q.n_tokens);
                inner(q)
            }));
        }
        self.reports.start_peak_sampler();
        let draft_on_gpu = plan.workload.speculation.map(|s| s.draft_on_gpu);
        let from_file = opts.pipeshard.plan.is_some();
        let installed = Installed {
            budget: (!from_file).then_some(launched.budget),
            plan,
            from_file,
            draft_on_gpu,
        };
        Ok(Some((installed, session)))
    }

    /// Start following the card for `session`'s plan: its samples recorded
    /// where `PIPESHARD_REPLAN_RECORD` says, its free memory read from NVML
    /// or a trace; where the sampling cannot start, the budget stays fixed
    /// at the load's.
    fn follow_card(&self, session: &mut Session) {
        let Some(f) = session.follow_card(self.opts.pipeshard.headroom(), Box::new(engine::wake_server_loop)) else {
            return;
        };
        if let Some(path) = std::env::var_os(launch::live::RECORD_ENV).filter(|p| !p.is_empty()) {
            if let Err(e) = f.record_to(Path::new(&path)) {
                tracing::warn!("cannot record the card's samples to {}: {e}", path.to_string_lossy());
            }
        }
        let spawned = match launch::live::source::from_env() {
            Ok(source) => f
                .spawn(source)
                .map_err(|e| format!("starting the sampling thread: {e}")),
            Err(e) => Err(e.to_string()),
        };
        match spawned {
            Ok(()) => tracing::info!("--vram-budget auto: the plan follows the card's free memory while serving"),
            Err(e) => {
                tracing::error!("the budget stays fixed at the load's: {e}");
                session.stop_following();
            }
        }
    }
}

/// The workload the server plans for: the reference prompt and generated
/// tokens in each slot, the slots decoding together, one token of each per
/// ubatch, so that the plan prices that ubatch as a tier of its own
/// (`n_seq_max` tokens) beside the prompt's and a lone slot's. Without it a
/// 4-token ubatch took the prompt tier's decisions and was never priced.
pub(super) fn slots_workload(cp: &ContextParams) -> Workload {
    Workload {
        parallel: cp.n_seq_max.max(1),
        ..Workload::default()
    }
}

/// The batch upstream's slot loop fills under a plan: one plan ubatch per
/// slot (at most the context), so prompts that arrive together are evaluated
/// in one `llama_decode` and their slots start decoding together.
///
/// Upstream fills each batch with the decoding slots' tokens and then as
/// much prompt as `n_batch` holds. With `n_batch` at one ubatch, a slot
/// whose prompt finished first decodes one token per prompt chunk of the
/// others, each a full ubatch that streams every host weight (R2 at 4 GiB:
/// ~0.3 s apiece), so its decode waits behind the other slots' prompts
/// (~1 s with four 4096-token prompts, CHANGELOG.md, session 8). The
/// ubatches themselves, and so the plan's tiers and its compute memory, do
/// not change: only how many of them one batch holds.
fn slots_batch(cp: &ContextParams) -> u32 {
    let per_slots = cp.n_ubatch.saturating_mul(cp.n_seq_max.max(1));
    let cap = if cp.n_ctx > 0 {
        per_slots.min(cp.n_ctx)
    } else {
        per_slots
    };
    cp.n_batch.max(cap)
}

/// The projector hook: with a plan and a GPU, the encoder's weights stay in
/// pinned host memory and stream to the GPU, and the server keeps the
/// encoder's compute memory and the language model's apart around every
/// image (patches 0004 and 0008); the plan then budgets the larger of the
/// two peaks, not their sum. Otherwise the encoder runs as upstream's.
pub(super) fn on_projector(state: &ServerState, path: &Path, p: &mut ProjectorParams) {
    if !state.opts.plans() || !p.use_gpu || !engine::has_gpu() {
        return;
    }
    // The encoder runs as `run` runs it (one decision, launch::vision_options):
    // weights in host memory streamed through the vision slots, and window
    // attention in chunks (patch 0021), whose peak, reserved at load for the
    // largest image, is what the language model's weights cannot use. The
    // peak is reserved for the largest image the server will encode:
    // upstream's --image-max-tokens bounds it.
    let v = engine::VisionOptions {
        image_max_tokens: p.image_max_tokens,
        ..launch::vision_options(&state.opts.pipeshard, p.use_gpu, engine::default_threads())
    };
    p.weights_on_host = v.weights_on_host;
    p.stream_slots = v.stream_slots;
    p.window_attn_max_tokens = v.window_attn_max_tokens;
    // Upstream's warm-up encodes an image of the largest size while the
    // language model's compute buffers are held, the two peaks the plan
    // keeps apart (VL at 4 GiB with --image-max-tokens 2700: 4258 MiB at
    // load). The plan's own measurement already encoded one in this
    // process, so the encoder's kernels and pools are warm.
    p.warmup = false;
    engine::set_media_release_compute(v.separate_peaks);
    if let Ok(mut g) = state.vision.lock() {
        *g = Some(v);
    }
    tracing::info!(
        "vision encoder {}: weights in host memory, {} stream slots, compute released around each image",
        path.display(),
        p.stream_slots
    );
}

/// Upstream's default `--spec-draft-n-max`.
const DRAFT_N_MAX: u32 = 3;

#[cfg(test)]
mod tests {
    use super::{slots_batch, slots_workload};
    use crate::engine::ContextParams;

    fn params(n_ctx: u32, n_batch: u32, n_ubatch: u32, n_seq_max: u32) -> ContextParams {
        ContextParams {
            n_ctx,
            n_batch,
            n_ubatch,
            n_seq_max,
            ..ContextParams::default()
        }
    }

    #[test]
    fn one_ubatch_per_slot_within_the_context() {
        // R2's four-client case: -np 4 -c 17408, the plan's ubatch 4096.
        assert_eq!(slots_batch(&params(17408, 4096, 4096, 4)), 16384);
        // One slot: the batch stays what upstream and the plan set.
        assert_eq!(slots_batch(&params(4352, 4096, 4096, 1)), 4096);
        // Never beyond the context, never below upstream's own -b.
        assert_eq!(slots_batch(&params(8192, 4096, 4096, 4)), 8192);
        assert_eq!(slots_batch(&params(17408, 8192, 1024, 4)), 8192);
        // Upstream resolves n_ctx before the hook; 0 would mean "the model's".
        assert_eq!(slots_batch(&params(0, 2048, 512, 8)), 4096);
    }

    #[test]
    fn the_slots_decode_together_in_the_plan() {
        // -np 4: the plan prices a 4-token decode ubatch; -np 1 (and
        // upstream's 0, "auto", resolved before the hook) plan one sequence.
        let w = slots_workload(&params(17408, 4096, 4096, 4));
        assert_eq!((w.parallel, w.decode_tokens()), (4, 4));
        assert_eq!(w.prompt_tokens, crate::plan::Workload::default().prompt_tokens);
        assert_eq!(slots_workload(&params(4352, 4096, 4096, 1)).decode_tokens(), 1);
        assert_eq!(slots_workload(&params(4352, 4096, 4096, 0)).decode_tokens(), 1);
    }
}
