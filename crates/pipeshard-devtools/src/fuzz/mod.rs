//! GGUF fuzzing: structure-aware mutations of real and synthetic model
//! files ([`mutate`]), each case run through the full load path in a child
//! process, so that a crash (a signal), a hang (a timeout) or a panic is
//! seen and the input kept.
//!
//! Cases are numbered; case `i` of a run with seed `s` is the same file on
//! every machine and with any number of workers, so a failure found in a
//! long run is reproduced by `--seed s --first-case i --cases 1`.
//!
//! Each case first goes through pipeshard's own checks in-process (the GGUF
//! reader and [`crate::gguf::validate`], exactly what `engine::Model::load`
//! runs before llama.cpp sees the file), where a panic is caught and counted.
//! Then every case runs in the child, and the child must agree: a case the
//! checks reject must fail with pipeshard's message and exit code 1, a case
//! they pass must get past them. [`FuzzOptions::skip_rejected`] leaves out
//! the child for rejected cases, for speed. With [`FuzzOptions::server`]
//! the child is the server, and a case has loaded when it is healthy.

pub mod http;
pub mod mutate;

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mutate::{mutate, Case, RawGguf, Rng};

/// What stands in for the case's path in [`FuzzOptions::loader`].
pub const CASE_PLACEHOLDER: &str = "{case}";

/// What stands in for a free loopback port in a server's
/// [`FuzzOptions::loader`].
pub const PORT_PLACEHOLDER: &str = "{port}";

/// How a fuzzing run is done.
#[derive(Debug, Clone)]
pub struct FuzzOptions {
    /// Seed of the run.
    pub seed: u64,
    /// Number of the first case (to replay one).
    pub first_case: u64,
    /// Number of cases.
    pub cases: u64,
    /// Parallel workers.
    pub jobs: usize,
    /// Valid GGUF files to mutate.
    pub seed_files: Vec<PathBuf>,
    /// How often (one case in N) the largest seed file is picked; the
    /// others share the rest. 1 picks uniformly.
    pub largest_one_in: usize,
    /// The load command, with [`CASE_PLACEHOLDER`] where the case's path goes.
    pub loader: Vec<OsString>,
    /// Scratch files go here; failing cases are kept in `failures/` below it.
    pub work_dir: PathBuf,
    /// A child running longer than this is a hang.
    pub timeout: Duration,
    /// Address-space limit of the child in MiB (0: none), so that a file
    /// that makes llama.cpp allocate without bound fails instead of taking
    /// the machine's memory.
    pub mem_limit_mib: u64,
    /// Do not run the cases pipeshard's checks reject through the child.
    pub skip_rejected: bool,
    /// The loader is a server listening on [`PORT_PLACEHOLDER`]: a case
    /// has loaded once its `/health` answers 200, and the server is then
    /// stopped (its start-up, from the model check through llama.cpp's load
    /// and warm-up, is what is fuzzed).
    pub server: bool,
}

/// Counts of a fuzzing run.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FuzzCounts {
    /// Cases run.
    pub cases: u64,
    /// Rejected by pipeshard's checks (reader and hyper-parameter
    /// validation), in-process or in the child, with exit code 1.
    pub rejected_by_pipeshard: u64,
    /// Passed pipeshard's checks before the load, then rejected with a
    /// clean error and exit code 1: by llama.cpp's loader, by pipeshard's
    /// check of the vocabulary llama.cpp loaded, or by a later step.
    pub rejected_by_llama: u64,
    /// Loaded and generated a token.
    pub loaded: u64,
    /// The child died by a signal (abort, segfault, ...).
    pub signals: u64,
    /// The child ran past the timeout.
    pub hangs: u64,
    /// Any other outcome: a panic, an exit code other than 0 and 1, exit
    /// code 1 without an error message, the child disagreeing with the
    /// in-process checks.
    pub other_failures: u64,
}

