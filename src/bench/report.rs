//! Bench reports: markdown, CSV, JSON and an SVG chart.

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{Policy, PolicyResult};
use crate::plan::fmt_bytes;

/// What one `pipeshard bench` invocation measured with: the same for all
/// of its rows, written into each so that a row reads alone.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// The synth preset's name, else the GGUF's `general.name`, else its
    /// architecture.
    pub model: String,
    /// The MoE routing point (`calibrated`, `synthetic`, `uniform`) that
    /// `--routing` chose; null without it.
    pub routing: Option<String>,
    pub threads: i32,
    pub prompt_tokens: u32,
    pub gen_tokens: u32,
    /// The depth decode runs at (the prompt's length).
    pub depth: u32,
    /// The options given beyond the model and the output directory, and the
    /// environment variables of ggml, llama.cpp and pipeshard that were set.
    pub flags: String,
    /// The whole command line.
    pub command: String,
    /// pipeshard's commit at build time (`unknown` outside a git checkout).
    pub commit: String,
    /// The devices, as llama.cpp describes them.
    pub host: String,
}

/// One row of the summary: medians and spread of a policy at a budget.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchRow {
    pub policy: Policy,
    pub budget: u64,
    pub setting: String,
    /// The ubatch of the run's context (the plan's for pipeshard).
    #[serde(default)]
    pub ubatch: u32,
    /// The weights' quantization (`Q4_0`, `Q4_K_M`, ...).
    #[serde(default)]
    pub quant: Option<String>,
    /// Repetitions behind the medians.
    #[serde(default)]
    pub repetitions: u32,
    #[serde(deserialize_with = "nan_if_null")]
    pub ttft_s: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub ttft_min_s: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub ttft_max_s: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub decode_tok_s: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub decode_min: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub decode_max: f64,
    /// With `--tg`: decode as llama-bench's tg at the prompt's depth, the
    /// median of the repetitions (the summary's `decode_tok_s`).
    #[serde(default)]
    pub tg_tok_s: Option<f64>,
    pub peak_vram: u64,
    /// How `peak_vram` was measured (NVML's process figure where available).
    #[serde(default)]
    pub peak_source: Option<crate::engine::MemorySource>,
    /// Device bytes in llama.cpp's own buffers.
    #[serde(default)]
    pub llama_device_bytes: u64,
    /// The process's device memory at each step of the run.
    #[serde(default)]
    pub memory_steps: Vec<(String, u64)>,
    pub peak_rss: u64,
    pub over_budget: bool,
    pub predicted_ttft_s: Option<f64>,
    pub predicted_decode_tok_s: Option<f64>,
    pub error: Option<String>,
    /// The invocation's workload and settings.
    #[serde(default)]
    pub run: Option<RunInfo>,
    /// The routing llama.cpp selected (with a routing point on a MoE model).
    #[serde(default)]
    pub routing_stats: Option<super::routing_stats::RoutingStats>,
}

/// Failed rows carry NaN timings, which JSON writes as null; read them back as NaN.
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

impl BenchRow {
    /// Summarise one policy's result.
    pub fn from_result(r: &PolicyResult) -> BenchRow {
        let t: Vec<f64> = r.samples.iter().map(|s| s.ttft_s).collect();
        let d: Vec<f64> = r.samples.iter().map(|s| s.decode_tok_s).collect();
        let tg: Vec<f64> = r.samples.iter().filter_map(|s| s.tg_tok_s).collect();
        BenchRow {
            policy: r.policy,
            budget: r.budget,
            setting: r.setting.clone(),
            ubatch: r.ubatch,
            quant: r.quant.clone(),
            repetitions: r.samples.len() as u32,
            ttft_s: median(t.clone()),
            ttft_min_s: t.iter().cloned().fold(f64::INFINITY, f64::min),
            ttft_max_s: t.iter().cloned().fold(0.0, f64::max),
            decode_tok_s: median(d.clone()),
            decode_min: d.iter().cloned().fold(f64::INFINITY, f64::min),
            decode_max: d.iter().cloned().fold(0.0, f64::max),
            tg_tok_s: (!tg.is_empty()).then(|| median(tg)),
            peak_vram: r.peak_vram,
            peak_source: r.peak_source,
            llama_device_bytes: r.llama_device_bytes,
            memory_steps: r.memory_steps.clone(),
            peak_rss: r.peak_rss,
            over_budget: r.over_budget || (r.policy != Policy::FullGpu && r.peak_vram > r.budget),
            predicted_ttft_s: r.predicted.map(|p| p.ttft_s),
            predicted_decode_tok_s: r.predicted.map(|p| p.decode_tok_s),
            error: None,
            run: None,
            routing_stats: r.routing_stats,
        }
    }

