//! `pipeshard-server`: a drop-in replacement for `llama-server`. Takes the
//! same flags and `LLAMA_ARG_*` variables; see `pipeshard::server`.

use std::process::ExitCode;

use anyhow::Context as _;
use pipeshard::server::{self, Parsed};

fn init_tracing(config: &server::ServerConfig) {
    if config.log_disable {
        return;
    }
    let default = match config.verbosity {
        0 => "warn,pipeshard=info",
        1..=2 => "info,llama.cpp=info",
        _ => "debug,llama.cpp=debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("PIPESHARD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
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