impl FuzzCounts {
    /// Cases that did not end cleanly.
    pub fn failures(&self) -> u64 {
        self.signals + self.hangs + self.other_failures
    }
}

/// The result of a run.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct FuzzReport {
    /// Seed of the run.
    pub seed: u64,
    /// The counts.
    pub counts: FuzzCounts,
    /// Wall time in seconds.
    pub seconds: f64,
    /// Failing cases kept, with what happened.
    pub failures: Vec<FuzzFailure>,
}

/// A failing case.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct FuzzFailure {
    /// Case number.
    pub case: u64,
    /// What happened (`"signal 6"`, `"hang"`, `"exit code 101"`, ...).
    pub outcome: String,
    /// The mutations that made the case.
    pub mutations: Vec<String>,
    /// Where the input was kept.
    pub file: PathBuf,
}

/// Why a run could not be done.
#[derive(Debug, thiserror::Error)]
pub enum FuzzError {
    /// A seed file is unreadable or not valid GGUF.
    #[error("seed file: {0}")]
    Seed(#[from] crate::gguf::GgufError),
    /// There are no seed files or no load command.
    #[error("{0}")]
    Config(String),
    /// A scratch file could not be written.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// Why it failed.
        source: std::io::Error,
    },
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> FuzzError {
    let context = context.into();
    move |source| FuzzError::Io { context, source }
}

/// How one case ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    RejectedByPipeshard,
    RejectedByLlama,
    Loaded,
    Signal(i32),
    Hang,
    Other(String),
}

impl Outcome {
    fn is_failure(&self) -> bool {
        matches!(self, Outcome::Signal(_) | Outcome::Hang | Outcome::Other(_))
    }

    fn describe(&self) -> String {
        match self {
            Outcome::Signal(s) => format!("signal {s}"),
            Outcome::Hang => "hang".into(),
            Outcome::Other(s) => s.clone(),
            o => format!("{o:?}"),
        }
    }
}

/// Pipeshard's checks, as `engine::Model::load` runs them: `Ok(true)` if
/// the file passes, `Ok(false)` if it is rejected, `Err` if a check panicked.
fn passes_checks(bytes: &[u8]) -> Result<bool, String> {
    std::panic::catch_unwind(|| {
        match crate::gguf::GgufFile::from_reader(std::io::Cursor::new(bytes), bytes.len() as u64, "case.gguf") {
            Ok(f) => crate::gguf::validate(&f).is_ok(),
            Err(_) => false,
        }
    })
    .map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic".into())
    })
}

/// Runs the loader on `path`, with the timeout and memory limit.
fn run_child(opts: &FuzzOptions, path: &Path, log: &Path) -> Result<Outcome, FuzzError> {
    let port = if opts.server {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(io_err("finding a free port"))?
            .port()
    } else {
        0
    };
    let args: Vec<OsString> = opts
        .loader
        .iter()
        .map(|a| {
            if a == CASE_PLACEHOLDER {
                path.as_os_str().to_owned()
            } else if a == PORT_PLACEHOLDER {
                port.to_string().into()
            } else {
                a.clone()
            }
        })
        .collect();
    let log_file = std::fs::File::create(log).map_err(io_err(format!("creating {}", log.display())))?;
    let mut cmd = if opts.mem_limit_mib > 0 {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(format!("ulimit -v {} && exec \"$@\"", opts.mem_limit_mib * 1024))
            .arg("sh")
            .args(&args);
        c
    } else {
        let mut c = Command::new(&args[0]);
        c.args(&args[1..]);
        c
    };
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        .env("RUST_BACKTRACE", "0");
    let mut child = cmd.spawn().map_err(io_err(format!("starting {:?}", args[0])))?;
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if start.elapsed() > opts.timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Ok(Outcome::Hang);
            }
            Ok(None) if opts.server && healthy(port) => {
                let _ = child.kill();
                let _ = child.wait();
                return Ok(Outcome::Loaded);
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(if opts.server { 50 } else { 5 })),
            Err(e) => return Err(io_err("waiting for the loader")(e)),
        }
    };
    use std::os::unix::process::ExitStatusExt;
    if let Some(sig) = status.signal() {
        return Ok(Outcome::Signal(sig));
    }
    let mut stderr = String::new();
    if let Ok(mut f) = std::fs::File::open(log) {
        let _ = f.read_to_string(&mut stderr);
    }
    Ok(match status.code() {
        Some(0) => Outcome::Loaded,
        Some(1) if stderr.contains("is not a usable GGUF model") => Outcome::RejectedByPipeshard,
        Some(1) if stderr.contains("error:") && !stderr.contains("panicked") => Outcome::RejectedByLlama,
        // llama-server reports a failed load in its own words
        Some(1) if opts.server && !stderr.contains("panicked") => Outcome::RejectedByLlama,
        Some(c) => Outcome::Other(format!("exit code {c}")),
        None => Outcome::Other("no exit code".into()),
    })
}

