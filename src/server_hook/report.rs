//! pipeshard's part of the server's reports: a `pipeshard` field in
//! `GET /props` (the budget and the installed plan) and gauges in
//! `GET /metrics` next to upstream's `llamacpp:*` metrics.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::json;

use super::across::{device_metrics, props_plan};
use super::plan::Installed;
use crate::engine;
use crate::launch::across::AcrossLaunch;
use crate::launch::live::Follower;
use crate::plan::Plan;

/// What the server's reports read, written by its hooks: the plan
/// installed at the last target-model load, its live loop, the size of the
/// last ubatch and the process's memory sampler.
#[derive(Default)]
pub struct Reports {
    /// The budget as the options give it, until a plan resolves it (`auto`
    /// resolves when the model loads).
    budget: Option<u64>,
    installed: Mutex<Option<Installed>>,
    /// The plan across devices installed at the last target-model load.
    across: Mutex<Option<AcrossLaunch>>,
    follower: Mutex<Option<Arc<Follower>>>,
    /// Tokens of the last ubatch the scheduler placed under the plan.
    last_ubatch_tokens: AtomicU64,
    /// The process's memory sampler (NVML, every 20 ms), from the first
    /// plan installed on.
    sampler: Mutex<Option<engine::MemorySampler>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The process's device memory as NVML reports it (what nvidia-smi shows),
/// bytes; without NVML, what the first GPU has in use (0 without one).
fn gpu_used() -> u64 {
    match engine::process_device_bytes() {
        Some((b, _)) => b,
        None => engine::first_device(engine::DeviceKind::Gpu).map_or(0, |d| d.total_bytes.saturating_sub(d.free_bytes)),
    }
}

impl Reports {
    /// Reports for the budget `budget` the options give (None: none, or
    /// `auto`).
    pub fn new(budget: Option<u64>) -> Reports {
        Reports {
            budget,
            ..Reports::default()
        }
    }

    /// The plan installed at the last target-model load, if any.
    pub fn installed(&self) -> Option<Installed> {
        lock(&self.installed).clone()
    }

    /// A target model's plan is installed, with the follower of the card
    /// when the budget follows it.
    pub(super) fn install(&self, installed: Installed, follower: Option<Arc<Follower>>) {
        *lock(&self.installed) = Some(installed);
        *lock(&self.follower) = follower;
        *lock(&self.across) = None;
    }

    /// A target model's plan across devices is installed.
    pub(super) fn install_across(&self, launched: AcrossLaunch) {
        *lock(&self.installed) = None;
        *lock(&self.follower) = None;
        *lock(&self.across) = Some(launched);
    }

    /// Another `plan`, made for `budget`, is in force (a tuned split, a
    /// live re-plan).
    pub(super) fn plan_changed(&self, plan: &Plan, budget: u64) {
        if let Some(i) = lock(&self.installed).as_mut() {
            i.plan = plan.clone();
            i.budget = Some(budget);
        }
    }

    /// Note the size of a ubatch the plan's offload policy is asked about.
    pub(super) fn note_ubatch(&self, n_tokens: i64) {
        self.last_ubatch_tokens.store(n_tokens.max(0) as u64, Relaxed);
    }

    /// Sample the process's device memory for the peak gauge, once however
    /// many models load (only with a GPU).
    pub(super) fn start_peak_sampler(&self) {
        if engine::has_gpu() {
            lock(&self.sampler).get_or_insert_with(|| {
                engine::MemorySampler::start(
                    engine::first_device(engine::DeviceKind::Gpu).map(|d| d.index),
                    Vec::new(),
                )
            });
        }
    }

    /// The live loop's figures, if the budget follows the card.
    fn live(&self) -> Option<crate::launch::live::Snapshot> {
        lock(&self.follower).as_ref().map(|f| f.stats())
    }

