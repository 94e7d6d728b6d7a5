//! The results summary (`bench/results/summary.json`): one [`Row`] per
//! measured configuration, its file, and the rows made from benchmark
//! outputs ([`source`]) and rendered as tables ([`render`]).
//!
//! The schema is documented in `docs/results-schema.md`.

pub mod render;
pub mod source;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Errors of reading, building or writing the summary.
#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("{path} is not {what}: {source}")]
    Parse {
        path: PathBuf,
        what: &'static str,
        source: serde_json::Error,
    },
    #[error("{path}: {message}")]
    Input { path: PathBuf, message: String },
    #[error("{0}")]
    Options(String),
}

/// Bytes for one device, or per device for several.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Bytes {
    One(u64),
    PerDevice(Vec<u64>),
}

impl Bytes {
    /// The largest figure (the one device's, or the largest device's).
    pub fn max(&self) -> u64 {
        match self {
            Bytes::One(b) => *b,
            Bytes::PerDevice(v) => v.iter().copied().max().unwrap_or(0),
        }
    }

    /// Whether any device's figure exceeds its budget.
    pub fn exceeds(&self, budget: &Bytes) -> bool {
        match (self, budget) {
            (Bytes::PerDevice(p), Bytes::PerDevice(b)) => p.iter().zip(b).any(|(p, b)| p > b),
            _ => self.max() > budget.max(),
        }
    }
}

/// One measured configuration (`docs/results-schema.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The run on one GPU host these figures come from (date and a letter).
    pub call: String,
    /// `R1`…`R5` for the reference cases, else a short name.
    pub case: String,
    /// The synth preset's name, or the GGUF's `general.name`.
    pub model: String,
    /// Upper case: `Q4_0`, `Q4_K_M`, `MXFP4`, ...
    pub quant: String,
    /// MoE only: `calibrated`, `synthetic` or `uniform`; null for dense models.
    pub routing: Option<String>,
    /// `pipeshard`, `upstream-fit`, `upstream-full`, `upstream-ncmoe-N`, ...
    pub system: String,
    /// `bench`, `run` or `server`.
    pub entry: String,
    /// The budget (per device for several); null: no budget.
    pub budget_bytes: Option<Bytes>,
    pub devices: u32,
    pub threads: u32,
    pub prompt_tokens: u32,
    pub gen_tokens: u32,
    pub depth: u32,
    /// The ubatch the prompt ran with, where known.
    #[serde(default)]
    pub ubatch: Option<u32>,
    /// Concurrent requests (1 outside the server).
    pub clients: u32,
    /// Every non-default flag and environment variable the harness set.
    pub flags: String,
    /// What the plan, the tuner or upstream's fit chose, in words.
    pub setting: String,
    /// Time to first token of the prompt; null where not measured.
    pub ttft_s: Option<f64>,
    /// Decode tokens per second: llama-bench's tg at the depth for `bench`;
    /// for `server`, all clients' decoded tokens over the longest client's
    /// decode time.
    pub decode_tok_s: Option<f64>,
    /// pipeshard bench only: the decode right after each timed prompt (the
    /// first steps rebuild the decode graph), the median over the reps.
    #[serde(default)]
    pub decode_after_prompt_tok_s: Option<f64>,
    /// Repetitions behind the figures (each figure is their median).
    pub reps: u32,
    /// Measurements within each repetition (llama-bench's `-r`, pipeshard
    /// bench's `-r`), averaged (llama-bench) or their median (pipeshard)
    /// into the repetition's figure.
    #[serde(default = "one")]
    pub samples_per_rep: u32,
    /// The process's device memory peak (NVML for the process), the largest
    /// over the repetitions; per device for several.
    pub peak_process_bytes: Option<Bytes>,
    /// `peak_process_bytes` > `budget_bytes`.
    pub over_budget: bool,
    /// For `calibrated`/`uniform`: measured reuse and hit rates.
    #[serde(default)]
    pub routing_stats: Option<serde_json::Value>,
    /// GPU, CPU, PCIe, driver.
    pub host: String,
    /// The project commit measured.
    pub commit: String,
    /// The exact command line of one repetition.
    pub command: String,
    /// Path of the raw log under `bench/results/`.
    pub raw: Option<String>,
    /// Anything a reader must know to read the figures right.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

