//! What the live re-plan loop has done, for `/metrics` and the tests.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Counters and gauges of the live re-plan loop; every field is read
/// without locking.
#[derive(Debug, Default)]
pub struct Stats {
    samples: AtomicU64,
    allowance: AtomicU64,
    budget: AtomicU64,
    replans: AtomicU64,
    failures: AtomicU64,
    unfit: AtomicU64,
    predicted_bits: AtomicU64,
    last_migration_bits: AtomicU64,
    total_migration_bits: AtomicU64,
    bytes_to_host: AtomicU64,
    bytes_to_device: AtomicU64,
    staging: AtomicU64,
    promotions: AtomicU64,
    cancelled: AtomicU64,
    last_copy_bits: AtomicU64,
    last_pause_bits: AtomicU64,
    total_copy_bits: AtomicU64,
    total_pause_bits: AtomicU64,
}

/// A copy of [`Stats`] at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Snapshot {
    /// Card samples taken.
    pub samples: u64,
    /// The card's allowance at the last sample, bytes.
    pub allowance: u64,
    /// The budget of the plan in force, bytes.
    pub budget: u64,
    /// Re-plans put in force by a migration.
    pub replans: u64,
    /// Migrations the engine refused (the plan before stays in force).
    pub failures: u64,
    /// Whether even the smallest plan is over the allowance (it serves on).
    pub unfit: bool,
    /// The plan in force's predicted decode speed, tokens/s.
    pub predicted_decode_tok_s: f64,
    /// Seconds the last migration took.
    pub last_migration_s: f64,
    /// Seconds all migrations took.
    pub total_migration_s: f64,
    pub bytes_to_host: u64,
    pub bytes_to_device: u64,
    /// Whether a promotion's copies run on the side now.
    pub staging: bool,
    /// Promotions copied on the side and committed.
    pub promotions: u64,
    /// Staged promotions cancelled because the card changed again.
    pub promotions_cancelled: u64,
    /// Seconds the last staged promotion's copies took on the side, while
    /// serving went on.
    pub last_promotion_copy_s: f64,
    /// Seconds the last staged promotion paused serving (between two
    /// batches: repointing the weights, reserving the compute buffers).
    pub last_promotion_pause_s: f64,
    pub total_promotion_copy_s: f64,
    pub total_promotion_pause_s: f64,
}

impl Stats {
    pub(super) fn new(budget: u64, predicted_decode_tok_s: f64) -> Stats {
        let s = Stats::default();
        s.budget.store(budget, Relaxed);
        s.predicted_bits.store(predicted_decode_tok_s.to_bits(), Relaxed);
        s
    }

    pub(super) fn sampled(&self, allowance: u64) {
        self.samples.fetch_add(1, Relaxed);
        self.allowance.store(allowance, Relaxed);
    }

    pub(super) fn set_unfit(&self, unfit: bool) {
        self.unfit.store(unfit as u64, Relaxed);
    }

    pub(super) fn failed(&self) {
        self.failures.fetch_add(1, Relaxed);
    }

    pub(super) fn in_force(&self, budget: u64, predicted_decode_tok_s: f64) {
        self.budget.store(budget, Relaxed);
        self.predicted_bits.store(predicted_decode_tok_s.to_bits(), Relaxed);
    }

    pub(super) fn migrated(&self, elapsed: Duration, to_host: u64, to_device: u64) {
        self.replans.fetch_add(1, Relaxed);
        let s = elapsed.as_secs_f64();
        self.last_migration_bits.store(s.to_bits(), Relaxed);
        let total = f64::from_bits(self.total_migration_bits.load(Relaxed)) + s;
        self.total_migration_bits.store(total.to_bits(), Relaxed);
        self.bytes_to_host.fetch_add(to_host, Relaxed);
        self.bytes_to_device.fetch_add(to_device, Relaxed);
    }

    pub(super) fn staging(&self, on: bool) {
        self.staging.store(on as u64, Relaxed);
    }

    pub(super) fn cancelled(&self) {
        self.cancelled.fetch_add(1, Relaxed);
        self.staging.store(0, Relaxed);
    }

    pub(super) fn promoted(&self, copy: Duration, pause: Duration) {
        self.promotions.fetch_add(1, Relaxed);
        let add = |a: &AtomicU64, v: f64| a.store((f64::from_bits(a.load(Relaxed)) + v).to_bits(), Relaxed);
        self.last_copy_bits.store(copy.as_secs_f64().to_bits(), Relaxed);
        self.last_pause_bits.store(pause.as_secs_f64().to_bits(), Relaxed);
        add(&self.total_copy_bits, copy.as_secs_f64());
        add(&self.total_pause_bits, pause.as_secs_f64());
    }

    /// The values now.
    pub fn snapshot(&self) -> Snapshot {
        let f = |a: &AtomicU64| f64::from_bits(a.load(Relaxed));
        Snapshot {
            samples: self.samples.load(Relaxed),
            allowance: self.allowance.load(Relaxed),
            budget: self.budget.load(Relaxed),
            replans: self.replans.load(Relaxed),
            failures: self.failures.load(Relaxed),
            unfit: self.unfit.load(Relaxed) != 0,
            predicted_decode_tok_s: f(&self.predicted_bits),
            last_migration_s: f(&self.last_migration_bits),
            total_migration_s: f(&self.total_migration_bits),
            bytes_to_host: self.bytes_to_host.load(Relaxed),
            bytes_to_device: self.bytes_to_device.load(Relaxed),
            staging: self.staging.load(Relaxed) != 0,
            promotions: self.promotions.load(Relaxed),
            promotions_cancelled: self.cancelled.load(Relaxed),
            last_promotion_copy_s: f(&self.last_copy_bits),
            last_promotion_pause_s: f(&self.last_pause_bits),
            total_promotion_copy_s: f(&self.total_copy_bits),
            total_promotion_pause_s: f(&self.total_pause_bits),
        }
    }
}
