//! The running state of an installed plan, one per loaded model: the
//! per-op decisions in force (the [`PolicySwitch`] the context's callbacks
//! ask), the [`Phase`] (a prompt's residency or the decode tier's), the
//! decode split still to tune, and the follower of the card
//! (`--vram-budget auto`). [`Launch`] is the plan it was installed from;
//! `run`, `bench` and the server's loop step the session between batches.
//!
//! ```text
//! Launch::install ─► Session ─┬─ enter_decode / leave_decode    Phase::Prompt ⇄ Phase::Decode
//!                             ├─ tune_split (run, bench), tune_served at the server loop's first call
//!                             └─ the follower's re-plans, applied between batches
//! ```

use std::sync::Arc;

use super::decode::Decoding;
use super::live::{self, EngineMoves, Follower, Hooks};
use super::tune::{self, SplitKnob, SplitTuning};
use super::tune_batch;
use super::{Launch, LaunchError};
use crate::engine::{Context, ContextParams, ContextRef};
use crate::plan::{Plan, PolicySwitch};

/// A tuner that runs before a server's first request.
type ServedTuner = fn(&mut Session, ContextRef<'_>, (u32, u32)) -> Option<SplitTuning>;

/// Called when another plan is in force, with the budget it was made for.
pub type PlanChanged = Arc<dyn Fn(&Plan, u64) + Send + Sync>;

/// Where the model's work is between two batches.
#[derive(Debug, Clone)]
pub enum Phase {
    /// A prompt's plan, residency and ubatch are in force: from the
    /// install on, and again after [`Session::leave_decode`].
    Prompt,
    /// Decoding, after [`Session::enter_decode`]: the decode tier's weights
    /// resident as far as they fit (None: the plan has no tier, or it had
    /// no room).
    Decode(Option<Box<Decoding>>),
}

/// One loaded model's running state.
pub struct Session {
    launch: Launch,
    /// The plan in force.
    pub(super) plan: Plan,
    pub(super) switch: Arc<PolicySwitch>,
    pub(super) phase: Phase,
    /// The decode split the plan leaves open, until it is tuned.
    pub(super) split_knob: Option<SplitKnob>,
    /// The split of the ubatch several sequences decode together (its
    /// tokens, and the knob), until it is tuned
    /// ([`tune_batch::tune_served_batch`]).
    pub(super) batch_knob: Option<(u32, SplitKnob)>,
    /// The decode split to tune before a server's first request: the
    /// context's streaming slots and routed threshold, set again to
    /// rebuild its graphs.
    served_tune: Option<(u32, u32)>,
    follower: Option<Arc<Follower>>,
    plan_changed: Option<PlanChanged>,
}

impl Session {
    /// The running state of `launch`, its plan in force; the context's
    /// callbacks ask [`Session::switch`] once [`Session::install_callbacks`]
    /// put them into its parameters.
    pub fn new(launch: &Launch) -> Session {
        Session {
            plan: launch.plan.clone(),
            switch: PolicySwitch::new(&launch.plan),
            phase: Phase::Prompt,
            split_knob: launch.split_knob,
            batch_knob: launch.split_knob.and_then(|k| tune_batch::batch_knob(k, &launch.plan)),
            served_tune: None,
            follower: None,
            plan_changed: None,
            launch: launch.clone(),
        }
    }

    /// Make `cp`'s per-op callbacks ask this session's decisions.
    pub fn install_callbacks(&self, cp: &mut ContextParams) {
        self.switch.install(cp);
    }

    /// The plan installed, as it was made.
    pub fn launch(&self) -> &Launch {
        &self.launch
    }

    /// The plan in force: the decode tier's while decoding, with the split
    /// tuned, or the follower's last re-plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// The per-op decisions in force, which the context's callbacks ask.
    pub fn switch(&self) -> &Arc<PolicySwitch> {
        &self.switch
    }

    /// The follower of the card, once [`Session::follow_card`] made it.
    pub fn follower(&self) -> Option<&Arc<Follower>> {
        self.follower.as_ref()
    }

    /// Call `f` whenever another plan goes in force (a tuned split, a
    /// re-plan), e.g. for a server's reports.
    pub fn on_plan_changed(&mut self, f: PlanChanged) {
        self.plan_changed = Some(f);
    }

    /// With `--vram-budget auto`: a follower of the card for the plan in
    /// force, not sampling yet ([`Follower::spawn`]); its re-plans switch
    /// this session's decisions. `wake` wakes the model's thread (a
    /// server's loop sleeps while idle). None without a re-plan basis.
    pub fn follow_card(&mut self, headroom: Option<u64>, wake: Box<dyn Fn() + Send + Sync>) -> Option<&Arc<Follower>> {
        let basis = self.launch.replan.clone()?;
        let switch = Arc::clone(&self.switch);
        let changed = self.plan_changed.clone();
        let hooks = Hooks {
            wake,
            switched: Box::new(move |plan, budget| {
                switch.switch(plan);
                if let Some(f) = &changed {
                    f(plan, budget);
                }
            }),
        };
        let f = Follower::new(basis, self.plan.clone(), self.launch.budget, headroom, hooks);
        self.follower = Some(Arc::new(f));
        self.follower.as_ref()
    }

    /// Stop following the card (e.g. its sampling could not start): the
    /// plan in force stays.
    pub fn stop_following(&mut self) {
        if let Some(f) = self.follower.take() {
            f.stop();
        }
    }

    /// Between two decodes of the program's own generation (`run`): carry
    /// out the follower's posted re-plan, or after the prompt put the
    /// decode tier in force (once per prompt).
    pub fn between_decodes(&mut self, ctx: &mut Context<'_>) -> Result<(), LaunchError> {
        if let Some(f) = &self.follower {
            let applied = f.apply_pending(|moves, slots| live::migrate(ctx.context_ref(), moves, slots));
            if matches!(applied, Some(Ok(_))) {
                self.plan = f.in_force();
            }
            return Ok(());
        }
        if matches!(self.phase, Phase::Prompt) {
            self.enter_decode(ctx)?;
        }
        Ok(())
    }

    /// Tune the decode split before a server serves its first request,
    /// where the plan leaves one open and the card is not followed (a
    /// re-plan sets its own share): at the loop's first call
    /// ([`Session::between_batches`], [`tune::tune_served`]), so that no
    /// request is served at a probe's setting. `cp` holds the installed
    /// parameters.
    pub fn tune_before_serving(&mut self, cp: &ContextParams) {
        if self.launch.replan.is_none() && self.split_knob.is_some() {
            self.served_tune = Some((cp.stream_slots, cp.stream_routed_max));
        }
    }

    /// The server's loop, between two batches: at its first call the
    /// decode split tuned, and the follower's posted re-plan applied,
    /// moving the weights with the engine (patch 0023); a promotion is
    /// copied on the side while serving goes on and committed here once its
    /// copies are complete (patch 0028).
    pub fn between_batches(&mut self, mut ctx: ContextRef<'_>) {
        if let Some(stream) = self.served_tune.take() {
            self.tune_guarded(ctx.reborrow(), stream, "decode split", tune::tune_served);
            self.tune_guarded(
                ctx.reborrow(),
                stream,
                "decode split of several sequences",
                tune_batch::tune_served_batch,
            );
        }
        if let Some(f) = &self.follower {
            if let Some(Ok(_)) = f.between_batches(&mut EngineMoves { ctx }) {
                self.plan = f.in_force();
            }
        }
    }

    /// One of the tuners that run before the first request
    /// ([`tune::tune_served`], [`tune_batch::tune_served_batch`]), reported
    /// where it chose. A tuner that fails (a panic, caught here) leaves the
    /// plan's own setting in force rather than a probe's, and every
    /// sequence empty (they tune only while none holds cells).
    fn tune_guarded(&mut self, mut ctx: ContextRef<'_>, stream: (u32, u32), what: &str, tune: ServedTuner) {
        let tuned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tune(self, ctx.reborrow(), stream)));
        match tuned {
            Ok(Some(_)) => {
                if let Some(f) = &self.plan_changed {
                    f(&self.plan, self.launch.budget);
                }
            }
            Ok(None) => {}
            Err(_) => {
                tracing::warn!("{what}: not tuned, the tuner failed; the plan's setting is in force");
                self.switch.switch(&self.plan);
                for s in 0..ctx.n_seq_max() as i32 {
                    if !ctx.seq_rm(s, 0, -1) {
                        tracing::warn!("{what}: sequence {s} could not be emptied after the failed tuning");
                    }
                }
                ctx.set_stream_slots(stream.0, stream.1);
            }
        }
    }

    /// Drop a tuning still to run, with the plan's own setting in force (a
    /// panic left the session's lock poisoned).
    pub fn abandon_served_tuning(&mut self, mut ctx: ContextRef<'_>) {
        if let Some(stream) = self.served_tune.take() {
            tracing::warn!("decode split: not tuned, the session failed; the plan's setting is in force");
            self.switch.switch(&self.plan);
            ctx.set_stream_slots(stream.0, stream.1);
        }
    }

    /// Whether the decode split is still to tune before the first request.
    pub fn tune_pending(&self) -> bool {
        self.served_tune.is_some()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(f) = &self.follower {
            f.stop();
        }
    }
}
