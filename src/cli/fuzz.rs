//! `pipeshard fuzz-gguf`: structure-aware fuzzing of the model-file path,
//! through `pipeshard run` or (`--server`) the server's start-up.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};

use pipeshard::{default_model, progress};
use pipeshard_devtools::fuzz::{self, FuzzOptions, CASE_PLACEHOLDER, PORT_PLACEHOLDER};
use pipeshard_devtools::synth::{self, Quant, SynthOptions};

use super::GlobalArgs;

/// Tiny synthetic models mutated by default: dense llama and qwen3, a
/// qwen3 MoE, qwen2-VL's M-RoPE, and a Tekken vocabulary.
pub const DEFAULT_PRESETS: &str =
    "tiny-llama3.2-1b,tiny-qwen3-0.6b,tiny-qwen3-30b-a3b,tiny-qwen2.5-vl-7b,tiny-mistral-nemo-minitron-8b";

/// Which cases of which seed a fuzzer runs (`fuzz-gguf` and `fuzz-http`).
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct CaseRange {
    /// Seed of the run: the same seed gives the same cases.
    #[arg(long = "seed", default_value_t = 1)]
    pub seed: u64,
    /// Number of cases.
    #[arg(long = "cases", default_value_t = 1000)]
    pub cases: u64,
    /// Number of the first case (with --cases 1: replay one case).
    #[arg(long = "first-case", default_value_t = 0)]
    pub first_case: u64,
}

#[derive(clap::Args)]
pub struct FuzzArgs {
    #[command(flatten)]
    pub range: CaseRange,
    /// Cases run in parallel.
    #[arg(short = 'j', long = "jobs", default_value_t = 1)]
    pub jobs: usize,
    /// Synth presets to mutate (comma-separated; empty for none).
    #[arg(long = "presets", default_value = DEFAULT_PRESETS)]
    pub presets: String,
    /// Also mutate these GGUF files.
    #[arg(long = "seed-file")]
    pub seed_files: Vec<PathBuf>,
    /// Do not mutate the default model (SmolLM2-135M-Instruct).
    #[arg(long = "no-default-model")]
    pub no_default_model: bool,
    /// The largest seed file (the default model) is mutated in one case of N.
    #[arg(long = "largest-one-in", default_value_t = 8)]
    pub largest_one_in: usize,
    /// Scratch directory; failing cases are kept in failures/ below it.
    #[arg(long = "work-dir")]
    pub work_dir: Option<PathBuf>,
    /// Seconds after which a load is a hang.
    #[arg(long = "timeout-s", default_value_t = 60)]
    pub timeout_s: u64,
    /// Address-space limit of each load in MiB (0: none).
    #[arg(long = "mem-limit-mib", default_value_t = 8192)]
    pub mem_limit_mib: u64,
    /// Count the cases pipeshard's checks reject in-process without running
    /// them through the child (faster; the child would run the same checks).
    #[arg(long = "skip-rejected")]
    pub skip_rejected: bool,
    /// Load each case by starting the server (`pipeshard serve`) on it,
    /// instead of `pipeshard run`: loaded means healthy.
    #[arg(long = "server")]
    pub server: bool,
    /// With --server: the server plans for this budget (e.g. 1GiB).
    #[arg(long = "vram-budget", requires = "server")]
    pub vram_budget: Option<String>,
    /// Print the report as JSON on stdout.
    #[arg(long = "json")]
    pub json: bool,
}

/// `pipeshard run` on the case for one token, on the CPU.
const RUN_LOADER: &[&str] = &[
    "run",
    "-m",
    CASE_PLACEHOLDER,
    "-p",
    "Hello",
    "-n",
    "1",
    "-c",
    "128",
    "-b",
    "64",
    "--ubatch-size",
    "64",
    "-t",
    "1",
    "--n-gpu-layers",
    "0",
    "--quiet",
];

/// The server started on the case, on the CPU (with its warm-up decode).
const SERVER_LOADER: &[&str] = &[
    "serve",
    "-m",
    CASE_PLACEHOLDER,
    "--host",
    "127.0.0.1",
    "--port",
    PORT_PLACEHOLDER,
    "-c",
    "128",
    "-b",
    "64",
    "-ub",
    "64",
    "-t",
    "1",
    "-ngl",
    "0",
    "-np",
    "1",
];

pub fn fuzz_cmd(global: &GlobalArgs, args: FuzzArgs) -> Result<()> {
    let work_dir = args
        .work_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("pipeshard-fuzz-gguf-{}", args.range.seed)));
    let seeds_dir = work_dir.join("seeds");
    std::fs::create_dir_all(&seeds_dir).with_context(|| format!("creating {}", seeds_dir.display()))?;

    let mut seed_files = args.seed_files.clone();
    for preset in args.presets.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let path = seeds_dir.join(format!("{preset}-q4_0.gguf"));
        if !path.is_file() {
            let mut opts = SynthOptions::new(preset, Quant::Q4_0, &path);
            opts.threads = args.jobs.max(1);
            synth::synth(&opts, |_, _| {}).with_context(|| format!("writing the {preset} seed"))?;
        }
        seed_files.push(path);
    }
    if !args.no_default_model {
        seed_files.push(default_model::ensure().context("fetching the default model")?);
    }

    let exe = std::env::current_exe().context("locating the pipeshard binary")?;
    let mut loader: Vec<OsString> = vec![exe.into_os_string()];
    if let Some(d) = &global.backend_dir {
        loader.push("--backend-dir".into());
        loader.push(d.clone().into_os_string());
    }
    loader.extend(
        if args.server { SERVER_LOADER } else { RUN_LOADER }
            .iter()
            .map(OsString::from),
    );
    if let Some(b) = &args.vram_budget {
        loader.extend(["--vram-budget".into(), b.into()]);
    }

    let opts = FuzzOptions {
        seed: args.range.seed,
        first_case: args.range.first_case,
        cases: args.range.cases,
        jobs: args.jobs.max(1),
        seed_files,
        largest_one_in: args.largest_one_in,
        loader,
        work_dir: work_dir.clone(),
        timeout: Duration::from_secs(args.timeout_s),
        mem_limit_mib: args.mem_limit_mib,
        skip_rejected: args.skip_rejected,
        server: args.server,
    };
    let bar = progress::steps_bar(args.range.cases, "fuzz-gguf");
    let report = fuzz::run(&opts, |c| {
        bar.set_position(c.cases);
        bar.set_message(format!("{} failures", c.failures()));
    })?;
    bar.finish_and_clear();
    let c = &report.counts;
    eprintln!(
        "fuzz-gguf seed {}: {} cases in {:.0} s: {} rejected by pipeshard's checks, {} rejected cleanly by llama.cpp, {} loaded, {} signals, {} hangs, {} other failures",
        report.seed,
        c.cases,
        report.seconds,
        c.rejected_by_pipeshard,
        c.rejected_by_llama,
        c.loaded,
        c.signals,
        c.hangs,
        c.other_failures
    );
    for f in &report.failures {
        eprintln!(
            "  case {}: {} ({}), kept in {}",
            f.case,
            f.outcome,
            f.mutations.join("; "),
            f.file.display()
        );
    }
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    if c.failures() > 0 {
        anyhow::bail!(
            "{} of {} cases crashed, hung or failed uncleanly",
            c.failures(),
            c.cases
        );
    }
    Ok(())
}
