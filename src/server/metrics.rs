//! Server counters and their Prometheus text form (`GET /metrics`), with
//! upstream's `llamacpp:` names plus pipeshard's own gauges.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Counters shared by the HTTP handlers and the slot worker.
#[derive(Debug, Default)]
pub struct Metrics {
    pub prompt_tokens_total: AtomicU64,
    pub prompt_us_total: AtomicU64,
    pub tokens_predicted_total: AtomicU64,
    pub predicted_us_total: AtomicU64,
    pub n_decode_total: AtomicU64,
    pub n_busy_slots_total: AtomicU64,
    pub requests_processing: AtomicU64,
    pub requests_deferred: AtomicU64,
    pub n_tokens_max: AtomicU64,
    /// pipeshard: the VRAM budget (0: none).
    pub vram_budget_bytes: AtomicU64,
    /// pipeshard: bytes in non-host buffers (weights, KV, compute).
    pub vram_used_bytes: AtomicU64,
    /// pipeshard: the most device memory in use since the server started,
    /// above the level before the model was loaded (sampled every 10 ms).
    pub vram_peak_bytes: std::sync::OnceLock<std::sync::Arc<AtomicU64>>,
    /// pipeshard: the plan tier of the last ubatch (0 without a plan).
    pub plan_tier: AtomicU64,
    /// pipeshard: weight bytes streamed host→device, as the plan streams them.
    pub bytes_streamed_total: AtomicU64,
}

impl Metrics {
    /// Record a finished request's prompt and generation work.
    pub fn record(&self, prompt_tokens: u64, prompt_ms: f64, predicted: u64, predicted_ms: f64) {
        self.prompt_tokens_total.fetch_add(prompt_tokens, Relaxed);
        self.prompt_us_total.fetch_add((prompt_ms * 1e3) as u64, Relaxed);
        self.tokens_predicted_total.fetch_add(predicted, Relaxed);
        self.predicted_us_total.fetch_add((predicted_ms * 1e3) as u64, Relaxed);
    }

    /// Record a decoded batch of `n_tokens` under a plan that streams `streamed`.
    pub fn record_batch(&self, streamed: Option<&crate::plan::StreamedPerTier>, n_tokens: usize) {
        if let Some(streamed) = streamed {
            let (tier, bytes) = streamed.batch(n_tokens.min(u32::MAX as usize) as u32);
            self.plan_tier.store(tier as u64, Relaxed);
            self.bytes_streamed_total.fetch_add(bytes, Relaxed);
        }
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        let g = |a: &AtomicU64| a.load(Relaxed);
        let prompt_s = g(&self.prompt_us_total) as f64 / 1e6;
        let pred_s = g(&self.predicted_us_total) as f64 / 1e6;
        let n_decode = g(&self.n_decode_total);
        let rows: [(&str, &str, &str, f64); 16] = [
            (
                "llamacpp:prompt_tokens_total",
                "counter",
                "Number of prompt tokens processed.",
                g(&self.prompt_tokens_total) as f64,
            ),
            (
                "llamacpp:prompt_seconds_total",
                "counter",
                "Prompt process time",
                prompt_s,
            ),
            (
                "llamacpp:tokens_predicted_total",
                "counter",
                "Number of generation tokens processed.",
                g(&self.tokens_predicted_total) as f64,
            ),
            (
                "llamacpp:tokens_predicted_seconds_total",
                "counter",
                "Predict process time",
                pred_s,
            ),
            (
                "llamacpp:n_decode_total",
                "counter",
                "Total number of llama_decode() calls",
                n_decode as f64,
            ),
            (
                "llamacpp:n_busy_slots_per_decode",
                "counter",
                "Average number of busy slots per llama_decode() call",
                if n_decode > 0 {
                    g(&self.n_busy_slots_total) as f64 / n_decode as f64
                } else {
                    0.0
                },
            ),
            (
                "llamacpp:prompt_tokens_seconds",
                "gauge",
                "Average prompt throughput in tokens/s.",
                if prompt_s > 0.0 {
                    g(&self.prompt_tokens_total) as f64 / prompt_s
                } else {
                    0.0
                },
            ),
            (
                "llamacpp:predicted_tokens_seconds",
                "gauge",
                "Average generation throughput in tokens/s.",
                if pred_s > 0.0 {
                    g(&self.tokens_predicted_total) as f64 / pred_s
                } else {
                    0.0
                },
            ),
            (
                "llamacpp:requests_processing",
                "gauge",
                "Number of requests processing.",
                g(&self.requests_processing) as f64,
            ),
            (
                "llamacpp:requests_deferred",
                "gauge",
                "Number of requests deferred.",
                g(&self.requests_deferred) as f64,
            ),
            (
                "llamacpp:n_tokens_max",
                "counter",
                "Largest observed n_tokens.",
                g(&self.n_tokens_max) as f64,
            ),
            (
                "pipeshard_vram_budget_bytes",
                "gauge",
                "VRAM budget in bytes (0: none).",
                g(&self.vram_budget_bytes) as f64,
            ),
            (
                "pipeshard_vram_used_bytes",
                "gauge",
                "Bytes held in device (non-host) buffers.",
                g(&self.vram_used_bytes) as f64,
            ),
            (
                "pipeshard_vram_peak_bytes",
                "gauge",
                "Most device memory in use since the model was loaded (sampled), bytes.",
                self.vram_peak_bytes.get().map_or(0, |p| p.load(Relaxed)) as f64,
            ),
            (
                "pipeshard_plan_tier",
                "gauge",
                "Plan tier (ubatch tokens) of the last ubatch; 0 without a plan.",
                g(&self.plan_tier) as f64,
            ),
            (
                "pipeshard_bytes_streamed_total",
                "counter",
                "Weight bytes streamed to the device, as the plan streams them per ubatch.",
                g(&self.bytes_streamed_total) as f64,
            ),
        ];
        let mut out = String::new();
        for (name, kind, help, v) in rows {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
        }
        out
    }
}
