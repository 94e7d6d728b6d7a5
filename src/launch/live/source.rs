//! Where the card's memory figures come from: NVML on a real card, or a
//! scripted trace (a file of timed samples, for example one recorded by a
//! server on the GPU machine) that drives the same loop in CPU tests.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::engine;
use crate::plan::parse_bytes;

/// The environment variable naming a trace that replaces NVML as the
/// source of the card's memory figures (see [`TraceSource`]).
pub const TRACE_ENV: &str = "PIPESHARD_FREE_MEMORY_TRACE";

/// One reading of the card's memory, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CardSample {
    /// The card's memory.
    pub total: u64,
    /// What every other process holds (and the driver for none).
    pub others: u64,
    /// What this process holds, where the source knows it.
    pub own: Option<u64>,
}

impl CardSample {
    /// What this process may use: the card less every other process's use
    /// and `headroom`.
    pub fn allowance(&self, headroom: u64) -> u64 {
        self.total.saturating_sub(self.others).saturating_sub(headroom)
    }
}

/// A source of [`CardSample`]s, asked by the re-plan loop every
/// [`super::hysteresis::SAMPLE_EVERY`].
pub trait FreeMemorySource: Send {
    /// The card now; None when it cannot be read (the loop then keeps the
    /// plan it has).
    fn sample(&mut self) -> Option<CardSample>;
}

/// The card as NVML reports it (every process's use, this one's apart).
pub struct NvmlSource;

impl FreeMemorySource for NvmlSource {
    fn sample(&mut self) -> Option<CardSample> {
        engine::nvml::card_usage().map(|u| CardSample {
            total: u.total,
            others: u.others,
            own: Some(u.own),
        })
    }
}

/// Why a trace cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("reading the free-memory trace {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("free-memory trace line {line}: {message}")]
    Parse { line: usize, message: String },
    #[error("the free-memory trace has no samples")]
    Empty,
}

/// One timed row of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRow {
    /// Time since the trace started.
    pub at: Duration,
    pub sample: CardSample,
}

/// A scripted card: rows of `SECONDS TOTAL OTHERS [OWN]` (sizes as
/// `--vram-budget` takes them, `#` starts a comment, further columns are
/// ignored, so a trace the server records replays as is). At time t the
/// card is the last row at or before t; the first row holds before it.
#[derive(Debug, Clone)]
pub struct TraceSource {
    rows: Vec<TraceRow>,
    start: Instant,
}

impl TraceSource {
    /// Parse a trace's text.
    pub fn parse(text: &str) -> Result<TraceSource, TraceError> {
        let mut rows: Vec<TraceRow> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let err = |message: String| TraceError::Parse { line: i + 1, message };
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() < 3 {
                return Err(err(format!("expected SECONDS TOTAL OTHERS [OWN], got {line:?}")));
            }
            let secs: f64 = cols[0]
                .parse()
                .ok()
                .filter(|s: &f64| s.is_finite() && *s >= 0.0)
                .ok_or_else(|| err(format!("not a time in seconds: {:?}", cols[0])))?;
            let size = |s: &str| parse_bytes(s).map_err(|e| err(e.to_string()));
            let sample = CardSample {
                total: size(cols[1])?,
                others: size(cols[2])?,
                own: cols.get(3).map(|s| size(s)).transpose()?,
            };
            if sample.others > sample.total {
                return Err(err("others use more than the card has".into()));
            }
            let at = Duration::from_secs_f64(secs);
            if rows.last().is_some_and(|r| r.at > at) {
                return Err(err("times must not decrease".into()));
            }
            rows.push(TraceRow { at, sample });
        }
        if rows.is_empty() {
            return Err(TraceError::Empty);
        }
        Ok(TraceSource {
            rows,
            start: Instant::now(),
        })
    }

    /// Read and parse the trace at `path`.
    pub fn load(path: &Path) -> Result<TraceSource, TraceError> {
        let text = std::fs::read_to_string(path).map_err(|source| TraceError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text)
    }

    /// The card `at` after the trace started.
    pub fn at(&self, at: Duration) -> CardSample {
        let i = self.rows.partition_point(|r| r.at <= at);
        self.rows[i.saturating_sub(1)].sample
    }

    /// The trace's rows.
    pub fn rows(&self) -> &[TraceRow] {
        &self.rows
    }
}

impl FreeMemorySource for TraceSource {
    fn sample(&mut self) -> Option<CardSample> {
        Some(self.at(self.start.elapsed()))
    }
}

/// The source the re-plan loop uses: the trace [`TRACE_ENV`] names, or
/// NVML.
pub fn from_env() -> Result<Box<dyn FreeMemorySource>, TraceError> {
    match std::env::var_os(TRACE_ENV) {
        Some(p) if !p.is_empty() => Ok(Box::new(TraceSource::load(Path::new(&p))?)),
        _ => Ok(Box::new(NvmlSource)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn traces_parse_and_hold_each_row_until_the_next() {
        let t = TraceSource::parse(
            "# t total others own\n0 80GiB 70GiB\n1.5 80GiB 72GiB 6GiB # the filler takes 2 GiB\n3 80GiB 70GiB 5GiB extra columns\n",
        )
        .unwrap();
        assert_eq!(t.rows().len(), 3);
        assert_eq!(t.at(Duration::ZERO).others, 70 * GIB);
        assert_eq!(t.at(Duration::from_millis(1499)).others, 70 * GIB);
        let s = t.at(Duration::from_millis(1500));
        assert_eq!((s.others, s.own), (72 * GIB, Some(6 * GIB)));
        assert_eq!(t.at(Duration::from_secs(100)).others, 70 * GIB);
        assert_eq!(s.allowance(GIB), 7 * GIB);
        assert_eq!(s.allowance(100 * GIB), 0);
    }

    #[test]
    fn bad_traces_fail_with_the_line() {
        for (text, line) in [
            ("0 80GiB\n", 1),
            ("0 80GiB 70GiB\nx 80GiB 1GiB\n", 2),
            ("0 80GiB 70GiB\n-1 80GiB 1GiB\n", 2),
            ("0 80GiB 90GiB\n", 1),
            ("1 80GiB 1GiB\n0 80GiB 1GiB\n", 2),
            ("0 80XB 1GiB\n", 1),
        ] {
            match TraceSource::parse(text) {
                Err(TraceError::Parse { line: l, .. }) => assert_eq!(l, line, "{text:?}"),
                other => panic!("{text:?}: {other:?}"),
            }
        }
        assert!(matches!(TraceSource::parse("# nothing\n"), Err(TraceError::Empty)));
    }
}
