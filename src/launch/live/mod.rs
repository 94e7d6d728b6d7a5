//! Live re-planning (`--vram-budget auto` in `serve` and `run`): while the
//! model runs, the budget follows the card's free memory. A free-memory
//! [`source`] (NVML, or a scripted trace) is sampled every 50 ms; the
//! [`hysteresis`] decides when the budget shrinks or grows; the model is
//! planned again for the new budget with the launch's cost model and shape
//! ([`replan`]); the difference is a list of weight [`moves`], which the
//! model's own thread carries out between two batches ([`follower`]), and
//! the new plan's per-tier decisions go in force
//! ([`crate::plan::PolicySwitch`]).
//!
//! ```text
//! source ─► hysteresis ─► replan ─► moves ─► (posted) ─► engine migration ─► policies switch
//!   └── sampling thread ────────────────────┘   └── model thread, between batches ──┘
//! ```

pub mod follower;
pub mod hysteresis;
mod migrate;
pub mod moves;
pub mod replan;
pub mod source;
pub mod stats;

pub use follower::{Follower, Hooks, LiveEngine, MigrationFailure, Pending, Slots, Staged};
pub use migrate::{migrate, EngineMoves};
pub use moves::Move;
pub use replan::{ReplanBasis, Replanned};
pub use source::{CardSample, FreeMemorySource, NvmlSource, TraceSource, TRACE_ENV};
pub use stats::Snapshot;

/// The environment variable naming a file the loop writes every sample
/// to (a trace [`TraceSource`] replays, with the allowance, the budget and
/// the plan's total beside it).
pub const RECORD_ENV: &str = "PIPESHARD_REPLAN_RECORD";
