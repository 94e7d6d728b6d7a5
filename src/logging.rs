//! Log output for the binaries: `tracing` to stderr, filtered by
//! `PIPESHARD_LOG` (an `EnvFilter` directive) or by a verbosity level.

/// Install the subscriber. Verbosity 0 shows warnings and pipeshard's own
/// info lines; 1 adds llama.cpp's log; 2 and above show everything.
pub fn init(verbosity: u8) {
    let default = match verbosity {
        0 => "warn,pipeshard=info",
        1 => "info,llama.cpp=debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("PIPESHARD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // A second call (e.g. from a test harness) keeps the first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}
