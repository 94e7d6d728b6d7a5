//! `pipeshard bench`: pipeshard against upstream placement policies.

use std::path::PathBuf;

use anyhow::{Context as _, Result};

use pipeshard::bench::routing::RoutingPoint;
use pipeshard::bench::{self, BenchConfig, BenchRow, Policy, RunInfo};
use pipeshard::engine::{self, FlashAttention};
use pipeshard::plan;
use pipeshard_devtools::synth::NAME_PREFIX;

use pipeshard::launch::PipeshardOptions;

use super::plan::resolve_profile;
use super::GlobalArgs;

#[derive(clap::Args)]
pub struct BenchArgs {
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
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
    /// pipeshard's options; `--vram-budget` takes a comma-separated list
    /// (e.g. 2GiB,4GiB) and every policy runs at each.
    #[command(flatten)]
    pub options: PipeshardOptions,
    /// Upstream policies keep their CPU weights in llama.cpp's plain layout
    /// instead of repacking them (upstream's `--no-repack`).
    #[arg(long = "no-repack")]
    pub no_repack: bool,
    /// The ubatch of pipeshard's plan; default: the planner's choice.
    #[arg(long = "plan-ubatch")]
    pub plan_ubatch: Option<u32>,
    /// Take each token's argmax on the host from the logits, instead of in
    /// the graph where the logits are computed (llama.cpp's backend
    /// sampling, which copies back one token id): the loop before issue 16.
    #[arg(long = "host-argmax")]
    pub host_argmax: bool,
    /// Also measure decode as llama-bench's tg at the prompt's depth: its
    /// first repetition right after the prompt, the others from the
    /// prompt's cache without the prompt run again (as llama-bench restores
    /// its depth's state), so only the first rebuilds the decode graph.
    #[arg(long = "tg")]
    pub tg: bool,
    /// MoE routing, for benchmarks only: `synthetic` keeps the model's
    /// router as is (as without the option), `calibrated` drives each
    /// token's experts by a seeded routing model calibrated to real models'
    /// routing, `uniform` draws them uniformly (no locality). The router is
    /// still computed; a MoE model's rows then also carry the routing
    /// llama.cpp selected, measured in one more, untimed, request.
    #[arg(long = "routing", value_name = "POINT")]
    pub routing: Option<RoutingPoint>,
}

