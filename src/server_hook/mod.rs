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

mod live;
mod options;
mod plan;
mod report;
mod tune;

use std::path::PathBuf;

pub use options::{help, split_args, ServerOptions};
pub use plan::{installed, Installed};
pub use report::{live_metrics, metrics_text, props_json};

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

/// Load the ggml backends, install pipeshard's load hook when `opts` plan
/// the placement, and run llama.cpp's server with `upstream` until it
/// exits; returns its exit code.
pub fn serve(program: &str, opts: ServerOptions, upstream: &[String]) -> Result<i32, ServeError> {
    opts.check_files().map_err(ServeError::Options)?;
    engine::init_keep_log(opts.backend_dir.as_deref())?;
    // Every model file upstream is about to load, as it resolved the path,
    // is checked first; with a budget or a plan, the load is then placed.
    let hook_opts = opts.clone();
    engine::set_load_hook(Box::new(move |req, mp, cp| {
        check_files(req)?;
        plan::on_load(&hook_opts, req, mp, cp).map_err(|e| e.to_string())
    }));
    if opts.plans() {
        let hook_opts = opts.clone();
        engine::set_projector_hook(Box::new(move |path, p| plan::on_projector(&hook_opts, path, p)));
        // Between batches: the decode split tuned on the first steps
        // served, and with `auto` the plan following the card.
        engine::set_loop_hook(Box::new(|mut ctx| {
            tune::on_loop(ctx.reborrow());
            live::on_loop(ctx);
        }));
        // pipeshard's field in /props and gauges in /metrics (with --metrics).
        // `auto` resolves when the model loads; the plan reports it then.
        let budget = match opts.pipeshard.budgets() {
            Ok(b) => match b.as_slice() {
                [crate::launch::BudgetSpec::Bytes(b)] => Some(*b),
                _ => None,
            },
            Err(e) => return Err(ServeError::Options(e.to_string())),
        };
        engine::set_server_reports(
            "pipeshard",
            Box::new(move || props_json(budget)),
            Box::new(move || metrics_text(budget)),
        );
    }
    Ok(engine::run_llama_server(program, upstream))
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
