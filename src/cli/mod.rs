//! Subcommands of the `pipeshard` binary.

mod bench;
mod fuzz;
mod fuzz_http;
mod lossless;
mod plan;
mod plan_devices;
mod results;
mod rpc;
mod run;
mod serve;
mod synth;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// VRAM-budgeted, lossless LLM and VLM inference around llama.cpp.
#[derive(Parser)]
#[command(name = "pipeshard", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    global: GlobalArgs,
}

/// Options every subcommand takes.
#[derive(clap::Args, Clone)]
pub struct GlobalArgs {
    /// Directory with ggml backend modules (libggml-cpu.so, libggml-cuda.so).
    #[arg(long, global = true, env = "PIPESHARD_BACKEND_DIR")]
    pub backend_dir: Option<PathBuf>,
    /// More log output (-v: info from llama.cpp, -vv: everything).
    #[arg(short = 'v', long = "verbose", global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt and report load time, TTFT and tokens/s.
    Run(run::RunArgs),
    /// Show where each weight goes per token tier under a VRAM budget, and the predicted speed.
    Plan(plan::PlanArgs),
    /// Measure this machine (CPU, GPU, link) for the planner.
    Profile(plan::ProfileArgs),
    /// Write a random-weight GGUF with a real model's shapes.
    Synth(synth::SynthArgs),
    /// Benchmark pipeshard's plan against upstream placement policies.
    Bench(bench::BenchArgs),
    /// llama.cpp's own server (llama-server's flags), with pipeshard's plan installed at load.
    Serve(serve::ServeArgs),
    /// Fuzz the model-file path: mutated GGUFs through the full load, crashes and hangs kept.
    #[command(name = "fuzz-gguf")]
    FuzzGguf(fuzz::FuzzArgs),
    /// Fuzz pipeshard-server over HTTP (every endpoint and field), or soak it, or measure its shutdown.
    #[command(name = "fuzz-http")]
    FuzzHttp(fuzz_http::FuzzHttpArgs),
    /// Compare greedy generation under a plan with the full-GPU placement (tokens, max |logit diff|).
    Lossless(lossless::LosslessArgs),
    /// The results summary (bench/results/summary.json): add a row, render SUMMARY.md.
    Results(results::ResultsArgs),
}

/// llama.cpp's multi-letter short flags, spelled as our long ones.
const LLAMA_SHORT_FLAGS: &[(&str, &str)] = &[
    ("-ngl", "--n-gpu-layers"),
    ("-ub", "--ubatch-size"),
    ("-fa", "--flash-attn"),
    ("-np", "--parallel"),
    ("-md", "--spec-draft-model"),
    ("-ngld", "--spec-draft-ngl"),
];

/// Accept `-ngl 99` and `-ngl=99` as llama.cpp users type them.
fn normalize_args(args: impl Iterator<Item = String>) -> Vec<String> {
    args.map(|a| {
        for (short, long) in LLAMA_SHORT_FLAGS {
            if a == *short {
                return long.to_string();
            }
            if let Some(v) = a.strip_prefix(&format!("{short}=")) {
                return format!("{long}={v}");
            }
        }
        a
    })
    .collect()
}

/// Parse the command line, run it, and map errors (a bad option among
/// them) to exit code 1.
pub fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    // `serve` hands its arguments to llama-server as they are.
    let parsed = if args.get(1).map(String::as_str) == Some("serve") {
        Cli::try_parse_from(args)
    } else {
        Cli::try_parse_from(normalize_args(args.into_iter()))
    };
    let cli = match parsed {
        Ok(cli) => cli,
        // clap's message; a bad option exits 1 in every tool, as
        // llama-server does (help and version are not errors)
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    if let Command::Serve(args) = cli.command {
        return serve::run(&cli.global, args);
    }
    pipeshard::logging::init(cli.global.verbose);
    let result = match cli.command {
        Command::Run(args) => run::run(&cli.global, args),
        Command::Plan(args) => plan::plan_cmd(&cli.global, args),
        Command::Profile(args) => plan::profile_cmd(&cli.global, args),
        Command::Synth(args) => synth::synth_cmd(args),
        Command::Bench(args) => bench::bench_cmd(&cli.global, args),
        Command::Serve(_) => unreachable!("serve returned above"),
        Command::Lossless(args) => lossless::lossless_cmd(&cli.global, args),
        Command::FuzzGguf(args) => fuzz::fuzz_cmd(&cli.global, args),
        Command::FuzzHttp(args) => fuzz_http::fuzz_http_cmd(&cli.global, args),
        Command::Results(args) => results::results_cmd(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
