//! HTTP fuzzing of the server (`pipeshard fuzz-http`): numbered cases
//! ([`cases`]) sent by a raw client ([`client`]) from several workers at
//! once to a `pipeshard-server` this module starts, while a monitor watches
//! the process. A run fails on:
//! - a crash (the server process exits),
//! - a request neither answered nor cleanly closed within the timeout (for
//!   malformed framing, within the server's read timeout),
//! - a 5xx answer other than upstream's by-design 501 and 503, or a 2xx
//!   answer to a slot action on a slot that does not exist,
//! - the server's RSS rising more than [`HttpFuzzOptions::rss_growth_limit`]
//!   over one case (from just before it was sent to just after its answer;
//!   with several clients the others' growth counts too, so the bound is
//!   conservative), or more than [`HttpFuzzOptions::rss_runaway_limit`]
//!   above its level after warm-up at any time (sampled every 20 ms),
//! - `/health` not answering, or a slot still busy long after the run,
//! - temperature-0 output for a fixed prompt differing after the run from before.
//!
//! Case `i` of seed `s` is the same request everywhere; a failing case is
//! written to `failures/` under the work directory and replayed with
//! `--seed s --first-case i --cases 1`. [`soak`] holds the soak and
//! shutdown measurements.

pub mod cases;
pub mod client;
pub mod soak;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub use cases::{Action, Case, CaseOptions, KnownIssue};
use client::{exchange, Outcome};

