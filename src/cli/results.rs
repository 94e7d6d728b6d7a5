//! `pipeshard results`: the results summary (developer tooling for the
//! reference harness): add a row from benchmark outputs, render SUMMARY.md.

use std::path::PathBuf;

use anyhow::{Context as _, Result};

use pipeshard::plan;
use pipeshard::results::{self, render, source, Summary, Upsert};

#[derive(clap::Args)]
pub struct ResultsArgs {
    #[command(subcommand)]
    command: ResultsCommand,
}

#[derive(clap::Subcommand)]
enum ResultsCommand {
    /// Add a row from one output file per repetition, or replace the row with its key.
    Add(Box<AddArgs>),
    /// Write SUMMARY.md: tables by call and case, and one chart.
    Render(RenderArgs),
}

#[derive(clap::Args)]
struct AddArgs {
    /// The summary to update (created if missing).
    #[arg(long, default_value = "bench/results/summary.json")]
    summary: PathBuf,
    /// The run on the GPU host (date and a letter, e.g. 2026-s25-d).
    #[arg(long)]
    call: String,
    /// R1..R5 for the reference cases, else a short name.
    #[arg(long)]
    case: String,
    /// pipeshard, upstream-fit, upstream-full, upstream-ncmoe-N, upstream-cpu-moe, ...
    #[arg(long)]
    system: String,
    /// bench, run or server.
    #[arg(long, default_value = "bench")]
    entry: String,
    /// The program that wrote the files.
    #[arg(long = "from", value_enum)]
    from: source::Format,
    /// MoE routing point: calibrated, synthetic or uniform.
    #[arg(long)]
    routing: Option<String>,
    /// The budget (e.g. 2GiB); for pipeshard bench files also which of their rows.
    #[arg(long, value_parser = parse_size)]
    budget: Option<u64>,
    /// Every non-default flag and environment variable set (default: the files').
    #[arg(long)]
    flags: Option<String>,
    /// The exact command line of one repetition (required for llama-bench).
    #[arg(long)]
    command: Option<String>,
    /// The raw logs of the row, from the repository root (bench/results/raw/CALL or a file in it).
    #[arg(long)]
    raw: Option<String>,
    /// GPU, CPU, PCIe, driver (default: what the files say).
    #[arg(long)]
    host: Option<String>,
    /// The process's device memory peak of each repetition, measured outside
    /// the program (the row takes the largest): comma-separated, or the
    /// option repeated.
    #[arg(long = "peak-bytes", value_delimiter = ',')]
    peak_bytes: Vec<u64>,
    /// The model's name (default: the files').
    #[arg(long)]
    model: Option<String>,
    /// The quantization (default: the files').
    #[arg(long)]
    quant: Option<String>,
    /// What was chosen, in words (default: the files').
    #[arg(long)]
    setting: Option<String>,
    /// The project commit (default: the files', or this build's for llama-bench).
    #[arg(long)]
    commit: Option<String>,
    #[arg(long, default_value_t = 1)]
    devices: u32,
    #[arg(long, default_value_t = 1)]
    clients: u32,
    /// A remark a reader needs to read the figures right.
    #[arg(long)]
    note: Option<String>,
    /// One output file per repetition.
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

#[derive(clap::Args)]
struct RenderArgs {
    #[arg(long, default_value = "bench/results/summary.json")]
    summary: PathBuf,
    #[arg(short = 'o', long = "out", default_value = "bench/results/SUMMARY.md")]
    out: PathBuf,
}

fn parse_size(s: &str) -> Result<u64, String> {
    plan::parse_bytes(s).map_err(|e| e.to_string())
}

pub fn results_cmd(args: ResultsArgs) -> Result<()> {
    match args.command {
        ResultsCommand::Add(a) => add(*a),
        ResultsCommand::Render(a) => {
            let summary = Summary::load(&a.summary)?;
            results::write_atomic(&a.out, &render::markdown(&summary.rows))?;
            eprintln!("{} rows rendered to {}", summary.rows.len(), a.out.display());
            Ok(())
        }
    }
}

fn add(a: AddArgs) -> Result<()> {
    let opts = source::AddOptions {
        call: a.call,
        case: a.case,
        system: a.system,
        entry: a.entry,
        format: a.from,
        routing: a.routing,
        budget: a.budget,
        flags: a.flags,
        command: a.command,
        raw: a.raw,
        host: a.host,
        peak_bytes: a.peak_bytes,
        model: a.model,
        quant: a.quant,
        setting: a.setting,
        commit: a.commit,
        devices: a.devices,
        clients: a.clients,
        note: a.note,
    };
    let row = source::row_from_files(&a.files, &opts)?;
    let mut summary = Summary::load(&a.summary)?;
    let what = match summary.upsert(row) {
        Upsert::Replaced => "replaced",
        Upsert::Appended => "appended",
    };
    summary
        .save(&a.summary)
        .with_context(|| format!("updating {}", a.summary.display()))?;
    eprintln!("row {what} in {}", a.summary.display());
    Ok(())
}
