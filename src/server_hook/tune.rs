//! The decode split chosen while serving: the server's own decode steps are
//! timed between batches (the loop hook, patch 0024) at the cost model's
//! share and the others around it, and the fastest is kept
//! ([`crate::launch::tune::StepTuner`]); `run` and `bench` time their own
//! steps after load ([`crate::launch::tune_split`]).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::plan::set_installed_plan;
use crate::engine::{ContextParams, ContextRef};
use crate::launch::tune::{with_setting, StepAction, StepTuner};
use crate::launch::Launch;
use crate::plan::{Plan, PolicySwitch};

struct ServerTuner {
    tuner: StepTuner,
    plan: Plan,
    switch: Arc<PolicySwitch>,
    /// The context's streaming slots and routed threshold, set again to
    /// rebuild its graphs.
    stream: (u32, u32),
    budget: Option<u64>,
    origin: Instant,
}

static TUNER: Mutex<Option<ServerTuner>> = Mutex::new(None);

/// Tune `launch`'s decode split while serving, if it has one to tune; `cp`
/// is the context's installed parameters, `budget` the one the installed
/// plan reports. Replaces the tuner of an earlier load (None: no tuner).
pub fn start(launch: Option<&Launch>, cp: &ContextParams, budget: Option<u64>) {
    let tuner = launch
        .and_then(|l| l.split_knob.map(|knob| (l, knob)))
        .map(|(launch, knob)| ServerTuner {
            tuner: StepTuner::new(knob),
            plan: launch.plan.clone(),
            switch: launch.switch.clone(),
            stream: (cp.stream_slots, cp.stream_routed_max),
            budget,
            origin: Instant::now(),
        });
    if let Some(planned) = launch.and_then(|l| l.split_knob).and_then(|k| k.setting(0)) {
        tracing::info!(
            "decode split: {planned} planned; the first decode steps served time it and the others around it"
        );
    }
    if let Ok(mut g) = TUNER.lock() {
        *g = tuner;
    }
}

/// The server loop's hook, between two batches. A tuner that fails (a
/// panic, caught here, or a lock a panic poisoned) is dropped, with the
/// plan's own setting put back in force rather than a probe's.
pub fn on_loop(mut ctx: ContextRef<'_>) {
    let (mut g, poisoned) = match TUNER.lock() {
        Ok(g) => (g, false),
        Err(e) => (e.into_inner(), true),
    };
    let Some(t) = g.as_mut() else {
        return;
    };
    let positions: Vec<i32> = (0..ctx.n_seq_max() as i32).map(|s| ctx.seq_pos_max(s)).collect();
    let now = t.origin.elapsed().as_secs_f64();
    let action = if poisoned {
        Err(())
    } else {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| t.tuner.observe(now, &positions))).map_err(|_| ())
    };
    match action {
        Ok(StepAction::Wait) => {}
        Ok(StepAction::Apply(setting)) => {
            t.switch.switch(&with_setting(&t.plan, setting));
            ctx.set_stream_slots(t.stream.0, t.stream.1);
        }
        Ok(StepAction::Done(tuning)) => {
            let plan = with_setting(&t.plan, tuning.chosen);
            t.switch.switch(&plan);
            ctx.set_stream_slots(t.stream.0, t.stream.1);
            if let Some(b) = t.budget {
                set_installed_plan(&plan, b);
            }
            tracing::info!("decode split: {tuning}");
            *g = None;
        }
        Err(()) => {
            tracing::warn!("decode split: not tuned, the tuner failed; the plan's setting is in force");
            t.switch.switch(&t.plan);
            ctx.set_stream_slots(t.stream.0, t.stream.1);
            *g = None;
        }
    }
}