/// Why a run could not be done (as opposed to what it found).
#[derive(Debug, thiserror::Error)]
pub enum HttpFuzzError {
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    #[error("the server: {0}")]
    Server(String),
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> HttpFuzzError {
    let context = context.into();
    move |source| HttpFuzzError::Io { context, source }
}

/// How to start the server under test.
#[derive(Debug, Clone)]
pub struct ServerSpec {
    /// The `pipeshard-server` binary.
    pub bin: PathBuf,
    /// The model (`-m`).
    pub model: PathBuf,
    /// Further arguments (llama-server's and pipeshard's).
    pub args: Vec<String>,
    /// Its stdout and stderr go here.
    pub log: PathBuf,
}

/// A running server, killed on drop.
pub struct ServerProc {
    child: Child,
    pub addr: SocketAddr,
    pub log: PathBuf,
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port nothing listens on now.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl ServerProc {
    /// Start the server on a free loopback port and wait (at most
    /// `ready_within`) until `/health` answers 200.
    pub fn start(spec: &ServerSpec, ready_within: Duration) -> Result<ServerProc, HttpFuzzError> {
        let port = free_port().map_err(io("finding a free port"))?;
        let log = std::fs::File::create(&spec.log).map_err(io(spec.log.display().to_string()))?;
        let log2 = log.try_clone().map_err(io("the server log"))?;
        let mut cmd = Command::new(&spec.bin);
        cmd.arg("-m")
            .arg(&spec.model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(&spec.args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        for (k, _) in std::env::vars() {
            if k.starts_with("LLAMA_ARG_") || k == "LLAMA_API_KEY" {
                cmd.env_remove(k);
            }
        }
        let child = cmd.spawn().map_err(io(format!("starting {}", spec.bin.display())))?;
        let mut s = ServerProc {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            log: spec.log.clone(),
        };
        let t0 = Instant::now();
        loop {
            if let Some(st) = s.exited() {
                return Err(HttpFuzzError::Server(format!(
                    "exited with {st} while starting; log: {}",
                    s.log.display()
                )));
            }
            if let Ok((200, _)) = s.get("/health", Duration::from_secs(2)) {
                return Ok(s);
            }
            if t0.elapsed() > ready_within {
                return Err(HttpFuzzError::Server(format!(
                    "not healthy after {ready_within:?}; log: {}",
                    s.log.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status, once it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Wait for it to exit, at most `within`.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let t0 = Instant::now();
        while t0.elapsed() < within {
            if let Some(s) = self.exited() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }

    /// Resident memory, from /proc.
    pub fn rss_bytes(&self) -> Option<u64> {
        rss_of(self.pid())
    }

    /// (status, body) of `GET path`.
    pub fn get(&self, path: &str, timeout: Duration) -> Result<(u16, Vec<u8>), Outcome> {
        let req = cases::http_request("GET", path, &[], b"", true);
        answer(exchange(self.addr, &req, Action::Whole, timeout))
    }

    /// (status, body) of `POST path` with a JSON body.
    pub fn post(&self, path: &str, body: &Value, timeout: Duration) -> Result<(u16, Vec<u8>), Outcome> {
        let req = cases::http_request(
            "POST",
            path,
            &[("Content-Type".into(), "application/json".into())],
            &serde_json::to_vec(body).unwrap_or_default(),
            true,
        );
        answer(exchange(self.addr, &req, Action::Whole, timeout))
    }

    /// Send a signal (SIGTERM, SIGINT, ...) with kill(1).
    pub fn signal(&self, name: &str) -> std::io::Result<()> {
        let st = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()?;
        if st.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!("kill -{name} {} failed", self.pid())))
        }
    }

    /// The slots' JSON (`GET /slots`).
    pub fn slots(&self) -> Option<Vec<Value>> {
        let (code, body) = self.get("/slots", Duration::from_secs(10)).ok()?;
        if code != 200 {
            return None;
        }
        serde_json::from_slice::<Value>(&body).ok()?.as_array().cloned()
    }

    /// Wait (at most `within`) until no slot is processing; false if one still is.
    pub fn wait_idle(&self, within: Duration) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < within {
            if let Some(s) = self.slots() {
                if s.iter().all(|s| s["is_processing"] != json!(true)) {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

fn answer(ex: client::Exchange) -> Result<(u16, Vec<u8>), Outcome> {
    match ex.outcome {
        Outcome::Answered { status, .. } => Ok((status, client::dechunk(&ex.body))),
        o => Err(o),
    }
}

/// VmRSS of process `pid`, in bytes.
pub fn rss_of(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The fixed prompts whose temperature-0 output must not change over a run.
pub fn probe(server: &ServerProc) -> Result<Vec<String>, String> {
    let t = Duration::from_secs(120);
    let mut out = Vec::new();
    let completion = json!({"prompt": "The capital of France is", "n_predict": 32, "temperature": 0,
        "seed": 42, "cache_prompt": false});
    let chat = json!({"messages": [{"role": "user", "content": "Name three colors."}], "max_tokens": 32,
        "temperature": 0, "seed": 42, "cache_prompt": false});
    for (path, body, pointer) in [
        ("/completion", completion, "/content"),
        ("/v1/chat/completions", chat, "/choices/0/message/content"),
    ] {
        let (code, body) = server.post(path, &body, t).map_err(|o| format!("{path}: {o:?}"))?;
        let v: Value = serde_json::from_slice(&body).map_err(|e| format!("{path}: {e}"))?;
        if code != 200 {
            return Err(format!("{path}: {code} {v}"));
        }
        out.push(
            v.pointer(pointer)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
        );
    }
    Ok(out)
}

/// How a fuzzing run is done.
#[derive(Debug, Clone)]
pub struct HttpFuzzOptions {
    pub seed: u64,
    pub first_case: u64,
    pub cases: u64,
    /// Clients sending cases at once.
    pub jobs: usize,
    /// A request not answered or closed within this is a failure.
    pub timeout: Duration,
    /// The server's read timeout (its `--timeout`): malformed framing must
    /// be answered or closed within it (and a little slack).
    pub read_timeout: Duration,
    /// Known issue classes to send inputs of (see [`KnownIssue`]).
    pub known: Vec<KnownIssue>,
    pub server: ServerSpec,
    /// The most the server's RSS may rise over one case.
    pub rss_growth_limit: u64,
    /// The most the server's RSS may rise above its level after warm-up at any time.
    pub rss_runaway_limit: u64,
    /// Failing cases are written to `failures/` below it.
    pub work_dir: PathBuf,
}

/// One failure a run found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HttpFailure {
    /// The case (or, for a crash or an RSS rise, the first of the cases in flight).
    pub case: u64,
    /// The cases in flight at the time.
    pub in_flight: Vec<u64>,
    pub kind: String,
    pub what: String,
    /// The request, as sent, kept here.
    pub file: Option<PathBuf>,
}

/// Counts and findings of a run.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct HttpFuzzReport {
    pub seed: u64,
    pub first_case: u64,
    pub cases: u64,
    pub jobs: usize,
    pub seconds: f64,
    pub known_included: Vec<String>,
    /// Cases per outcome: `2xx`, `4xx`, `5xx`, `closed`, `dropped`, `timeout`, `connect-failed`.
    pub outcomes: BTreeMap<String, u64>,
    /// Cases per HTTP status.
    pub statuses: BTreeMap<u16, u64>,
    /// Cases per kind (endpoint or raw form).
    pub kinds: BTreeMap<String, u64>,
    /// Cases per known issue class sent.
    pub known_sent: BTreeMap<String, u64>,
    /// A few kinds that answered 5xx, with a sample body each.
    pub server_errors: BTreeMap<String, String>,
    pub crashes: u64,
    pub unanswered: u64,
    pub rss_start_mib: f64,
    /// The largest RSS rise over one case.
    pub rss_max_case_growth_mib: f64,
    pub rss_peak_mib: f64,
    pub rss_end_mib: f64,
    pub probe_before: Vec<String>,
    pub probe_after: Vec<String>,
    pub probe_identical: bool,
    pub failures: Vec<HttpFailure>,
}

impl HttpFuzzReport {
    pub fn ok(&self) -> bool {
        self.failures.is_empty() && self.probe_identical
    }
}

const MIB: f64 = 1024.0 * 1024.0;

/// Upstream's 5xx answers by design: 501 (a feature the server was not
/// started with) and 503 (loading, or no slot free).
const BY_DESIGN_5XX: [u16; 2] = [501, 503];

/// How long past the server's read timeout a connection with malformed
/// framing may stay open (scheduling, the server's poll interval).
const FRAMING_SLACK: Duration = Duration::from_secs(3);

fn mutate_rng(seed: u64, index: u64) -> crate::fuzz::mutate::Rng {
    crate::fuzz::mutate::Rng::for_case(seed, index)
}

fn outcome_name(o: &Outcome) -> String {
    match o {
        Outcome::Answered { status, .. } => format!("{}xx", status / 100),
        Outcome::Closed => "closed".into(),
        Outcome::Dropped => "dropped".into(),
        Outcome::Timeout { .. } => "timeout".into(),
        Outcome::ConnectFailed(_) => "connect-failed".into(),
    }
}

fn keep_case(work_dir: &Path, seed: u64, c: &Case) -> Option<PathBuf> {
    let dir = work_dir.join("failures");
    std::fs::create_dir_all(&dir).ok()?;
    let p = dir.join(format!("seed{seed}-case{}.http", c.index));
    std::fs::write(&p, &c.request).ok()?;
    Some(p)
}

/// Run `opts.cases` cases against a server started from `opts.server`;
/// `progress` is called with the number of cases done.
pub fn run(opts: &HttpFuzzOptions, progress: impl Fn(u64) + Sync) -> Result<HttpFuzzReport, HttpFuzzError> {
    std::fs::create_dir_all(&opts.work_dir).map_err(io(opts.work_dir.display().to_string()))?;
    let server = ServerProc::start(&opts.server, Duration::from_secs(180))?;
    let props: Value = server
        .get("/props", Duration::from_secs(10))
        .ok()
        .and_then(|(_, b)| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    let n_slots = props["total_slots"].as_u64().unwrap_or(1).max(1) as u32;
    let n_vocab = server
        .get("/v1/models", Duration::from_secs(10))
        .ok()
        .and_then(|(_, b)| serde_json::from_slice::<Value>(&b).ok())
        .and_then(|v| v.pointer("/data/0/meta/n_vocab").and_then(Value::as_u64))
        .unwrap_or(32000) as u32;
    let case_opts = CaseOptions {
        seed: opts.seed,
        n_slots,
        n_vocab,
        known: opts.known.clone(),
    };

    let mut report = HttpFuzzReport {
        seed: opts.seed,
        first_case: opts.first_case,
        cases: opts.cases,
        jobs: opts.jobs,
        known_included: opts.known.iter().map(|k| k.name().to_string()).collect(),
        ..Default::default()
    };
    report.probe_before = probe(&server).map_err(HttpFuzzError::Server)?;
    let rss_start = server.rss_bytes().unwrap_or(0);
    report.rss_start_mib = rss_start as f64 / MIB;

    let t0 = Instant::now();
    let next = AtomicU64::new(opts.first_case);
    let end = opts.first_case + opts.cases;
    let done = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let in_flight: Mutex<BTreeSet<u64>> = Mutex::new(BTreeSet::new());
    let results: Mutex<HttpFuzzReport> = Mutex::new(std::mem::take(&mut report));
    let peak = AtomicU64::new(rss_start);
    let server = Arc::new(Mutex::new(server));
    let pid = server.lock().map(|s| s.pid()).unwrap_or(0);

    std::thread::scope(|scope| {
        // The monitor: the process alive, its RSS bounded.
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) && done.load(Ordering::Relaxed) < opts.cases {
                let exited = server.lock().ok().and_then(|mut s| s.exited());
                let flying: Vec<u64> = in_flight
                    .lock()
                    .map(|f| f.iter().copied().collect())
                    .unwrap_or_default();
                let fail = |kind: &str, what: String| {
                    let mut r = results.lock().unwrap_or_else(|e| e.into_inner());
                    let file = flying
                        .first()
                        .and_then(|&i| keep_case(&opts.work_dir, opts.seed, &cases::case(&case_opts, i)));
                    for &i in &flying {
                        keep_case(&opts.work_dir, opts.seed, &cases::case(&case_opts, i));
                    }
                    r.failures.push(HttpFailure {
                        case: flying.first().copied().unwrap_or(0),
                        in_flight: flying.clone(),
                        kind: kind.into(),
                        what,
                        file,
                    });
                    stop.store(true, Ordering::Relaxed);
                };
                if let Some(st) = exited {
                    results.lock().unwrap_or_else(|e| e.into_inner()).crashes += 1;
                    fail("crash", format!("the server exited: {st}"));
                    return;
                }
                if let Some(rss) = rss_of(pid) {
                    peak.fetch_max(rss, Ordering::Relaxed);
                    if rss > rss_start + opts.rss_runaway_limit {
                        fail(
                            "rss",
                            format!(
                                "RSS {:.0} MiB, {:.0} MiB above the start",
                                rss as f64 / MIB,
                                (rss - rss_start) as f64 / MIB
                            ),
                        );
                        return;
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        for _ in 0..opts.jobs.max(1) {
            scope.spawn(|| {
                let addr = server.lock().map(|s| s.addr).unwrap_or_else(|e| e.into_inner().addr);
                loop {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= end {
                        return;
                    }
                    let c = cases::case(&case_opts, i);
                    in_flight.lock().unwrap_or_else(|e| e.into_inner()).insert(i);
                    let rss0 = rss_of(pid).unwrap_or(0);
                    let within = if c.framing {
                        opts.timeout.min(opts.read_timeout + FRAMING_SLACK)
                    } else {
                        opts.timeout
                    };
                    let ex = exchange(addr, &c.request, c.action, within);
                    let rss1 = rss_of(pid).unwrap_or(0);
                    in_flight.lock().unwrap_or_else(|e| e.into_inner()).remove(&i);
                    let mut r = results.lock().unwrap_or_else(|e| e.into_inner());
                    if stop.load(Ordering::Relaxed) {
                        return; // the monitor has the story
                    }
                    let grew = rss1.saturating_sub(rss0);
                    r.rss_max_case_growth_mib = r.rss_max_case_growth_mib.max(grew as f64 / MIB);
                    if grew > opts.rss_growth_limit {
                        let file = keep_case(&opts.work_dir, opts.seed, &c);
                        r.failures.push(HttpFailure {
                            case: i,
                            in_flight: vec![i],
                            kind: c.kind.clone(),
                            what: format!("RSS rose {:.0} MiB over the case", grew as f64 / MIB),
                            file,
                        });
                    }
                    *r.outcomes.entry(outcome_name(&ex.outcome)).or_default() += 1;
                    *r.kinds.entry(c.kind.clone()).or_default() += 1;
                    if let Some(k) = c.known {
                        *r.known_sent.entry(k.name().into()).or_default() += 1;
                    }
                    if let Outcome::Answered { status, .. } = ex.outcome {
                        *r.statuses.entry(status).or_default() += 1;
                        if status >= 500 && !r.server_errors.contains_key(&c.kind) && r.server_errors.len() < 40 {
                            let body = client::dechunk(&ex.body);
                            let text = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
                            r.server_errors
                                .insert(c.kind.clone(), format!("case {}: {status} {text}", c.index));
                        }
                    }
                    let wrong = match ex.outcome {
                        Outcome::Answered { status, .. } if c.must_refuse && status < 300 => {
                            Some(format!("{status} for a slot that does not exist"))
                        }
                        Outcome::Answered { status, .. } if status >= 500 && !BY_DESIGN_5XX.contains(&status) => {
                            Some(format!(
                                "{status}: {}",
                                String::from_utf8_lossy(&client::dechunk(&ex.body)[..ex.body.len().min(200)])
                            ))
                        }
                        _ => None,
                    };
                    if let Some(what) = wrong {
                        let file = keep_case(&opts.work_dir, opts.seed, &c);
                        r.failures.push(HttpFailure {
                            case: i,
                            in_flight: vec![i],
                            kind: c.kind.clone(),
                            what,
                            file,
                        });
                    }
                    if !ex.outcome.is_ok() {
                        r.unanswered += 1;
                        let file = keep_case(&opts.work_dir, opts.seed, &c);
                        r.failures.push(HttpFailure {
                            case: i,
                            in_flight: vec![i],
                            kind: c.kind.clone(),
                            what: format!("{:?}", ex.outcome),
                            file,
                        });
                    }
                    drop(r);
                    progress(done.fetch_add(1, Ordering::Relaxed) + 1);
                }
            });
        }
    });

    let mut report = results.into_inner().unwrap_or_else(|e| e.into_inner());
    report.seconds = t0.elapsed().as_secs_f64();
    report.rss_peak_mib = peak.load(Ordering::Relaxed) as f64 / MIB;
    let mut server = match Arc::try_unwrap(server) {
        Ok(m) => m.into_inner().unwrap_or_else(|e| e.into_inner()),
        Err(_) => return Err(HttpFuzzError::Server("the server handle is still shared".into())),
    };
    if report.crashes == 0 && server.exited().is_none() {
        if !server.wait_idle(Duration::from_secs(60)) {
            report.failures.push(HttpFailure {
                case: 0,
                in_flight: vec![],
                kind: "slots".into(),
                what: "a slot still processing 60 s after the last case".into(),
                file: None,
            });
        }
        match server.get("/health", Duration::from_secs(10)) {
            Ok((200, _)) => {}
            other => report.failures.push(HttpFailure {
                case: 0,
                in_flight: vec![],
                kind: "health".into(),
                what: format!("/health after the run: {other:?}"),
                file: None,
            }),
        }
        report.rss_end_mib = server.rss_bytes().unwrap_or(0) as f64 / MIB;
        match probe(&server) {
            Ok(p) => report.probe_after = p,
            Err(e) => report.failures.push(HttpFailure {
                case: 0,
                in_flight: vec![],
                kind: "probe".into(),
                what: e,
                file: None,
            }),
        }
        report.probe_identical = report.probe_after == report.probe_before;
    }
    Ok(report)
}
