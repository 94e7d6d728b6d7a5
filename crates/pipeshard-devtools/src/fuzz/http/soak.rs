//! Soak and shutdown measurements of the server.
//!
//! - [`soak`]: N streaming clients for a while, each dropping its stream at
//!   random now and then. Counts errors (any answer but a complete stream
//!   that was not dropped on purpose), the RSS after warm-up and at the end,
//!   and for each drop the time until `GET /slots` shows the slot free of
//!   that task.
//! - [`shutdown_trials`]: long streams running, then SIGTERM; the exit code
//!   and time, whether each stream ended with a final event and a complete
//!   chunked body, and whether new connections were refused. A trial with a
//!   second signal checks that it ends the process at once.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::cases::http_request;
use super::mutate_rng;
use super::{HttpFuzzError, ServerProc, ServerSpec, MIB};

/// Soak parameters.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    pub seed: u64,
    pub clients: usize,
    pub duration: Duration,
    /// Chance (percent) that a request is dropped part way.
    pub drop_percent: u32,
    /// RSS is taken as the baseline this long after the start.
    pub warmup: Duration,
    pub server: ServerSpec,
}

/// What a soak measured.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SoakReport {
    pub clients: usize,
    pub seconds: f64,
    pub requests: u64,
    pub completed: u64,
    pub dropped: u64,
    pub errors: u64,
    pub error_samples: Vec<String>,
    pub tokens: u64,
    pub rss_loaded_mib: f64,
    pub rss_warm_mib: f64,
    pub rss_end_mib: f64,
    pub rss_growth_percent: f64,
    /// Milliseconds from a drop until `/slots` showed the slot free of the task.
    pub slot_free_ms: Vec<f64>,
    pub slot_free_p50_ms: f64,
    pub slot_free_p95_ms: f64,
    pub slot_free_max_ms: f64,
    pub slot_free_over_50ms: u64,
    /// Drops whose slot could not be told (no chunk named it, or no /slots answer).
    pub slot_free_unmeasured: u64,
}

/// A streaming request's connection, read chunk by chunk.
struct Stream {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Stream {
    fn open(addr: SocketAddr, body: &Value) -> std::io::Result<Stream> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_nodelay(true)?;
        let req = http_request(
            "POST",
            "/completion",
            &[("Content-Type".into(), "application/json".into())],
            &serde_json::to_vec(body).unwrap_or_default(),
            true,
        );
        s.write_all(&req)?;
        s.set_read_timeout(Some(Duration::from_secs(120)))?;
        Ok(Stream { s, buf: Vec::new() })
    }

