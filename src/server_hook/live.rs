//! `--vram-budget auto` in the server: the loaded plan follows the card.
//! The load hook starts a [`Follower`] for the target model and points its
//! context's per-op callbacks at a [`PolicySwitch`]; the server's loop hook
//! (patch 0024) applies the follower's posted re-plans between batches
//! through the engine's weight migration, then switches the decisions and
//! the plan `/props` and `/metrics` report.

use std::sync::{Arc, Mutex};

use super::plan::set_installed_plan;
use crate::engine::{self, ContextRef};
use crate::launch::live::{self, Follower, Hooks, ReplanBasis, Snapshot};
use crate::plan::{Plan, PolicySwitch};

static FOLLOWER: Mutex<Option<Arc<Follower>>> = Mutex::new(None);

/// The running follower, if the budget follows the card.
fn follower() -> Option<Arc<Follower>> {
    FOLLOWER.lock().ok().and_then(|g| g.clone())
}

/// The live loop's figures for `/metrics`, if it runs.
pub fn stats() -> Option<Snapshot> {
    follower().map(|f| f.stats())
}

/// Start following the card for `plan` (in force at `budget`), whose
/// context's per-op callbacks ask `switch` (installed with the plan): they
/// switch with the plan. A follower of an earlier load (the server slept
/// and reloads) is stopped first.
pub fn start(basis: ReplanBasis, plan: &Plan, budget: u64, headroom: Option<u64>, switch: Arc<PolicySwitch>) {
    let hooks = Hooks {
        wake: Box::new(engine::wake_server_loop),
        switched: Box::new(move |plan, budget| {
            switch.switch(plan);
            set_installed_plan(plan, budget);
        }),
    };
    let f = Arc::new(Follower::new(basis, plan.clone(), budget, headroom, hooks));
    if let Some(path) = std::env::var_os(live::RECORD_ENV).filter(|p| !p.is_empty()) {
        if let Err(e) = f.record_to(std::path::Path::new(&path)) {
            tracing::warn!("cannot record the card's samples to {}: {e}", path.to_string_lossy());
        }
    }
    let source = match live::source::from_env() {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("the budget stays fixed at the load's: {e}");
            return;
        }
    };
    if let Err(e) = f.spawn(source) {
        tracing::error!("the budget stays fixed at the load's: starting the sampling thread: {e}");
        return;
    }
    tracing::info!("--vram-budget auto: the plan follows the card's free memory while serving");
    let old = FOLLOWER.lock().map(|mut g| g.replace(f)).ok().flatten();
    if let Some(old) = old {
        old.stop();
    }
}

/// The server loop's hook, between two batches: apply a posted re-plan,
/// moving the weights with the engine (patch 0023); a promotion is copied
/// on the side while serving goes on and committed here once its copies
/// are complete (patch 0028).
pub fn on_loop(ctx: ContextRef<'_>) {
    let Some(f) = follower() else {
        return;
    };
    f.between_batches(&mut live::EngineMoves { ctx });
}
