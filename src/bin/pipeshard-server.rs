//! `pipeshard-server`: a drop-in replacement for `llama-server`. Takes the
//! same flags and `LLAMA_ARG_*` variables; see `pipeshard::server`.

use std::process::ExitCode;

use anyhow::Context as _;
use pipeshard::server::{self, Parsed};

fn init_tracing(config: &server::ServerConfig) {
    if !config.log_disable {
        // llama-server's -v/-lv levels map onto pipeshard's.
        pipeshard::logging::init(match config.verbosity {
            0 => 0,
            1..=2 => 1,
            _ => 2,
        });
    }
}

fn run() -> anyhow::Result<()> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match server::parse(&argv, &|k| std::env::var(k).ok())? {
        Parsed::Help(text) => println!("{text}"),
        Parsed::Version => println!("pipeshard-server {}", env!("CARGO_PKG_VERSION")),
        Parsed::Serve { config, warnings } => {
            init_tracing(&config);
            for w in &warnings {
                tracing::warn!("{w}");
            }
            server::run(*config).context("pipeshard-server")?;
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