pub fn bench_cmd(global: &GlobalArgs, args: BenchArgs) -> Result<()> {
    anyhow::ensure!(args.prompt > 0, "-p/--n-prompt must be at least 1 (the timed prompt)");
    anyhow::ensure!(args.ubatch > 0, "--ubatch-size must be at least 1");
    let (_, info) =
        pipeshard::gguf::inspect(&args.model).with_context(|| format!("reading {}", args.model.display()))?;
    anyhow::ensure!(
        args.routing.is_none() || info.is_moe(),
        "--routing applies to MoE models; {} has no routed experts",
        args.model.display()
    );
    engine::init(global.backend_dir.as_deref())?;
    let threads = args.threads.unwrap_or_else(engine::default_threads);
    let budgets: Vec<u64> = args
        .options
        .budgets()?
        .into_iter()
        .map(|b| b.resolve(args.options.headroom()))
        .collect::<Result<_, _>>()?;
    anyhow::ensure!(
        !budgets.is_empty(),
        "--vram-budget is required (one or more, comma-separated)"
    );
    anyhow::ensure!(
        args.options.plan.is_none(),
        "bench plans for each budget; it takes no --plan"
    );
    if args.policies.iter().any(|p| p.is_pipeshard()) {
        // Measured now (with a progress bar) if this machine has none yet.
        if let Err(e) = resolve_profile(&args.options, threads, &info) {
            eprintln!("bench: no profile for pipeshard's plan ({e:#}); its rows will fail");
        }
    }
    let cfg = BenchConfig {
        prompt_tokens: args.prompt,
        gen_tokens: args.gen,
        ubatch: args.ubatch,
        threads,
        repetitions: args.repetitions,
        flash_attention: FlashAttention::On,
        options: args.options.clone(),
        repack: !args.no_repack,
        plan_ubatch: args.plan_ubatch,
        host_argmax: args.host_argmax,
        tg: args.tg,
        routing: args.routing,
    };
    let machine = engine::list_devices()
        .iter()
        .map(|d| d.description.clone())
        .collect::<Vec<_>>()
        .join(" + ");
    let argv: Vec<String> = std::env::args().collect();
    let run = RunInfo {
        model: model_name(&info),
        routing: args.routing.map(|p| p.name().to_string()),
        threads,
        prompt_tokens: args.prompt,
        gen_tokens: args.gen,
        depth: args.prompt,
        flags: flags(&argv),
        command: argv.join(" "),
        commit: env!("PIPESHARD_COMMIT").to_string(),
        host: machine.clone(),
    };
    let mut rows = Vec::new();
    for &b in &budgets {
        for &p in &args.policies {
            eprintln!(
                "bench: {} at {} ...",
                serde_json::to_string(&p)?.trim_matches('"'),
                plan::fmt_bytes(b)
            );
            match bench::run_policy(&args.model, &info, p, b, &cfg) {
                Ok(r) => {
                    let row = BenchRow {
                        run: Some(run.clone()),
                        ..BenchRow::from_result(&r)
                    };
                    eprintln!(
                        "  {}: TTFT {:.3} s, decode {:.1} tok/s, peak VRAM {}{}",
                        row.setting,
                        row.ttft_s,
                        row.decode_tok_s,
                        plan::fmt_bytes(row.peak_vram),
                        if row.over_budget { " (OVER BUDGET)" } else { "" }
                    );
                    if let Some(tg) = row.tg_tok_s {
                        eprintln!(
                            "  tg{} @ d{} as llama-bench measures it: {tg:.1} tok/s (median of {})",
                            args.gen, args.prompt, row.repetitions
                        );
                    }
                    if let Some(s) = &row.routing_stats {
                        eprintln!(
                            "  routing selected (medians over {} layers): reuse {:.1}%, LRU hits {:.1}% at 12.5% and {:.1}% at 25% of experts, {} experts for 90% of selections, top expert {:.1}%",
                            s.layers,
                            s.reuse * 100.0,
                            s.lru_hit_12_5 * 100.0,
                            s.lru_hit_25 * 100.0,
                            s.experts_90,
                            s.top_share * 100.0
                        );
                    }
                    if !row.memory_steps.is_empty() {
                        let steps: Vec<String> = row
                            .memory_steps
                            .iter()
                            .map(|(label, b)| format!("{label} {}", plan::fmt_bytes(*b)))
                            .collect();
                        eprintln!(
                            "  process VRAM: {}; llama.cpp's buffers {}",
                            steps.join(", "),
                            plan::fmt_bytes(row.llama_device_bytes)
                        );
                    }
                    rows.push(row);
                }
                Err(e) => {
                    eprintln!("  failed: {e}");
                    rows.push(BenchRow {
                        run: Some(run.clone()),
                        ..BenchRow::failed(p, b, e.to_string())
                    });
                }
            }
        }
    }
    let title = format!(
        "{} ({}), prompt {} + {} generated",
        info.name.clone().unwrap_or(info.architecture.clone()),
        args.model.display(),
        args.prompt,
        args.gen
    );
    bench::write_reports(&args.out, &title, &run.command, &machine, &rows)?;
    eprintln!("reports written to {}", args.out.display());
    Ok(())
}

/// The model's name in the summary: a synth preset's own name, else
/// `general.name`, else the architecture.
fn model_name(info: &pipeshard::gguf::ModelInfo) -> String {
    match &info.name {
        Some(n) => n.strip_prefix(NAME_PREFIX).unwrap_or(n).to_string(),
        None => info.architecture.clone(),
    }
}

/// Environment variables that change what ggml, llama.cpp or pipeshard do.
const FLAG_ENV_PREFIXES: &[&str] = &["GGML_", "LLAMA_", "PIPESHARD_", "CUDA_", "OMP_"];

/// The options after `bench` except the model and the output directory,
/// after the environment variables of [`FLAG_ENV_PREFIXES`] that are set.
fn flags(args: &[String]) -> String {
    let mut out: Vec<String> = std::env::vars()
        .filter(|(k, _)| FLAG_ENV_PREFIXES.iter().any(|p| k.starts_with(p)) && k != "PIPESHARD_TEST_PYTHONPATH")
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    out.sort();
    let mut it = args.iter().skip_while(|a| *a != "bench").skip(1);
    while let Some(a) = it.next() {
        let name = a.split('=').next().unwrap_or(a);
        if ["-m", "--model", "-o", "--out"].contains(&name) {
            if !a.contains('=') {
                it.next();
            }
            continue;
        }
        out.push(a.clone());
    }
    out.join(" ")
}
