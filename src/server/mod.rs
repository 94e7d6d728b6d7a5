//! `pipeshard serve` / `pipeshard-server`: a drop-in replacement for
//! llama-server. It takes llama-server's flags and `LLAMA_ARG_*` variables
//! ([`args`]), speaks its HTTP API and the OpenAI API ([`routes`]), and
//! serves `-np` slots with continuous batching on one engine context
//! ([`scheduler`]).
//!
//! ```no_run
//! let argv: Vec<String> = vec!["-m".into(), "model.gguf".into(), "--port".into(), "8080".into()];
//! pipeshard::server::main_with_args(&argv)?;
//! # Ok::<(), pipeshard::server::ServerError>(())
//! ```

pub mod api_native;
pub mod api_openai;
pub mod args;
pub mod chat_template;
pub mod completion;
pub mod config;
pub mod device_gate;
pub mod embedding;
pub mod error;
pub mod json_schema;
pub mod metrics;
pub mod params;
pub mod routes;
pub mod scheduler;
pub mod state;
pub mod task;
pub mod upstream_args;
pub mod vision;
pub mod worker;

use std::sync::{Arc, Mutex};

pub use args::{parse, ArgsError, Parsed};
pub use config::ServerConfig;
pub use error::{ApiError, ServerError};
pub use state::AppState;

/// Parse llama-server arguments (without the program name) and the process
/// environment, then serve — or print help/version.
pub fn main_with_args(argv: &[String]) -> Result<(), ServerError> {
    match args::parse(argv, &|k| std::env::var(k).ok())? {
        Parsed::Help(text) => {
            println!("{text}");
            Ok(())
        }
        Parsed::Version => {
            println!("pipeshard-server {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Parsed::Serve { config, warnings } => {
            for w in &warnings {
                tracing::warn!("{w}");
            }
            run(*config)
        }
    }
}

/// Serve on a new tokio runtime until Ctrl-C / SIGTERM, or until loading
/// the model fails.
pub fn run(config: ServerConfig) -> Result<(), ServerError> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(serve(config))
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// Bind, start loading the model in the background (`/health` answers 503
/// meanwhile) and serve.
pub async fn serve(config: ServerConfig) -> Result<(), ServerError> {
    let addr = format!("{}:{}", config.host, config.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|source| ServerError::Bind {
            addr: addr.clone(),
            source,
        })?;
    let local = listener.local_addr()?;
    tracing::info!("pipeshard-server listening on http://{local}");
    if let Some(b) = config.vram_budget {
        tracing::info!("VRAM budget: {b} bytes (stored for the planner)");
    }
    let state = Arc::new(AppState::new(config));
    let (fail_tx, fail_rx) = tokio::sync::oneshot::channel::<ServerError>();
    let loader = state.clone();
    std::thread::Builder::new()
        .name("pipeshard-load".into())
        .spawn(move || match state::load(&loader.config, loader.metrics.clone()) {
            Ok(r) => {
                loader.set_ready(r);
                tracing::info!("ready");
            }
            Err(e) => {
                tracing::error!("{e}");
                let _ = fail_tx.send(e);
            }
        })?;
    let failure: Arc<Mutex<Option<ServerError>>> = Arc::new(Mutex::new(None));
    let failure_w = failure.clone();
    let stop = async move {
        tokio::select! {
            _ = shutdown_signal() => tracing::info!("shutting down"),
            Ok(e) = fail_rx => {
                if let Ok(mut f) = failure_w.lock() {
                    *f = Some(e);
                }
            }
        }
    };
    axum::serve(listener, routes::router(state))
        .with_graceful_shutdown(stop)
        .await?;
    let failed = failure.lock().ok().and_then(|mut f| f.take());
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