    /// A policy that could not run at this budget.
    pub fn failed(policy: Policy, budget: u64, error: String) -> BenchRow {
        BenchRow {
            policy,
            budget,
            setting: String::new(),
            ubatch: 0,
            quant: None,
            repetitions: 0,
            ttft_s: f64::NAN,
            ttft_min_s: f64::NAN,
            ttft_max_s: f64::NAN,
            decode_tok_s: f64::NAN,
            decode_min: f64::NAN,
            decode_max: f64::NAN,
            tg_tok_s: None,
            peak_vram: 0,
            peak_source: None,
            llama_device_bytes: 0,
            memory_steps: Vec::new(),
            peak_rss: 0,
            over_budget: false,
            predicted_ttft_s: None,
            predicted_decode_tok_s: None,
            error: Some(error),
            run: None,
            routing_stats: None,
        }
    }

    fn valid(&self) -> bool {
        self.error.is_none() && !self.over_budget && self.ttft_s.is_finite()
    }
}

/// Best upstream (non-pipeshard, within budget) TTFT and decode at `budget`.
fn best_upstream(rows: &[BenchRow], budget: u64) -> (Option<f64>, Option<f64>) {
    let up = rows
        .iter()
        .filter(|r| r.budget == budget && !r.policy.is_pipeshard() && r.policy != Policy::FullGpu && r.valid());
    let ttft = up
        .clone()
        .map(|r| r.ttft_s)
        .fold(None, |a: Option<f64>, v| Some(a.map_or(v, |a| a.min(v))));
    let dec = up
        .map(|r| r.decode_tok_s)
        .fold(None, |a: Option<f64>, v| Some(a.map_or(v, |a| a.max(v))));
    (ttft, dec)
}

/// Write `bench.md`, `bench.csv`, `bench.json` and `bench.svg` into `dir`.
pub fn write_reports(dir: &Path, title: &str, command: &str, machine: &str, rows: &[BenchRow]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("bench.json"),
        serde_json::to_string_pretty(rows).unwrap_or_default(),
    )?;

    let mut csv = String::from("policy,budget_bytes,setting,ttft_s,ttft_min_s,ttft_max_s,decode_tok_s,decode_min,decode_max,peak_vram_bytes,peak_rss_bytes,over_budget,predicted_ttft_s,predicted_decode_tok_s,error\n");
    for r in rows {
        let _ = writeln!(
            csv,
            "{:?},{},\"{}\",{:.4},{:.4},{:.4},{:.2},{:.2},{:.2},{},{},{},{},{},\"{}\"",
            r.policy,
            r.budget,
            r.setting.replace('"', "'").replace('\n', " "),
            r.ttft_s,
            r.ttft_min_s,
            r.ttft_max_s,
            r.decode_tok_s,
            r.decode_min,
            r.decode_max,
            r.peak_vram,
            r.peak_rss,
            r.over_budget,
            r.predicted_ttft_s.map_or(String::new(), |v| format!("{v:.4}")),
            r.predicted_decode_tok_s.map_or(String::new(), |v| format!("{v:.2}")),
            r.error.clone().unwrap_or_default().replace('"', "'").replace('\n', " ")
        );
    }
    std::fs::write(dir.join("bench.csv"), csv)?;

    let mut md = format!("# {title}\n\n- machine: {machine}\n- command: `{command}`\n\n");
    md.push_str("| budget | policy | setting | TTFT s (min–max) | decode tok/s (min–max) | peak VRAM (process) | llama.cpp buffers | peak RSS | predicted | vs best upstream |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        let (bt, bd) = best_upstream(rows, r.budget);
        let ratio = if r.policy == Policy::Pipeshard && r.valid() {
            format!(
                "TTFT {}, decode {}",
                bt.map_or("-".into(), |b| format!("{:.2}x", b / r.ttft_s)),
                bd.map_or("-".into(), |b| format!("{:.2}x", r.decode_tok_s / b))
            )
        } else {
            String::new()
        };
        let status = match (&r.error, r.over_budget) {
            (Some(e), _) => format!("failed: {e}"),
            (None, true) => "**over budget**".into(),
            _ => String::new(),
        };
        let _ = writeln!(
            md,
            "| {} | {:?} | {} {} | {:.3} ({:.3}–{:.3}) | {:.1} ({:.1}–{:.1}) | {} | {} | {} | {} | {} |",
            fmt_bytes(r.budget),
            r.policy,
            r.setting,
            status,
            r.ttft_s,
            r.ttft_min_s,
            r.ttft_max_s,
            r.decode_tok_s,
            r.decode_min,
            r.decode_max,
            fmt_bytes(r.peak_vram),
            fmt_bytes(r.llama_device_bytes),
            fmt_bytes(r.peak_rss),
            match (r.predicted_ttft_s, r.predicted_decode_tok_s) {
                (Some(t), Some(d)) => format!("{t:.3} s / {d:.1} tok/s"),
                _ => String::new(),
            },
            ratio
        );
    }
    md.push_str("\nA policy whose measured peak VRAM exceeds the budget is marked over budget and never counts as the best upstream policy.\n");
    std::fs::write(dir.join("bench.md"), md)?;
    std::fs::write(dir.join("bench.svg"), svg(title, rows))?;
    Ok(())
}

