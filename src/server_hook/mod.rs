//! `pipeshard-server` and `pipeshard serve`: llama.cpp's own server
//! (`tools/server`, run in this process through [`engine::run_llama_server`])
//! with pipeshard's plan installed at model load.
//!
//! pipeshard's options ([`ServerOptions`]) are split from the command line;
//! everything else, and every `LLAMA_ARG_*` variable, goes to upstream's
//! parser unchanged. With a budget or a plan, the load hook (patch 0007)
//! plans for exactly the parameters upstream resolved (context, ubatch,
//! `-np`, ...) and installs the placement, offload decisions, stream slots
//! and hybrid split; upstream's `--fit` then leaves the placement alone.
//! Without them the hook only checks each model file as every pipeshard
//! command does, and the server is otherwise llama-server.
//!
//! Every hook reaches the run's [`ServerState`] (the model's running
//! [`crate::launch::Session`] among it) through the `user_data` of its C
//! callback: nothing here is process-wide.

mod across;
mod options;
mod plan;
mod report;
mod state;

use std::path::PathBuf;

pub use options::{help, split_args, ServerOptions};
pub use plan::Installed;
pub use report::{live_metrics, Reports};
pub use state::ServerState;

use crate::engine;

/// Why the server could not start or load its model.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Options(String),
    #[error("loading the ggml backends: {0}")]
    Backends(#[from] engine::EngineError),
    #[error("planning {}: {source}", model.display())]
    Plan {
        model: PathBuf,
        source: crate::launch::LaunchError,
    },
    #[error("the installed plan's lock was poisoned by a panic")]
    Poisoned,
}

/// Whether `args` ask upstream for its help text.
pub fn wants_help(args: &[String]) -> bool {
    args.iter().any(|a| a == "-h" || a == "--help" || a == "--usage")
}

/// Load the ggml backends and run llama.cpp's server with `upstream` and
/// pipeshard's hooks ([`ServerState::hooks`]) until it exits; returns its
/// exit code.
pub fn serve(program: &str, opts: ServerOptions, upstream: &[String]) -> Result<i32, ServeError> {
    opts.check_files().map_err(ServeError::Options)?;
    let state = ServerState::new(opts)?;
    engine::init_keep_log(state.opts.backend_dir.as_deref())?;
    Ok(engine::run_llama_server(program, upstream, &state.hooks()))
}

/// The model check every loading path runs ([`engine::check_model_file`]),
/// on the file upstream is about to load and, for the target, on the draft
/// model and the projector it loads after it, before llama.cpp reads any.
fn check_files(req: &engine::LoadRequest) -> Result<(), String> {
    for path in std::iter::once(&req.model).chain(&req.draft).chain(&req.mmproj) {
        engine::check_model_file(path).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The whole command: `args` (without the program name) split into
/// pipeshard's options and upstream's; a bad pipeshard option prints a
/// clear message and exits 1; otherwise the server's own exit code.
pub fn main_with_args(program: &str, args: &[String]) -> std::process::ExitCode {
    let (own, upstream) = split_args(args);
    let opts = match ServerOptions::parse(&own) {
        Ok(o) => o,
        Err(e) => {
            let _ = e.print();
            return std::process::ExitCode::FAILURE;
        }
    };
    crate::logging::init(0);
    // Upstream prints its help and exits; pipeshard's options come first.
    if wants_help(&upstream) {
        println!("{}\n", help());
    }
    let code = match serve(program, opts, &upstream) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(1))
}