    /// The `pipeshard` field of `/props`: the budget and a summary of the
    /// plan (null without one, e.g. without a GPU).
    pub fn props_json(&self) -> String {
        if let Some(l) = lock(&self.across).as_ref() {
            let total: u64 = l.budgets.iter().map(|b| b.bytes).sum();
            return json!({"vram_budget": total, "plan": props_plan(l)}).to_string();
        }
        let Some(i) = self.installed() else {
            return json!({"vram_budget": self.budget, "plan": null}).to_string();
        };
        let p = &i.plan;
        json!({
            "vram_budget": i.budget,
            "plan": {
                "source": if i.from_file { "file" } else { "budget" },
                "model": p.model,
                "ubatch": p.ubatch,
                "tiers": p.tiers,
                "n_layer": p.n_layer,
                "kv_gpu_layers": p.kv_gpu_layers,
                "pinned": p.pinned,
                "stream_slots": p.stream_slots,
                "stream_routed_max": p.stream_routed_max,
                "hybrid_gpu_experts": p.hybrid_gpu_experts,
                "batch_gpu_experts": p.batch_gpu_experts,
                "row_split_share": p.row_split_share,
                "resident_bytes": p.resident_bytes(),
                "vram": p.vram,
                "predicted": p.predicted,
                "draft_on_gpu": i.draft_on_gpu,
            },
        })
        .to_string()
    }

