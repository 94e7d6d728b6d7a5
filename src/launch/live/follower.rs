//! The loop that follows the card: a sampling thread reads the card every
//! [`SAMPLE_EVERY`], decides with [`Hysteresis`], re-plans and posts the
//! moves; the thread that runs the model ([`Follower::apply_pending`],
//! between two batches) carries them out through the engine and puts the
//! new plan's decisions in force. Sampling and planning never hold up
//! decoding; only the migration itself happens in the model's thread,
//! where no graph is running.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::hysteresis::{Decision, Hysteresis, SAMPLE_EVERY, SLACK};
use super::moves::{device_bytes, diff, Move};
use super::replan::{ReplanBasis, Replanned};
use super::source::{CardSample, FreeMemorySource};
use super::stats::{Snapshot, Stats};
use crate::engine::{MigrationReport, Residence};
use crate::launch::options::default_headroom;
use crate::plan::{fmt_bytes, Plan};

/// Why a migration failed, and whether its weights moved all the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationFailure {
    pub message: String,
    /// Every weight moved (what failed came after, e.g. reserving the
    /// compute buffers for the new placement): the new plan is where the
    /// weights are, so its decisions go in force.
    pub all_moved: bool,
}

impl std::fmt::Display for MigrationFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The streaming slots and routed-expert threshold of a plan (patches 0003
/// and 0005), which a migration changes first when they differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slots {
    pub n: u32,
    pub routed_max: u32,
}

impl Slots {
    pub fn of(plan: &Plan) -> Slots {
        Slots {
            n: plan.stream_slots,
            routed_max: plan.stream_routed_max,
        }
    }
}

/// A re-plan waiting for the model's thread.
#[derive(Debug, Clone)]
pub struct Pending {
    pub replanned: Replanned,
    /// From the plan in force to the new one, in order.
    pub moves: Vec<Move>,
    /// The new plan's streaming slots, when they differ from the plan in
    /// force's.
    pub slots: Option<Slots>,
    /// The allowance it follows.
    pub allowance: u64,
    pub decided: Instant,
}

/// The progress of a promotion staged on the side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Staged {
    /// The copies go on: serve on under the plan in force.
    Copying,
    /// Every copy is complete: commit.
    Ready,
    /// The copies cannot be completed (e.g. an allocation failed).
    Failed(String),
}

/// What the model's thread does with the engine between two batches
/// ([`Follower::between_batches`]): a re-plan that demotes moves at once;
/// one that only promotes is staged (its copies run on the side while
/// serving goes on under the plan in force, whose decisions stay valid
/// because the weights are still on the host) and committed once its
/// copies are complete.
pub trait LiveEngine {
    /// Move the weights now, the streaming slots first when given (as
    /// [`Follower::apply_pending`]'s `migrate`).
    fn migrate(&mut self, moves: &[Move], slots: Option<Slots>) -> Result<MigrationReport, MigrationFailure>;
    /// Start copying promotions to the device on the side.
    fn stage(&mut self, moves: &[Move]) -> Result<(), MigrationFailure>;
    /// How the staged copies are doing.
    fn staged(&mut self) -> Staged;
    /// Free the staged copies; the weights stay where they are.
    fn cancel(&mut self);
    /// Point the staged weights at their copies, with the streaming slots
    /// changed first when given; the report's `elapsed` is the pause and
    /// its `side_copy` the copies' time.
    fn commit(&mut self, slots: Option<Slots>) -> Result<MigrationReport, MigrationFailure>;
}

/// Called when a plan is in force, with the budget it was made for.
pub type SwitchedHook = Box<dyn Fn(&Plan, u64) + Send + Sync>;

/// What the loop calls outside itself.
pub struct Hooks {
    /// Wake the model's thread so that it applies a posted re-plan soon
    /// (the server's loop sleeps while no request is in flight).
    pub wake: Box<dyn Fn() + Send + Sync>,
    /// A new plan is in force (its weights moved): put its per-tier
    /// decisions in force, with the budget it was made for.
    pub switched: SwitchedHook,
}

impl Default for Hooks {
    fn default() -> Self {
        Hooks {
            wake: Box::new(|| {}),
            switched: Box::new(|_, _| {}),
        }
    }
}

struct Shared {
    basis: ReplanBasis,
    headroom: Option<u64>,
    hysteresis: Mutex<Hysteresis>,
    in_force: Mutex<Plan>,
    pending: Mutex<Option<Pending>>,
    /// A promotion whose copies run on the side ([`Follower::between_batches`]).
    staged: Mutex<Option<Pending>>,
    stats: Stats,
    hooks: Hooks,
    record: Mutex<Option<(std::fs::File, Instant)>>,
}

