//! `pipeshard fuzz-http`: the HTTP fuzzer, the soak and the shutdown trials
//! against `pipeshard-server` (see `pipeshard_devtools::fuzz::http`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};

use pipeshard::{default_model, progress};
use pipeshard_devtools::fuzz::http::soak::{self, ShutdownOptions, SoakOptions};
use pipeshard_devtools::fuzz::http::{self, HttpFuzzOptions, KnownIssue, ServerSpec};

use super::GlobalArgs;

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Fuzz cases over every endpoint and field.
    Fuzz,
    /// Streaming clients with random disconnects for --duration-s.
    Soak,
    /// SIGTERM with long streams running, --trials times.
    Shutdown,
}

#[derive(clap::Args)]
pub struct FuzzHttpArgs {
    /// What to run.
    #[arg(long = "mode", value_enum, default_value = "fuzz")]
    pub mode: Mode,
    #[command(flatten)]
    pub range: super::fuzz::CaseRange,
    /// Clients sending cases at once.
    #[arg(short = 'j', long = "jobs", default_value_t = 4)]
    pub jobs: usize,
    /// Seconds within which every request must be answered or closed.
    #[arg(long = "timeout-s", default_value_t = 120)]
    pub timeout_s: u64,
    /// Fuzz: the server's read timeout (its `--timeout`), within which
    /// malformed framing must be answered or its connection closed.
    #[arg(long = "read-timeout-s", default_value_t = 5)]
    pub read_timeout_s: u64,
    /// Known issue classes to send (comma-separated, `all` or `none`):
    /// grammar-depth, grammar-nul, grammar-token-ref, grammar-range,
    /// grammar-min-max, id-slot. Upstream's server crashes or hangs on them
    /// until the request-hardening patch is in the tree.
    #[arg(long = "known", default_value = "none")]
    pub known: String,
    /// The most the server's RSS may rise over one case, in MiB.
    #[arg(long = "rss-growth-mib", default_value_t = 512)]
    pub rss_growth_mib: u64,
    /// The most the server's RSS may rise above its level after warm-up at any time, in MiB.
    #[arg(long = "rss-limit-mib", default_value_t = 2048)]
    pub rss_limit_mib: u64,
    /// The model (default: SmolLM2-135M-Instruct).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// The server binary (default: pipeshard-server next to this binary).
    #[arg(long = "server")]
    pub server: Option<PathBuf>,
    /// Arguments for the server instead of the mode's defaults (repeat, or one string split at spaces).
    #[arg(long = "server-args", allow_hyphen_values = true)]
    pub server_args: Option<String>,
    /// Scratch directory: the server log, slot files, failing cases.
    #[arg(long = "work-dir")]
    pub work_dir: Option<PathBuf>,
    /// Soak: streaming clients.
    #[arg(long = "clients", default_value_t = 32)]
    pub clients: usize,
    /// Soak: seconds.
    #[arg(long = "duration-s", default_value_t = 600)]
    pub duration_s: u64,
    /// Soak: percent of requests dropped part way.
    #[arg(long = "drop-percent", default_value_t = 30)]
    pub drop_percent: u32,
    /// Shutdown: trials.
    #[arg(long = "trials", default_value_t = 10)]
    pub trials: usize,
    /// Shutdown: streams running at the signal.
    #[arg(long = "streams", default_value_t = 4)]
    pub streams: usize,
    /// Shutdown: the server's --shutdown-timeout in seconds.
    #[arg(long = "grace-s", default_value_t = 10)]
    pub grace_s: u64,
    /// Shutdown: the signal (TERM or INT).
    #[arg(long = "signal", default_value = "TERM")]
    pub signal: String,
    /// Print the report as JSON on stdout.
    #[arg(long = "json")]
    pub json: bool,
}

fn parse_known(s: &str) -> Result<Vec<KnownIssue>> {
    match s.trim() {
        "none" | "" => Ok(vec![]),
        "all" => Ok(KnownIssue::ALL.to_vec()),
        list => list
            .split(',')
            .map(|k| KnownIssue::parse(k.trim()).with_context(|| format!("--known: no known issue class {k:?}")))
            .collect(),
    }
}