    /// pipeshard's gauges in Prometheus text form.
    pub fn metrics_text(&self) -> String {
        let i = self.installed();
        let live = self.live();
        let plan = i.as_ref().map(|i| &i.plan);
        let per_tier = plan.map(|p| p.streamed_per_tier());
        let last = self.last_ubatch_tokens.load(Relaxed);
        let (tier, streamed) = match (&per_tier, last) {
            (Some(s), n) if n > 0 => s.batch(n.min(u32::MAX as u64) as u32),
            _ => (0, 0),
        };
        let peak = lock(&self.sampler)
            .as_ref()
            .map_or(0, |s| s.device_peak().load(Relaxed));
        // A plan across devices: its budgets' and resident weights' sums.
        let across = lock(&self.across).as_ref().map(|l| {
            let budget: u64 = l.budgets.iter().map(|b| b.bytes).sum();
            let resident: u64 = l.plan.parts.iter().map(|p| p.plan.resident_bytes()).sum();
            (budget, resident)
        });
        let rows: [(&str, &str, u64); 6] = [
            (
                "pipeshard_vram_budget_bytes",
                "VRAM budget in bytes (0: none).",
                live.as_ref()
                    .map(|s| s.budget)
                    .or_else(|| i.as_ref().map_or(self.budget, |i| i.budget))
                    .or(across.map(|(b, _)| b))
                    .unwrap_or(0),
            ),
            (
                "pipeshard_vram_used_bytes",
                "The process's device memory as NVML reports it (what nvidia-smi shows; without NVML, the GPU's memory in use), bytes.",
                gpu_used(),
            ),
            (
                "pipeshard_vram_peak_bytes",
                "Most device memory of the process (as pipeshard_vram_used_bytes) since the plan was installed, sampled every 20 ms, bytes.",
                peak,
            ),
            (
                "pipeshard_plan_resident_bytes",
                "Weight bytes the plan keeps in VRAM (across devices, on all of them; 0 without a plan).",
                plan.map_or(across.map_or(0, |(_, r)| r), |p| p.resident_bytes()),
            ),
            (
                "pipeshard_plan_tier",
                "Plan tier (ubatch tokens) of the last ubatch the scheduler placed; 0 without a plan.",
                tier as u64,
            ),
            (
                "pipeshard_plan_streamed_bytes_per_ubatch",
                "Weight bytes the plan streams to the GPU for a ubatch of the last tier.",
                streamed,
            ),
        ];
        let mut out = String::new();
        for (name, help, v) in rows {
            metric(&mut out, name, "gauge", help, v);
        }
        metric(
            &mut out,
            "pipeshard_plan_predicted_decode_tokens_per_second",
            "gauge",
            "Decode speed the plan in force predicts (0 without a plan).",
            plan.map_or(0.0, |p| p.predicted.decode_tok_s),
        );
        if let Some(live) = &live {
            out.push_str(&live_metrics(live));
        }
        if let Some(l) = lock(&self.across).as_ref() {
            out.push_str(&device_metrics(l));
        }
        metric(
            &mut out,
            "pipeshard_bytes_streamed_total",
            "counter",
            "Weight bytes copied from host memory to the GPU since the server started (streamed weights, or only the experts a MoE matmul used).",
            engine::weight_bytes_streamed(),
        );
        out
    }
}

/// One Prometheus metric in the text format: its help, its type and its
/// value.
fn metric(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
}

/// The live re-plan loop's metrics (`--vram-budget auto`).
pub fn live_metrics(s: &crate::launch::live::Snapshot) -> String {
    let mut out = String::new();
    let mut row = |name: &str, kind: &str, help: &str, v: String| metric(&mut out, name, kind, help, v);
    row(
        "pipeshard_vram_allowance_bytes",
        "gauge",
        "What the card leaves this process at the last sample: its memory less every other process's use and the headroom, bytes.",
        s.allowance.to_string(),
    );
    row(
        "pipeshard_replans_total",
        "counter",
        "Re-plans put in force by moving weights while serving.",
        s.replans.to_string(),
    );
    row(
        "pipeshard_replan_failures_total",
        "counter",
        "Migrations that failed (the plan before stayed in force).",
        s.failures.to_string(),
    );
    row(
        "pipeshard_plan_unfit",
        "gauge",
        "1 while even the smallest plan needs more than the allowance (serving goes on from the smallest plan).",
        (s.unfit as u8).to_string(),
    );
    row(
        "pipeshard_migration_last_seconds",
        "gauge",
        "Seconds the last migration of weights paused serving (for a promotion copied on the side, its pause).",
        format!("{:.6}", s.last_migration_s),
    );
    row(
        "pipeshard_migration_seconds_total",
        "counter",
        "Seconds all migrations of weights took.",
        format!("{:.6}", s.total_migration_s),
    );
    row(
        "pipeshard_promotion_staging",
        "gauge",
        "1 while a promotion's copies to the GPU run on the side (serving goes on under the plan in force).",
        (s.staging as u8).to_string(),
    );
    row(
        "pipeshard_promotions_total",
        "counter",
        "Promotions copied to the GPU on the side and committed between two batches.",
        s.promotions.to_string(),
    );
    row(
        "pipeshard_promotions_cancelled_total",
        "counter",
        "Staged promotions cancelled (their device memory freed) because the card changed again.",
        s.promotions_cancelled.to_string(),
    );
    row(
        "pipeshard_promotion_copy_last_seconds",
        "gauge",
        "Seconds the last promotion's copies took on the side, while serving went on.",
        format!("{:.6}", s.last_promotion_copy_s),
    );
    row(
        "pipeshard_promotion_pause_last_seconds",
        "gauge",
        "Seconds the last promotion paused serving between two batches (repointing the weights, reserving compute).",
        format!("{:.6}", s.last_promotion_pause_s),
    );
    row(
        "pipeshard_promotion_copy_seconds_total",
        "counter",
        "Seconds all promotions' copies took on the side.",
        format!("{:.6}", s.total_promotion_copy_s),
    );
    row(
        "pipeshard_promotion_pause_seconds_total",
        "counter",
        "Seconds all promotions paused serving.",
        format!("{:.6}", s.total_promotion_pause_s),
    );
    let name = "pipeshard_migrated_bytes_total";
    let _ = writeln!(
        out,
        "# HELP {name} Weight bytes moved by migrations, by destination.\n# TYPE {name} counter\n{name}{{to=\"host\"}} {}\n{name}{{to=\"device\"}} {}",
        s.bytes_to_host, s.bytes_to_device
    );
    metric(
        &mut out,
        "pipeshard_card_samples_total",
        "counter",
        "Samples of the card's memory the re-plan loop took.",
        s.samples,
    );
    out
}