/// The live re-plan loop of one model.
pub struct Follower {
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Follower {
    /// A loop for `plan`, in force at `budget`, that leaves `headroom`
    /// free on the card (None: [`default_headroom`]); not sampling yet
    /// (see [`Follower::spawn`], or drive it with [`Follower::step`]).
    pub fn new(basis: ReplanBasis, plan: Plan, budget: u64, headroom: Option<u64>, hooks: Hooks) -> Follower {
        let stats = Stats::new(budget, plan.predicted.decode_tok_s);
        Follower {
            shared: Arc::new(Shared {
                basis,
                headroom,
                hysteresis: Mutex::new(Hysteresis::new(budget)),
                in_force: Mutex::new(plan),
                pending: Mutex::new(None),
                staged: Mutex::new(None),
                stats,
                hooks,
                record: Mutex::new(None),
            }),
            stop: Arc::new(AtomicBool::new(false)),
            thread: Mutex::new(None),
        }
    }

    /// Write every sample to `path` as a trace (`SECONDS TOTAL OTHERS OWN`,
    /// then the allowance, the budget and the plan's total, all bytes),
    /// which [`super::TraceSource`] replays.
    pub fn record_to(&self, path: &std::path::Path) -> std::io::Result<()> {
        let mut f = std::fs::File::create(path)?;
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        writeln!(f, "# started at unix {unix:.3}")?;
        writeln!(f, "# seconds total others own allowance budget plan_total")?;
        *lock(&self.shared.record) = Some((f, Instant::now()));
        Ok(())
    }

    /// Sample `source` every [`SAMPLE_EVERY`] on a thread of its own until
    /// [`Follower::stop`].
    pub fn spawn(&self, mut source: Box<dyn FreeMemorySource>) -> std::io::Result<()> {
        let shared = Arc::clone(&self.shared);
        let stop = Arc::clone(&self.stop);
        let start = Instant::now();
        let handle = std::thread::Builder::new()
            .name("pipeshard-replan".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    let sample = source.sample();
                    step(&shared, t0.duration_since(start), sample);
                    std::thread::sleep(SAMPLE_EVERY.saturating_sub(t0.elapsed()));
                }
            })?;
        *lock(&self.thread) = Some(handle);
        Ok(())
    }

    /// Stop sampling (a posted re-plan stays posted).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = lock(&self.thread).take() {
            let _ = h.join();
        }
    }

    /// One sample at `now` (an offset from any fixed start), as the
    /// sampling thread takes it.
    pub fn step(&self, now: Duration, sample: Option<CardSample>) {
        step(&self.shared, now, sample);
    }

    /// The posted re-plan, if any.
    pub fn pending(&self) -> Option<Pending> {
        lock(&self.shared.pending).clone()
    }

    /// The promotion being copied on the side, if any.
    pub fn staged(&self) -> Option<Pending> {
        lock(&self.shared.staged).clone()
    }

    /// The plan in force.
    pub fn in_force(&self) -> Plan {
        lock(&self.shared.in_force).clone()
    }

    /// The loop's counters and gauges now.
    pub fn stats(&self) -> Snapshot {
        self.shared.stats.snapshot()
    }

    /// In the model's thread, between two batches: carry out the posted
    /// re-plan with `migrate` (its moves, and its streaming slots first when
    /// they change) and put its plan in force. Returns what was
    /// done (None: nothing was posted). When `migrate` fails the plan
    /// before stays in force; the loop tries again when it next decides.
    pub fn apply_pending(
        &self,
        migrate: impl FnOnce(&[Move], Option<Slots>) -> Result<MigrationReport, MigrationFailure>,
    ) -> Option<Result<MigrationReport, MigrationFailure>> {
        let p = lock(&self.shared.pending).take()?;
        let result = migrate(&p.moves, p.slots);
        self.finish(&p, &result);
        Some(result)
    }

    /// In the model's thread, between two batches: as
    /// [`Follower::apply_pending`], except that a re-plan that only promotes
    /// is staged: `engine` copies its weights on the side while serving
    /// goes on under the plan in force, and a later call commits it once
    /// the copies are complete (the pause is the repointing and the
    /// reservation). A re-plan posted while a promotion is staged cancels
    /// it first (its staged memory is freed before anything is demoted).
    /// Returns what was put in force, or failed (None: nothing was).
    pub fn between_batches(&self, engine: &mut impl LiveEngine) -> Option<Result<MigrationReport, MigrationFailure>> {
        let s = &self.shared;
        let posted = lock(&s.pending).take();
        let mut staged = lock(&s.staged);
        if let Some(p) = posted {
            if let Some(old) = staged.as_ref() {
                if old.moves == p.moves && old.slots == p.slots {
                    // The same promotion again: its copies go on.
                    return None;
                }
                let old = staged.take().expect("checked");
                engine.cancel();
                s.stats.cancelled();
                tracing::info!(
                    "re-plan: cancelled the promotion of {} weights ({}) staged {:.3} s ago: the card changed again",
                    old.moves.len(),
                    fmt_bytes(device_bytes(&old.moves).1),
                    old.decided.elapsed().as_secs_f64()
                );
            }
            if p.moves.is_empty() && p.slots.is_none() {
                // Posted only to cancel the stage: the plan in force stays.
                return None;
            }
            if p.moves.iter().all(|m| m.to == Residence::Device) {
                match engine.stage(&p.moves) {
                    Ok(()) => {
                        tracing::info!(
                            "re-plan: copying {} weights ({}) to the GPU on the side while serving goes on",
                            p.moves.len(),
                            fmt_bytes(device_bytes(&p.moves).1)
                        );
                        s.stats.staging(true);
                        *staged = Some(p);
                        return None;
                    }
                    Err(e) => {
                        tracing::warn!("re-plan: staging the promotion failed ({e}): promoting between two batches");
                        engine.cancel();
                    }
                }
            }
            drop(staged);
            let result = engine.migrate(&p.moves, p.slots);
            self.finish(&p, &result);
            return Some(result);
        }
        staged.as_ref()?;
        match engine.staged() {
            Staged::Copying => None,
            Staged::Ready => {
                let p = staged.take()?;
                s.stats.staging(false);
                let result = engine.commit(p.slots);
                drop(staged);
                self.finish(&p, &result);
                Some(result)
            }
            Staged::Failed(message) => {
                let p = staged.take()?;
                s.stats.staging(false);
                engine.cancel();
                let result = Err(MigrationFailure {
                    message: format!("copying the promotion on the side failed: {message}"),
                    all_moved: false,
                });
                drop(staged);
                self.finish(&p, &result);
                Some(result)
            }
        }
    }

    /// Put `p`'s plan in force after `result`, or keep the plan before.
    fn finish(&self, p: &Pending, result: &Result<MigrationReport, MigrationFailure>) {
        let s = &self.shared;
        let plan = &p.replanned.plan;
        let put_in_force = || {
            *lock(&s.in_force) = plan.clone();
            (s.hooks.switched)(plan, p.replanned.budget);
            s.stats.in_force(p.replanned.budget, plan.predicted.decode_tok_s);
        };
        match result {
            Ok(m) => {
                put_in_force();
                s.stats.migrated(m.elapsed, m.bytes_to_host, m.bytes_to_device);
                if !m.side_copy.is_zero() {
                    s.stats.promoted(m.side_copy, m.elapsed);
                }
                tracing::info!("re-plan moved: {}", describe(&p.moves, 12));
                tracing::debug!("re-plan moved, every weight: {}", describe(&p.moves, usize::MAX));
                let how = if m.side_copy.is_zero() {
                    format!("in {:.3} s", m.elapsed.as_secs_f64())
                } else {
                    format!(
                        "copied on the side in {:.3} s while serving went on, then a pause of {:.3} s",
                        m.side_copy.as_secs_f64(),
                        m.elapsed.as_secs_f64()
                    )
                };
                tracing::info!(
                    "re-plan in force: moved {} weights ({} to the host, {} to the GPU, {} of device memory freed) {how}, {:.3} s after the card changed; budget {}, plan {} (weights {}), predicted {:.1} tok/s",
                    m.moved,
                    fmt_bytes(m.bytes_to_host),
                    fmt_bytes(m.bytes_to_device),
                    fmt_bytes(m.device_bytes_freed),
                    p.decided.elapsed().as_secs_f64(),
                    fmt_bytes(p.replanned.budget),
                    fmt_bytes(plan.vram.total),
                    fmt_bytes(plan.vram.weights),
                    plan.predicted.decode_tok_s
                );
            }
            Err(e) if e.all_moved => {
                s.stats.failed();
                put_in_force();
                tracing::error!(
                    "re-plan: the weights moved to the new plan, which is in force, but the engine reports: {e}"
                );
            }
            Err(e) => {
                s.stats.failed();
                tracing::error!("re-plan: moving the weights failed, the plan before stays in force: {e}");
            }
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What `moves` move, for the log: each weight with its destination, the
/// first `shown` of them and a count of the others.
fn describe(moves: &[Move], shown: usize) -> String {
    let one = |m: &Move| {
        format!(
            "{} → {}",
            m.tensor,
            match m.to {
                Residence::Device => "GPU",
                Residence::Host => "host",
            }
        )
    };
    let mut out: Vec<String> = moves.iter().take(shown).map(one).collect();
    if moves.len() > shown {
        out.push(format!("and {} more", moves.len() - shown));
    }
    out.join(", ")
}

fn step(s: &Shared, now: Duration, sample: Option<CardSample>) {
    let Some(sample) = sample else {
        return;
    };
    let headroom = s.headroom.unwrap_or_else(|| default_headroom(sample.total));
    let allowance = sample.allowance(headroom);
    s.stats.sampled(allowance);
    // What the process may reach: the plan posted next, or the one in force.
    let (plan_total, in_force_total) = {
        let in_force = lock(&s.in_force).vram.total;
        let next = lock(&s.pending)
            .as_ref()
            .or(lock(&s.staged).as_ref())
            .map(|p| p.replanned.plan.vram.total);
        (next.unwrap_or(in_force), in_force)
    };
    if lock(&s.staged).is_some() {
        // The model's thread commits a promotion once its copies are
        // complete: let it look even while no request is in flight.
        (s.hooks.wake)();
    }
    let own = sample.own.unwrap_or(0);
    if let Some((f, start)) = lock(&s.record).as_mut() {
        let _ = writeln!(
            f,
            "{:.3} {} {} {} {} {} {}",
            start.elapsed().as_secs_f64(),
            sample.total,
            sample.others,
            own,
            allowance,
            s.stats.snapshot().budget,
            plan_total
        );
    }
    let decision = lock(&s.hysteresis).step(now, allowance, plan_total.max(own));
    let budget = match decision {
        Decision::Stay => return,
        Decision::Shrink(b) | Decision::Grow(b) => b,
    };
    // What the process holds beyond its plan (the plan's estimate of what
    // lies outside llama.cpp's buffers fell short) comes off the budget.
    let excess = own.saturating_sub(in_force_total);
    let plan_budget = budget.saturating_sub(excess);
    let replanned = match s.basis.plan(plan_budget) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("re-plan for {}: {e}", fmt_bytes(plan_budget));
            return;
        }
    };
    let what = if matches!(decision, Decision::Shrink(_)) {
        "shrinks"
    } else {
        "grows"
    };
    s.stats.set_unfit(!replanned.fits);
    if !replanned.fits {
        tracing::warn!(
            "the card's allowance {} is below the smallest plan ({}): serving on from the smallest plan",
            fmt_bytes(allowance),
            fmt_bytes(replanned.plan.vram.total)
        );
    }
    let (moves, slots) = {
        let in_force = lock(&s.in_force);
        let held = in_force.vram.total.max(own);
        if !replanned.fits && held <= replanned.plan.vram.total.saturating_add(SLACK) {
            // Nothing fits, and the process (its plan, and what NVML says
            // it holds) is within the slack of the smallest plan: another
            // program takes whatever a migration would free at once, and
            // the compute reservation the migration needs for the new
            // placement (other slots, other splits) could then find no
            // memory, failing every request. Serve on from it.
            tracing::warn!(
                "this process ({}) is within {} of the smallest plan ({}): the plan in force stays",
                fmt_bytes(held),
                fmt_bytes(SLACK),
                fmt_bytes(replanned.plan.vram.total)
            );
            (Vec::new(), None)
        } else {
            let value = s.basis.value_per_byte(&in_force);
            let slots = Some(Slots::of(&replanned.plan)).filter(|&n| n != Slots::of(&in_force));
            (diff(&in_force, &replanned.plan, &value), slots)
        }
    };
    let mut pending = lock(&s.pending);
    if moves.is_empty() && slots.is_none() {
        // The plan in force is already the plan for this budget.
        if pending.take().is_some() {
            tracing::info!("re-plan: the posted migration is no longer needed");
        }
        if lock(&s.staged).is_none() {
            s.stats
                .in_force(replanned.budget, lock(&s.in_force).predicted.decode_tok_s);
            return;
        }
        // Nor is the staged promotion: post nothing to move, which cancels
        // it.
    } else {
        let (freed, taken) = device_bytes(&moves);
        tracing::info!(
            "the card's allowance {} {} (others use {} of {}, this process {}): re-planned for {}: {} weights to move, {} off the GPU, {} onto it{}; predicted {:.1} tok/s",
            fmt_bytes(allowance),
            what,
            fmt_bytes(sample.others),
            fmt_bytes(sample.total),
            fmt_bytes(own),
            fmt_bytes(plan_budget),
            moves.len(),
            fmt_bytes(freed),
            fmt_bytes(taken),
            slots.map_or(String::new(), |n| format!(", {} stream slots", n.n)),
            replanned.plan.predicted.decode_tok_s
        );
    }
    *pending = Some(Pending {
        replanned,
        moves,
        slots,
        allowance,
        decided: Instant::now(),
    });
    drop(pending);
    (s.hooks.wake)();
}