pub fn fuzz_http_cmd(global: &GlobalArgs, args: FuzzHttpArgs) -> Result<()> {
    let known = parse_known(&args.known)?;
    let work_dir = args.work_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!(
            "pipeshard-fuzz-http-{}-{}",
            args.range.seed,
            std::process::id()
        ))
    });
    std::fs::create_dir_all(work_dir.join("slots")).with_context(|| format!("creating {}", work_dir.display()))?;
    let model = match &args.model {
        Some(m) => m.clone(),
        None => default_model::ensure().context("fetching the default model")?,
    };
    let bin = match &args.server {
        Some(b) => b.clone(),
        None => std::env::current_exe()
            .context("locating the pipeshard binary")?
            .with_file_name("pipeshard-server"),
    };
    let slots = work_dir.join("slots").display().to_string();
    let grace = args.grace_s.to_string();
    let read_timeout = args.read_timeout_s.to_string();
    let defaults: Vec<&str> = match args.mode {
        // 256 tokens a slot keeps the cases that generate until the context is full short;
        // the prompt cache is bounded (default 8 GiB) so that RSS shows leaks, not cached prompts
        Mode::Fuzz => vec![
            "-c",
            "1024",
            "-np",
            "4",
            "-t",
            "2",
            "--cache-ram",
            "256",
            "--slot-save-path",
            &slots,
            "--metrics",
            "--timeout",
            &read_timeout,
        ],
        Mode::Soak => vec!["-c", "16384", "-np", "32", "-t", "2"],
        Mode::Shutdown => vec!["-c", "8192", "-np", "4", "-t", "2", "--shutdown-timeout", &grace],
    };
    let mut server_args: Vec<String> = match &args.server_args {
        Some(s) => s.split_whitespace().map(String::from).collect(),
        None => defaults.iter().map(|s| s.to_string()).collect(),
    };
    if let Some(d) = &global.backend_dir {
        server_args.push("--backend-dir".into());
        server_args.push(d.display().to_string());
    }
    let spec = ServerSpec {
        bin,
        model,
        args: server_args,
        log: work_dir.join("server.log"),
    };
    match args.mode {
        Mode::Fuzz => fuzz(&args, known, spec, work_dir),
        Mode::Soak => {
            let opts = SoakOptions {
                seed: args.range.seed,
                clients: args.clients,
                duration: Duration::from_secs(args.duration_s),
                drop_percent: args.drop_percent,
                warmup: Duration::from_secs(30.min(args.duration_s / 4)),
                server: spec,
            };
            let bar = progress::steps_bar(args.duration_s, "soak (s)");
            let r = soak::soak(&opts, |s| bar.set_position(s))?;
            bar.finish_and_clear();
            eprintln!(
                "soak: {} clients, {:.0} s: {} requests, {} completed ({} tokens), {} dropped, {} errors; RSS {:.0} MiB after warm-up, {:.0} MiB at the end ({:+.2}%); slot freed after a drop: p50 {:.1} ms, p95 {:.1} ms, max {:.1} ms, {} of {} at 50 ms or more, {} unmeasured",
                r.clients, r.seconds, r.requests, r.completed, r.tokens, r.dropped, r.errors, r.rss_warm_mib,
                r.rss_end_mib, r.rss_growth_percent, r.slot_free_p50_ms, r.slot_free_p95_ms, r.slot_free_max_ms,
                r.slot_free_over_50ms, r.slot_free_ms.len(), r.slot_free_unmeasured
            );
            for e in &r.error_samples {
                eprintln!("  error: {e}");
            }
            if args.json {
                println!("{}", serde_json::to_string(&r)?);
            }
            if r.errors > 0 || r.rss_growth_percent >= 5.0 || r.slot_free_over_50ms > 0 {
                anyhow::bail!("the soak missed its targets (0 errors, RSS growth < 5%, every slot freed < 50 ms)");
            }
            Ok(())
        }
        Mode::Shutdown => {
            let opts = ShutdownOptions {
                trials: args.trials,
                streams: args.streams,
                grace: Duration::from_secs(args.grace_s),
                signal: args.signal.clone(),
                second_signal_trial: true,
                server: spec,
            };
            let r = soak::shutdown_trials(&opts, |t| eprintln!("shutdown trial {}", t + 1))?;
            for (i, t) in r.trials.iter().enumerate() {
                eprintln!(
                    "  trial {}{}: exit {:?} after {} s; {} of {} streams with a final event, {} complete; new connections refused: {}",
                    i + 1,
                    if t.second_signal { " (second signal)" } else { "" },
                    t.exit_code,
                    t.exit_s.map_or("-".into(), |s| format!("{s:.2}")),
                    t.streams_final_event,
                    r.streams,
                    t.streams_complete,
                    t.refused_new_connections
                );
            }
            eprintln!(
                "shutdown: {} of {} trials exited 0 within {:.0} s + 1 s with every stream ended cleanly; slowest exit {:.2} s",
                r.passed, args.trials, r.grace_s, r.max_exit_s
            );
            if args.json {
                println!("{}", serde_json::to_string(&r)?);
            }
            let second_ok = r
                .trials
                .iter()
                .filter(|t| t.second_signal)
                .all(|t| t.exit_s.is_some_and(|s| s < 2.0));
            if r.passed < args.trials || !second_ok {
                anyhow::bail!("shutdown trials failed");
            }
            Ok(())
        }
    }
}