/// Two bar charts (TTFT, decode tok/s) grouped by budget.
fn svg(title: &str, rows: &[BenchRow]) -> String {
    let mut budgets: Vec<u64> = rows.iter().map(|r| r.budget).collect();
    budgets.sort_unstable();
    budgets.dedup();
    let policies = [
        Policy::Pipeshard,
        Policy::PipeshardSync,
        Policy::PipeshardExact,
        Policy::Fit,
        Policy::Ngl,
        Policy::AttnGpu,
        Policy::FullGpu,
    ];
    let colors = [
        "#d62728", "#ff9896", "#e377c2", "#1f77b4", "#2ca02c", "#9467bd", "#7f7f7f",
    ];
    let (w, h, pad) = (900.0, 360.0, 50.0);
    let mut s = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{}' font-family='sans-serif' font-size='12'>\n<text x='10' y='20' font-size='15'>{title}</text>\n",
        2.0 * h + 40.0
    );
    for (panel, (label, get)) in [
        (
            "TTFT (s, lower is better)",
            Box::new(|r: &BenchRow| r.ttft_s) as Box<dyn Fn(&BenchRow) -> f64>,
        ),
        (
            "decode tok/s (higher is better)",
            Box::new(|r: &BenchRow| r.decode_tok_s),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let y0 = 40.0 + panel as f64 * h;
        let vmax = rows
            .iter()
            .filter(|r| r.valid())
            .map(&get)
            .fold(0.0f64, f64::max)
            .max(1e-9);
        let _ = writeln!(s, "<text x='{pad}' y='{}'>{label}</text>", y0 + 12.0);
        let gw = (w - 2.0 * pad) / budgets.len().max(1) as f64;
        let bw = gw / (policies.len() as f64 + 1.0);
        for (bi, b) in budgets.iter().enumerate() {
            let gx = pad + bi as f64 * gw;
            let _ = writeln!(
                s,
                "<text x='{}' y='{}'>{}</text>",
                gx + gw / 3.0,
                y0 + h - 10.0,
                fmt_bytes(*b)
            );
            for (pi, p) in policies.iter().enumerate() {
                let Some(r) = rows.iter().find(|r| r.budget == *b && r.policy == *p) else {
                    continue;
                };
                if !r.valid() {
                    let _ = writeln!(
                        s,
                        "<text x='{}' y='{}' fill='#999'>x</text>",
                        gx + pi as f64 * bw + bw / 3.0,
                        y0 + h - 30.0
                    );
                    continue;
                }
                let v = get(r);
                let bh = (h - 70.0) * v / vmax;
                let _ = writeln!(
                    s,
                    "<rect x='{:.1}' y='{:.1}' width='{:.1}' height='{:.1}' fill='{}'><title>{:?}: {:.3}</title></rect><text x='{:.1}' y='{:.1}' font-size='10'>{:.2}</text>",
                    gx + pi as f64 * bw,
                    y0 + h - 25.0 - bh,
                    bw * 0.9,
                    bh,
                    colors[pi],
                    p,
                    v,
                    gx + pi as f64 * bw,
                    y0 + h - 28.0 - bh,
                    v
                );
            }
        }
    }
    for (pi, p) in policies.iter().enumerate() {
        let _ = writeln!(
            s,
            "<rect x='{}' y='{}' width='10' height='10' fill='{}'/><text x='{}' y='{}'>{:?}</text>",
            w - 150.0,
            30.0 + pi as f64 * 15.0,
            colors[pi],
            w - 135.0,
            39.0 + pi as f64 * 15.0,
            p
        );
    }
    s.push_str("</svg>\n");
    s
}
