//! `pipeshard bench`: pipeshard against upstream placement policies.

use std::path::PathBuf;

use anyhow::{Context as _, Result};

use pipeshard::bench::{self, BenchConfig, BenchRow, Policy};
use pipeshard::engine::{self, FlashAttention};
use pipeshard::plan;

use super::plan::{resolve_profile, BudgetArgs};
use super::GlobalArgs;

#[derive(clap::Args)]
pub struct BenchArgs {
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// Comma-separated budgets, e.g. 2GiB,4GiB.
    #[arg(long = "vram-budget")]
    pub budgets: String,
    /// Prompt tokens (random tokens).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 4096)]
    pub prompt: u32,
    /// Generated tokens, decoded at the prompt's depth.
    #[arg(short = 'n', long = "n-gen", default_value_t = 64)]
    pub gen: u32,
    /// ubatch size for the upstream policies (pipeshard chooses its own).
    #[arg(long = "ubatch-size", visible_alias = "ub", default_value_t = 4096)]
    pub ubatch: u32,
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    pub repetitions: u32,
    #[arg(
        long = "policies",
        value_delimiter = ',',
        default_value = "pipeshard,fit,ngl,attn-gpu"
    )]
    pub policies: Vec<Policy>,
    #[arg(short = 't', long = "threads")]
    pub threads: Option<i32>,
    /// Directory for bench.md, bench.csv, bench.json and bench.svg.
    #[arg(short = 'o', long = "out", default_value = "bench-out")]
    pub out: PathBuf,
    #[arg(long = "profile")]
    pub profile: Option<PathBuf>,
    /// Streaming slots of pipeshard's plan (0: synchronous copies).
    #[arg(long = "stream-slots", default_value_t = pipeshard::plan::DEFAULT_STREAM_SLOTS,
          value_parser = clap::value_parser!(u32).range(0..=8))]
    pub stream_slots: u32,
    /// Upstream policies keep their CPU weights in llama.cpp's plain layout
    /// instead of repacking them (upstream's `--no-repack`).
    #[arg(long = "no-repack")]
    pub no_repack: bool,
    /// Hybrid experts in pipeshard's plan: how many of each token's routed
    /// experts the GPU computes in decode (0: off); default: the planner's choice.
    #[arg(long = "hybrid-experts")]
    pub hybrid_experts: Option<u32>,
    /// The ubatch of pipeshard's plan; default: the planner's choice.
    #[arg(long = "plan-ubatch")]
    pub plan_ubatch: Option<u32>,
}

pub fn bench_cmd(global: &GlobalArgs, args: BenchArgs) -> Result<()> {
    let (_, info) =
        pipeshard::gguf::inspect(&args.model).with_context(|| format!("reading {}", args.model.display()))?;
    engine::init(global.backend_dir.as_deref())?;
    let threads = args.threads.unwrap_or_else(engine::default_threads);
    let budgets: Vec<u64> = args
        .budgets
        .split(',')
        .map(plan::parse_bytes)
        .collect::<Result<_, _>>()?;
    let profile = if args.policies.iter().any(|p| p.is_pipeshard()) {
        let b = BudgetArgs {
            vram_budget: None,
            profile: args.profile.clone(),
            plan: None,
            stream_slots: pipeshard::plan::DEFAULT_STREAM_SLOTS,
            hybrid_experts: None,
        };
        match resolve_profile(&b, threads) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("bench: no profile for pipeshard's plan ({e:#}); its rows will fail");
                None
            }
        }
    } else {
        None
    };
    let cfg = BenchConfig {
        prompt_tokens: args.prompt,
        gen_tokens: args.gen,
        ubatch: args.ubatch,
        threads,
        repetitions: args.repetitions,
        flash_attention: FlashAttention::On,
        stream_slots: args.stream_slots,
        repack: !args.no_repack,
        hybrid_gpu_experts: args.hybrid_experts,
        plan_ubatch: args.plan_ubatch,
    };
    let mut rows = Vec::new();
    for &b in &budgets {
        for &p in &args.policies {
            eprintln!(
                "bench: {} at {} ...",
                serde_json::to_string(&p)?.trim_matches('"'),
                plan::fmt_bytes(b)
            );
            match bench::run_policy(&args.model, &info, profile.as_ref(), p, b, &cfg) {
                Ok(r) => {
                    let row = BenchRow::from_result(&r);
                    eprintln!(
                        "  {}: TTFT {:.3} s, decode {:.1} tok/s, peak VRAM {}{}",
                        row.setting,
                        row.ttft_s,
                        row.decode_tok_s,
                        plan::fmt_bytes(row.peak_vram),
                        if row.over_budget { " (OVER BUDGET)" } else { "" }
                    );
                    rows.push(row);
                }
                Err(e) => {
                    eprintln!("  failed: {e}");
                    rows.push(BenchRow::failed(p, b, e.to_string()));
                }
            }
        }
    }
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let machine = engine::list_devices()
        .iter()
        .map(|d| d.description.clone())
        .collect::<Vec<_>>()
        .join(" + ");
    let title = format!(
        "{} ({}), prompt {} + {} generated",
        info.name.clone().unwrap_or(info.architecture.clone()),
        args.model.display(),
        args.prompt,
        args.gen
    );
    bench::write_reports(&args.out, &title, &command, &machine, &rows)?;
    eprintln!("reports written to {}", args.out.display());
    Ok(())
}