fn fuzz(args: &FuzzHttpArgs, known: Vec<KnownIssue>, server: ServerSpec, work_dir: PathBuf) -> Result<()> {
    let opts = HttpFuzzOptions {
        seed: args.range.seed,
        first_case: args.range.first_case,
        cases: args.range.cases,
        jobs: args.jobs.max(1),
        timeout: Duration::from_secs(args.timeout_s),
        read_timeout: Duration::from_secs(args.read_timeout_s),
        known,
        server,
        rss_growth_limit: args.rss_growth_mib << 20,
        rss_runaway_limit: args.rss_limit_mib << 20,
        work_dir: work_dir.clone(),
    };
    let bar = progress::steps_bar(args.range.cases, "fuzz-http");
    let r = http::run(&opts, |n| bar.set_position(n))?;
    bar.finish_and_clear();
    let o = |k: &str| r.outcomes.get(k).copied().unwrap_or(0);
    eprintln!(
        "fuzz-http seed {}: {} cases in {:.0} s ({} clients): {} 2xx, {} 4xx, {} 5xx, {} closed without an answer, {} dropped by the client; {} crashes, {} unanswered; RSS {:.0} MiB at the start, {:.0} peak, {:.0} at the end, at most +{:.0} MiB over one case; temperature-0 output {} after the run",
        r.seed,
        r.outcomes.values().sum::<u64>(),
        r.seconds,
        r.jobs,
        o("2xx"),
        o("4xx"),
        o("5xx"),
        o("closed"),
        o("dropped"),
        r.crashes,
        r.unanswered,
        r.rss_start_mib,
        r.rss_peak_mib,
        r.rss_end_mib,
        r.rss_max_case_growth_mib,
        if r.probe_identical { "identical" } else { "DIFFERENT" }
    );
    if !r.known_sent.is_empty() {
        eprintln!("  known issue cases sent: {:?}", r.known_sent);
    }
    for (kind, sample) in &r.server_errors {
        eprintln!("  5xx {kind}: {sample}");
    }
    for f in &r.failures {
        eprintln!(
            "  FAILURE {} case {}: {}; in flight {:?}; kept in {}",
            f.kind,
            f.case,
            f.what,
            f.in_flight,
            f.file.as_ref().map_or("-".into(), |p| p.display().to_string())
        );
    }
    eprintln!("  server log: {}", work_dir.join("server.log").display());
    if args.json {
        println!("{}", serde_json::to_string(&r)?);
    }
    if !r.ok() {
        anyhow::bail!(
            "{} failures (crashes, unanswered requests, RSS, health, probe)",
            r.failures.len().max(1)
        );
    }
    Ok(())
}