fn one() -> u32 {
    1
}

/// What makes two rows the same configuration: a row with the same key
/// replaces the old one.
#[derive(Debug, PartialEq)]
pub struct RowKey<'a> {
    call: &'a str,
    case: &'a str,
    model: &'a str,
    quant: &'a str,
    routing: Option<&'a str>,
    system: &'a str,
    entry: &'a str,
    budget_bytes: Option<&'a Bytes>,
    clients: u32,
    flags: &'a str,
}

impl Row {
    pub fn key(&self) -> RowKey<'_> {
        RowKey {
            call: &self.call,
            case: &self.case,
            model: &self.model,
            quant: &self.quant,
            routing: self.routing.as_deref(),
            system: &self.system,
            entry: &self.entry,
            budget_bytes: self.budget_bytes.as_ref(),
            clients: self.clients,
            flags: &self.flags,
        }
    }
}

/// The summary file's rows, in order.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Summary {
    pub rows: Vec<Row>,
}

/// What [`Summary::upsert`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upsert {
    Replaced,
    Appended,
}

impl Summary {
    /// Read `path`; a file that does not exist is an empty summary.
    pub fn load(path: &Path) -> Result<Summary, ResultsError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Summary::default()),
            Err(source) => {
                return Err(ResultsError::Read {
                    path: path.into(),
                    source,
                })
            }
        };
        let rows = serde_json::from_str(&text).map_err(|source| ResultsError::Parse {
            path: path.into(),
            what: "a results summary (a JSON array of rows, docs/results-schema.md)",
            source,
        })?;
        Ok(Summary { rows })
    }

    /// Write the rows as a pretty JSON array, through a temporary file.
    pub fn save(&self, path: &Path) -> Result<(), ResultsError> {
        let mut text = serde_json::to_string_pretty(&self.rows).expect("rows serialize");
        text.push('\n');
        write_atomic(path, &text)
    }

    /// Replace the row with `row`'s key, else append `row`.
    pub fn upsert(&mut self, row: Row) -> Upsert {
        match self.rows.iter_mut().find(|r| r.key() == row.key()) {
            Some(old) => {
                *old = row;
                Upsert::Replaced
            }
            None => {
                self.rows.push(row);
                Upsert::Appended
            }
        }
    }
}

/// Write `text` to `path` through a temporary file beside it.
pub fn write_atomic(path: &Path, text: &str) -> Result<(), ResultsError> {
    let tmp = path.with_extension("tmp");
    let err = |source| ResultsError::Write {
        path: path.into(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    std::fs::write(&tmp, text).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

/// The summary's spelling of a quantization from llama.cpp's description of
/// a model (`llama_model_desc`: architecture, size, file type, as in
/// "llama 8B Q4_K - Medium"): `Q4_K_M`. `None` when the description has no
/// file type.
pub fn quant_from_description(desc: &str) -> Option<String> {
    let mut words = desc.splitn(3, ' ');
    let ftype = words.nth(2)?.trim_end_matches(" (guessed)").trim();
    let name = match ftype.split_once(" - ") {
        Some((base, "Small")) => format!("{base}_S"),
        Some((base, "Medium")) if base != "Q2_K" => format!("{base}_M"),
        Some((base, "Large")) => format!("{base}_L"),
        _ if ftype.starts_with("IQ3_S mix") => "IQ3_M".into(),
        _ if ftype == "all F32" => "F32".into(),
        _ => ftype.split_whitespace().next()?.to_string(),
    };
    Some(name)
}