/// Whether a server on loopback `port` answers `/health` with 200 (its
/// model loaded and warmed up).
fn healthy(port: u16) -> bool {
    use std::io::Write;
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 200")
}

/// Runs the fuzzer: `opts.cases` cases over `opts.jobs` workers. `progress`
/// is called after each case with the counts so far.
pub fn run(opts: &FuzzOptions, progress: impl Fn(&FuzzCounts) + Sync) -> Result<FuzzReport, FuzzError> {
    if opts.seed_files.is_empty() {
        return Err(FuzzError::Config("no seed files to mutate".into()));
    }
    if opts.loader.is_empty() || !opts.loader.iter().any(|a| a == CASE_PLACEHOLDER) {
        return Err(FuzzError::Config(format!(
            "the load command must contain {CASE_PLACEHOLDER}"
        )));
    }
    let seeds: Vec<RawGguf> = opts
        .seed_files
        .iter()
        .map(|p| RawGguf::open(p))
        .collect::<Result<_, _>>()?;
    for p in &opts.seed_files {
        let f = crate::gguf::GgufFile::open(p)?;
        crate::gguf::validate(&f)
            .map_err(|e| FuzzError::Config(format!("the seed file fails pipeshard's checks: {e}")))?;
    }
    let largest = (0..seeds.len()).max_by_key(|&i| seeds[i].data.len()).unwrap_or(0);
    let failures_dir = opts.work_dir.join("failures");
    std::fs::create_dir_all(&failures_dir).map_err(io_err(format!("creating {}", failures_dir.display())))?;

    let next = AtomicU64::new(0);
    let counts = Mutex::new(FuzzCounts::default());
    let failures = Mutex::new(Vec::new());
    let first_error: Mutex<Option<FuzzError>> = Mutex::new(None);
    let start = Instant::now();

    let pick_seed = |rng: &mut Rng| -> usize {
        if seeds.len() == 1 || opts.largest_one_in <= 1 {
            rng.below(seeds.len())
        } else if rng.one_in(opts.largest_one_in) {
            largest
        } else {
            let i = rng.below(seeds.len() - 1);
            if i >= largest {
                i + 1
            } else {
                i
            }
        }
    };

    std::thread::scope(|s| {
        for w in 0..opts.jobs.max(1) {
            let (next, counts, failures, first_error) = (&next, &counts, &failures, &first_error);
            let (seeds, pick_seed, progress, failures_dir) = (&seeds, &pick_seed, &progress, &failures_dir);
            s.spawn(move || {
                let case_path = opts.work_dir.join(format!("worker-{w}.gguf"));
                let log_path = opts.work_dir.join(format!("worker-{w}.log"));
                loop {
                    if first_error.lock().unwrap().is_some() {
                        return;
                    }
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= opts.cases {
                        return;
                    }
                    let index = opts.first_case + k;
                    let mut rng = Rng::for_case(opts.seed, index);
                    let seed = &seeds[pick_seed(&mut rng)];
                    let case: Case = mutate(seed, &mut rng);
                    let result = one_case(opts, &case, &case_path, &log_path);
                    let outcome = match result {
                        Ok(o) => o,
                        Err(e) => {
                            first_error.lock().unwrap().get_or_insert(e);
                            return;
                        }
                    };
                    if outcome.is_failure() {
                        let kept = failures_dir.join(format!("seed{}-case{index}.gguf", opts.seed));
                        let _ = case.write(&kept);
                        let mut note = format!("outcome: {}\nmutations:\n", outcome.describe());
                        for m in &case.mutations {
                            note.push_str(&format!("  {m}\n"));
                        }
                        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                        let tail: String = log
                            .lines()
                            .rev()
                            .take(30)
                            .collect::<Vec<_>>()
                            .into_iter()
                            .rev()
                            .collect::<Vec<_>>()
                            .join("\n");
                        note.push_str(&format!("stderr (last lines):\n{tail}\n"));
                        let _ = std::fs::write(kept.with_extension("txt"), note);
                        tracing::warn!(case = index, outcome = %outcome.describe(), mutations = ?case.mutations, "failing case kept in {}", kept.display());
                        failures.lock().unwrap().push(FuzzFailure {
                            case: index,
                            outcome: outcome.describe(),
                            mutations: case.mutations.clone(),
                            file: kept,
                        });
                    }
                    let snapshot = {
                        let mut c = counts.lock().unwrap();
                        c.cases += 1;
                        match outcome {
                            Outcome::RejectedByPipeshard => c.rejected_by_pipeshard += 1,
                            Outcome::RejectedByLlama => c.rejected_by_llama += 1,
                            Outcome::Loaded => c.loaded += 1,
                            Outcome::Signal(_) => c.signals += 1,
                            Outcome::Hang => c.hangs += 1,
                            Outcome::Other(_) => c.other_failures += 1,
                        }
                        c.clone()
                    };
                    progress(&snapshot);
                }
            });
        }
    });
    if let Some(e) = first_error.into_inner().unwrap() {
        return Err(e);
    }
    for w in 0..opts.jobs.max(1) {
        let _ = std::fs::remove_file(opts.work_dir.join(format!("worker-{w}.gguf")));
        let _ = std::fs::remove_file(opts.work_dir.join(format!("worker-{w}.log")));
    }
    let mut failures = failures.into_inner().unwrap();
    failures.sort_by_key(|f| f.case);
    Ok(FuzzReport {
        seed: opts.seed,
        counts: counts.into_inner().unwrap(),
        seconds: start.elapsed().as_secs_f64(),
        failures,
    })
}

fn one_case(opts: &FuzzOptions, case: &Case, path: &Path, log: &Path) -> Result<Outcome, FuzzError> {
    let mut bytes = Vec::with_capacity(case.header.len() + case.data.len());
    bytes.extend_from_slice(&case.header);
    bytes.extend_from_slice(&case.data);
    let passes = match passes_checks(&bytes) {
        Ok(p) => p,
        Err(panic) => return Ok(Outcome::Other(format!("pipeshard's checks panicked: {panic}"))),
    };
    if !passes && opts.skip_rejected {
        return Ok(Outcome::RejectedByPipeshard);
    }
    std::fs::write(path, &bytes).map_err(io_err(format!("writing {}", path.display())))?;
    let outcome = run_child(opts, path, log)?;
    // The child runs the same checks first: it must agree with them.
    Ok(match (passes, outcome) {
        (false, o @ (Outcome::Loaded | Outcome::RejectedByLlama)) => Outcome::Other(format!(
            "pipeshard's checks reject the file in-process, but the child got past them ({o:?})"
        )),
        (true, Outcome::RejectedByPipeshard) => {
            Outcome::Other("pipeshard's checks pass the file in-process, but reject it in the child".into())
        }
        (_, o) => o,
    })
}