    /// Read more; Ok(false) at EOF.
    fn read_more(&mut self) -> std::io::Result<bool> {
        let mut chunk = [0u8; 8192];
        loop {
            match self.s.read(&mut chunk) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(true);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// The SSE `data:` events received so far, parsed.
    fn events(&self) -> Vec<Value> {
        let body = super::client::dechunk(self.body());
        String::from_utf8_lossy(&body)
            .split("\n\n")
            .filter_map(|e| e.trim().strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str(d).ok())
            .collect()
    }

    fn body(&self) -> &[u8] {
        match self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
            Some(i) => &self.buf[i + 4..],
            None => &[],
        }
    }

    fn status(&self) -> Option<u16> {
        let line = self.buf.split(|&b| b == b'\n').next()?;
        std::str::from_utf8(line).ok()?.split_whitespace().nth(1)?.parse().ok()
    }
}

/// Whether `body` is a complete chunked body: well-formed chunks up to the
/// final zero chunk, every SSE event in it whole.
pub fn complete_chunked(body: &[u8]) -> bool {
    let mut rest = body;
    let mut data = Vec::new();
    loop {
        let Some(i) = rest.windows(2).position(|w| w == b"\r\n") else {
            return false;
        };
        let Ok(n) = usize::from_str_radix(std::str::from_utf8(&rest[..i]).unwrap_or("x").trim(), 16) else {
            return false;
        };
        if n == 0 {
            return data.is_empty() || data.ends_with(b"\n\n");
        }
        if rest.len() < i + 4 + n || &rest[i + 2 + n..i + 4 + n] != b"\r\n" {
            return false;
        }
        data.extend_from_slice(&rest[i + 2..i + 2 + n]);
        rest = &rest[i + 4 + n..];
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Time until `/slots` shows slot `id_slot` not running `id_task`.
fn slot_free_after(server_addr: SocketAddr, id_slot: u64, id_task: u64, t_drop: Instant) -> Option<f64> {
    let req = http_request("GET", "/slots", &[], b"", true);
    while t_drop.elapsed() < Duration::from_secs(30) {
        let ex = super::client::exchange(server_addr, &req, super::Action::Whole, Duration::from_secs(10));
        let t = t_drop.elapsed();
        if let Ok(Value::Array(slots)) = serde_json::from_slice::<Value>(&super::client::dechunk(&ex.body)) {
            let s = slots.iter().find(|s| s["id"] == json!(id_slot))?;
            if s["is_processing"] != json!(true) || s["id_task"] != json!(id_task) {
                return Some(t.as_secs_f64() * 1000.0);
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

/// The task a slot runs now, from `/slots`.
fn slot_task(server: SocketAddr, id_slot: u64) -> Option<u64> {
    let req = http_request("GET", "/slots", &[], b"", true);
    let ex = super::client::exchange(server, &req, super::Action::Whole, Duration::from_secs(10));
    let v: Value = serde_json::from_slice(&super::client::dechunk(&ex.body)).ok()?;
    let s = v.as_array()?.iter().find(|s| s["id"] == json!(id_slot))?;
    if s["is_processing"] == json!(true) {
        s["id_task"].as_u64()
    } else {
        None
    }
}

const PROMPTS: &[&str] = &[
    "Write a story about a robot.",
    "List the planets of the solar system and describe each.",
    "Explain how a bicycle works.",
    "Once upon a time",
    "The history of Rome begins",
];

/// Run a soak against a server started from `opts.server`.
pub fn soak(opts: &SoakOptions, progress: impl Fn(u64) + Sync) -> Result<SoakReport, HttpFuzzError> {
    let server = ServerProc::start(&opts.server, Duration::from_secs(180))?;
    let addr = server.addr;
    // Client i runs on slot i mod n (its stream's events do not name the
    // slot), so that after a drop the slot to watch is known.
    let n_slots = server
        .get("/props", Duration::from_secs(10))
        .ok()
        .and_then(|(_, b)| serde_json::from_slice::<Value>(&b).ok())
        .and_then(|v| v["total_slots"].as_u64())
        .unwrap_or(1)
        .max(1);
    let report = Mutex::new(SoakReport {
        clients: opts.clients,
        rss_loaded_mib: server.rss_bytes().unwrap_or(0) as f64 / MIB,
        ..Default::default()
    });
    let t0 = Instant::now();
    let stop = AtomicBool::new(false);
    let requests = AtomicU64::new(0);
    let rss_warm = AtomicU64::new(0);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while t0.elapsed() < opts.duration && !stop.load(Ordering::Relaxed) {
                if t0.elapsed() >= opts.warmup && rss_warm.load(Ordering::Relaxed) == 0 {
                    rss_warm.store(server.rss_bytes().unwrap_or(0), Ordering::Relaxed);
                }
                progress(t0.elapsed().as_secs());
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        for client in 0..opts.clients {
            let (report, requests) = (&report, &requests);
            scope.spawn(move || {
                let mut r = mutate_rng(opts.seed, client as u64);
                let id_slot = client as u64 % n_slots;
                while t0.elapsed() < opts.duration {
                    requests.fetch_add(1, Ordering::Relaxed);
                    let n_predict = 8 + r.below(56);
                    let body = json!({"prompt": *r.pick(PROMPTS), "n_predict": n_predict, "stream": true,
                        "temperature": 0.8, "seed": r.below(1 << 20), "id_slot": id_slot});
                    let drop_after = (r.below(100) < opts.drop_percent as usize).then(|| 1 + r.below(n_predict));
                    let mut st = match Stream::open(addr, &body) {
                        Ok(s) => s,
                        Err(e) => {
                            let mut rep = report.lock().unwrap_or_else(|e| e.into_inner());
                            rep.errors += 1;
                            rep.error_samples.push(format!("connect: {e}"));
                            continue;
                        }
                    };
                    let mut outcome: Result<(), String> = Ok(());
                    let mut dropped = false;
                    loop {
                        match st.read_more() {
                            Ok(true) => {}
                            Ok(false) => break,
                            Err(e) => {
                                outcome = Err(format!("read: {e}"));
                                break;
                            }
                        }
                        if let Some(k) = drop_after {
                            let events = st.events();
                            if events.len() >= k && events.last().is_some_and(|e| e["stop"] == json!(false)) {
                                let id_task = slot_task(addr, id_slot);
                                let t_drop = Instant::now();
                                let _ = st.s.shutdown(std::net::Shutdown::Both);
                                let freed = id_task.and_then(|t| slot_free_after(addr, id_slot, t, t_drop));
                                let mut rep = report.lock().unwrap_or_else(|e| e.into_inner());
                                rep.dropped += 1;
                                match freed {
                                    Some(ms) => rep.slot_free_ms.push(ms),
                                    None => rep.slot_free_unmeasured += 1,
                                }
                                dropped = true;
                                break;
                            }
                        }
                    }
                    if dropped {
                        continue;
                    }
                    let events = st.events();
                    let good = outcome.is_ok()
                        && st.status() == Some(200)
                        && complete_chunked(st.body())
                        && events.last().is_some_and(|e| e["stop"] == json!(true));
                    let mut rep = report.lock().unwrap_or_else(|e| e.into_inner());
                    if good {
                        rep.completed += 1;
                        rep.tokens += events.iter().filter(|e| e["stop"] == json!(false)).count() as u64;
                    } else {
                        rep.errors += 1;
                        if rep.error_samples.len() < 10 {
                            let tail =
                                String::from_utf8_lossy(&st.buf[st.buf.len().saturating_sub(300)..]).into_owned();
                            rep.error_samples
                                .push(format!("{outcome:?} status {:?}: {tail}", st.status()));
                        }
                    }
                }
            });
        }
    });
    stop.store(true, Ordering::Relaxed);
    let mut rep = report.into_inner().unwrap_or_else(|e| e.into_inner());
    rep.seconds = t0.elapsed().as_secs_f64();
    rep.requests = requests.load(Ordering::Relaxed);
    server.wait_idle(Duration::from_secs(30));
    rep.rss_warm_mib = rss_warm.load(Ordering::Relaxed) as f64 / MIB;
    rep.rss_end_mib = server.rss_bytes().unwrap_or(0) as f64 / MIB;
    if rep.rss_warm_mib > 0.0 {
        rep.rss_growth_percent = (rep.rss_end_mib / rep.rss_warm_mib - 1.0) * 100.0;
    }
    let mut sorted = rep.slot_free_ms.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    rep.slot_free_p50_ms = percentile(&sorted, 0.5);
    rep.slot_free_p95_ms = percentile(&sorted, 0.95);
    rep.slot_free_max_ms = sorted.last().copied().unwrap_or(0.0);
    rep.slot_free_over_50ms = sorted.iter().filter(|&&m| m >= 50.0).count() as u64;
    Ok(rep)
}

/// Shutdown trial parameters.
#[derive(Debug, Clone)]
pub struct ShutdownOptions {
    pub trials: usize,
    /// Streams running when the signal comes.
    pub streams: usize,
    /// The server's `--shutdown-timeout`, in seconds (it must be among `server.args`).
    pub grace: Duration,
    /// Signal name for kill(1): TERM or INT.
    pub signal: String,
    /// Also run one trial with a second signal 200 ms after the first.
    pub second_signal_trial: bool,
    pub server: ServerSpec,
}

/// One trial.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ShutdownTrial {
    pub second_signal: bool,
    pub exit_code: Option<i32>,
    /// Seconds from the signal to the exit (None: not within grace + 5 s).
    pub exit_s: Option<f64>,
    /// Streams that ended with a final event (an error naming the shutdown, or the last token).
    pub streams_final_event: usize,
    /// Streams whose chunked body was complete (no event cut in half).
    pub streams_complete: usize,
    /// A new request 300 ms after the signal was refused (503, or no connection).
    pub refused_new_connections: bool,
    pub final_events: Vec<String>,
}

/// What the trials measured.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ShutdownReport {
    pub grace_s: f64,
    pub streams: usize,
    pub trials: Vec<ShutdownTrial>,
    /// Graceful trials that exited 0 within grace + 1 s, every stream with a
    /// final event and a complete body.
    pub passed: usize,
    pub max_exit_s: f64,
}

/// Run the shutdown trials.
pub fn shutdown_trials(opts: &ShutdownOptions, progress: impl Fn(u64)) -> Result<ShutdownReport, HttpFuzzError> {
    let mut rep = ShutdownReport {
        grace_s: opts.grace.as_secs_f64(),
        streams: opts.streams,
        ..Default::default()
    };
    let n = opts.trials + usize::from(opts.second_signal_trial);
    for t in 0..n {
        progress(t as u64);
        let second = t >= opts.trials;
        let mut spec = opts.server.clone();
        spec.log = spec.log.with_file_name(format!("server-trial{}.log", t + 1));
        let mut server = ServerProc::start(&spec, Duration::from_secs(180))?;
        let addr = server.addr;
        // Long streams: far more tokens than the grace period allows.
        let mut streams = Vec::new();
        for i in 0..opts.streams {
            let body = json!({"prompt": PROMPTS[i % PROMPTS.len()], "n_predict": 100_000, "stream": true,
                "ignore_eos": true, "temperature": 0.8, "seed": i});
            streams.push(Stream::open(addr, &body).map_err(|e| HttpFuzzError::Server(format!("stream: {e}")))?);
        }
        // Each stream has its first tokens before the signal.
        for s in &mut streams {
            while s.events().is_empty() {
                if !s.read_more().unwrap_or(false) {
                    break;
                }
            }
        }
        let t_sig = Instant::now();
        server
            .signal(&opts.signal)
            .map_err(|e| HttpFuzzError::Server(format!("signal: {e}")))?;
        if second {
            std::thread::sleep(Duration::from_millis(200));
            let _ = server.signal(&opts.signal);
        }
        let readers: Vec<_> = streams
            .into_iter()
            .map(|mut s| {
                std::thread::spawn(move || {
                    let _ = s.s.set_read_timeout(Some(Duration::from_secs(60)));
                    while let Ok(true) = s.read_more() {}
                    s
                })
            })
            .collect();
        // A new request 300 ms after the signal is refused: 503, or no connection.
        let probe = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300).saturating_sub(t_sig.elapsed()));
            let req = http_request("GET", "/health", &[], b"", true);
            match super::client::exchange(addr, &req, super::Action::Whole, Duration::from_secs(5)).outcome {
                super::client::Outcome::Answered { status, .. } => status == 503,
                super::client::Outcome::ConnectFailed(_) | super::client::Outcome::Closed => true,
                _ => false,
            }
        });
        let status = server.wait_exit(opts.grace + Duration::from_secs(5));
        let exit_s = status.map(|_| t_sig.elapsed().as_secs_f64());
        let refused = probe.join().unwrap_or(false);
        let mut trial = ShutdownTrial {
            second_signal: second,
            exit_code: status.and_then(|s| s.code()),
            exit_s,
            refused_new_connections: refused,
            ..Default::default()
        };
        for r in readers {
            let Ok(s) = r.join() else { continue };
            let events = s.events();
            let last = events.last().cloned().unwrap_or(Value::Null);
            let final_event = last.get("error").is_some() || last["stop"] == json!(true);
            trial.streams_final_event += usize::from(final_event);
            trial.streams_complete += usize::from(complete_chunked(s.body()));
            let text = last.to_string();
            trial.final_events.push(text.chars().take(200).collect());
        }
        if !second
            && trial.exit_code == Some(0)
            && exit_s.is_some_and(|e| e <= rep.grace_s + 1.0)
            && trial.streams_final_event == opts.streams
            && trial.streams_complete == opts.streams
        {
            rep.passed += 1;
        }
        if !second {
            rep.max_exit_s = rep.max_exit_s.max(exit_s.unwrap_or(f64::INFINITY));
        }
        rep.trials.push(trial);
        drop(server);
    }
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_completeness() {
        assert!(!complete_chunked(b"6\r\ndata: \r\n0\r\n\r\n"));
        assert!(complete_chunked(b"9\r\ndata: x\n\n\r\n0\r\n\r\n"));
        assert!(!complete_chunked(b"9\r\ndata: x\n\n\r\n"));
        assert!(!complete_chunked(b"8\r\ndata"));
    }
}
