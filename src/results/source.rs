//! A summary row from benchmark outputs: one file per repetition, written
//! by `pipeshard bench` (its `bench.json`) or by upstream's `llama-bench -o
//! json`; the row's figures are the medians over the files.

use std::path::{Path, PathBuf};

use pipeshard_devtools::synth::NAME_PREFIX;
use serde::Deserialize;

use super::{quant_from_description, Bytes, ResultsError, Row};
use crate::bench::routing_stats::RoutingStats;
use crate::bench::{median, BenchRow, Policy};

/// Which program wrote the repetition files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// `pipeshard bench`'s `bench.json` (run with `--tg` for a `bench` row).
    PipeshardBench,
    /// Upstream's `llama-bench -o json`.
    LlamaBench,
}

/// What the row is and what the files do not say.
#[derive(Debug, Clone)]
pub struct AddOptions {
    pub call: String,
    pub case: String,
    pub system: String,
    pub entry: String,
    pub format: Format,
    pub routing: Option<String>,
    /// The budget; for `pipeshard bench` files also which of their rows.
    pub budget: Option<u64>,
    /// Replace the files' flags (llama-bench's hold none).
    pub flags: Option<String>,
    /// Replace the files' command line (required for llama-bench's).
    pub command: Option<String>,
    pub raw: Option<String>,
    pub host: Option<String>,
    /// The process peaks measured outside the program, one per repetition
    /// (the row takes the largest); replace the files' own.
    pub peak_bytes: Vec<u64>,
    pub model: Option<String>,
    pub quant: Option<String>,
    pub setting: Option<String>,
    pub commit: Option<String>,
    pub devices: u32,
    pub clients: u32,
    pub note: Option<String>,
}

/// One repetition's figures and settings, read from one file.
#[derive(Debug, Clone, PartialEq)]
struct Rep {
    model: String,
    quant: Option<String>,
    threads: u32,
    prompt_tokens: u32,
    gen_tokens: u32,
    depth: u32,
    ubatch: Option<u32>,
    setting: String,
    ttft_s: Option<f64>,
    decode_tok_s: Option<f64>,
    decode_after_prompt_tok_s: Option<f64>,
    samples: u32,
    peak: Option<u64>,
    budget: Option<u64>,
    host: String,
    commit: String,
    command: String,
    flags: String,
    /// `pipeshard bench --routing`'s point and the routing it measured.
    routing: Option<String>,
    routing_stats: Option<RoutingStats>,
}

/// The `pipeshard bench` policy a system's row is read from.
fn policy_of(system: &str) -> Option<Policy> {
    Some(match system {
        "pipeshard" => Policy::Pipeshard,
        "pipeshard-exact" => Policy::PipeshardExact,
        "pipeshard-sync" => Policy::PipeshardSync,
        "upstream-fit" => Policy::Fit,
        "upstream-ngl" => Policy::Ngl,
        "upstream-attn-gpu" | "upstream-cpu-moe" => Policy::AttnGpu,
        "upstream-full" => Policy::FullGpu,
        _ => return None,
    })
}

fn input(path: &Path, message: impl Into<String>) -> ResultsError {
    ResultsError::Input {
        path: path.into(),
        message: message.into(),
    }
}

fn read(path: &Path) -> Result<String, ResultsError> {
    std::fs::read_to_string(path).map_err(|source| ResultsError::Read {
        path: path.into(),
        source,
    })
}

/// The row of `policy` (at `budget` if given) in a `bench.json`.
fn pipeshard_rep(path: &Path, opts: &AddOptions) -> Result<Rep, ResultsError> {
    let policy = policy_of(&opts.system).ok_or_else(|| {
        ResultsError::Options(format!(
            "system {:?} has no pipeshard bench policy (pipeshard, pipeshard-exact, pipeshard-sync, \
             upstream-fit, upstream-ngl, upstream-attn-gpu, upstream-cpu-moe, upstream-full)",
            opts.system
        ))
    })?;
    let rows: Vec<BenchRow> = serde_json::from_str(&read(path)?).map_err(|source| ResultsError::Parse {
        path: path.into(),
        what: "pipeshard bench's bench.json",
        source,
    })?;
    let mut found = rows
        .into_iter()
        .filter(|r| r.policy == policy && opts.budget.map_or(true, |b| r.budget == b));
    let row = found
        .next()
        .ok_or_else(|| input(path, format!("no {policy:?} row{}", at_budget(opts.budget))))?;
    if found.next().is_some() {
        return Err(input(
            path,
            format!("several {policy:?} rows: pass --budget to choose one"),
        ));
    }
    if let Some(e) = &row.error {
        return Err(input(path, format!("the {policy:?} row failed: {e}")));
    }
    let run = row
        .run
        .ok_or_else(|| input(path, "the row has no run fields (written by an older pipeshard bench)"))?;
    if opts.entry == "bench" && row.tg_tok_s.is_none() {
        return Err(input(
            path,
            "no tg figure at the depth: a bench row needs pipeshard bench --tg",
        ));
    }
    let decode_tok_s = if opts.entry == "bench" {
        row.tg_tok_s
    } else {
        Some(row.decode_tok_s)
    };
    Ok(Rep {
        model: run.model,
        quant: row.quant,
        threads: run.threads.max(0) as u32,
        prompt_tokens: run.prompt_tokens,
        gen_tokens: run.gen_tokens,
        depth: run.depth,
        ubatch: Some(row.ubatch).filter(|&u| u > 0),
        setting: row.setting,
        ttft_s: Some(row.ttft_s),
        decode_tok_s,
        decode_after_prompt_tok_s: (opts.entry == "bench").then_some(row.decode_tok_s),
        samples: row.repetitions,
        // No source: nothing measured it (no GPU).
        peak: row.peak_source.map(|_| row.peak_vram),
        budget: (policy != Policy::FullGpu).then_some(row.budget),
        host: run.host,
        commit: run.commit,
        command: run.command,
        flags: run.flags,
        routing: run.routing,
        routing_stats: row.routing_stats,
    })
}

fn at_budget(budget: Option<u64>) -> String {
    budget.map_or(String::new(), |b| format!(" at {b} bytes"))
}

/// One test of `llama-bench -o json` (the fields a row needs).
#[derive(Debug, Deserialize)]
struct LlamaBenchTest {
    #[serde(default)]
    cpu_info: String,
    #[serde(default)]
    gpu_info: String,
    #[serde(default)]
    model_filename: String,
    #[serde(default)]
    model_type: String,
    n_ubatch: u32,
    n_threads: u32,
    n_gpu_layers: i64,
    #[serde(default)]
    n_cpu_moe: i64,
    #[serde(default)]
    tensor_buft_overrides: String,
    #[serde(default)]
    fit_target: i64,
    n_prompt: u32,
    n_gen: u32,
    n_depth: u32,
    avg_ns: u64,
    avg_ts: f64,
    #[serde(default)]
    samples_ns: Vec<u64>,
}

impl LlamaBenchTest {
    /// The placement in llama-bench's own terms (non-default knobs only).
    fn setting(&self) -> String {
        let mut s = vec![format!("ngl {}", self.n_gpu_layers)];
        if self.fit_target > 0 {
            s.push(format!("fitt {} MiB", self.fit_target));
        }
        if self.n_cpu_moe > 0 {
            s.push(format!("ncmoe {}", self.n_cpu_moe));
        }
        if !self.tensor_buft_overrides.is_empty() && self.tensor_buft_overrides != "none" {
            s.push(format!("ot {}", self.tensor_buft_overrides));
        }
        s.push(format!("ub {}", self.n_ubatch));
        s.join(", ")
    }
}

/// The model's name: the GGUF's, where the file is here to read, else the
/// file's stem.
fn model_of(filename: &str) -> String {
    let path = Path::new(filename);
    if let Ok((_, info)) = crate::gguf::inspect(path) {
        if let Some(n) = info.name {
            return n.strip_prefix(NAME_PREFIX).unwrap_or(&n).to_string();
        }
    }
    path.file_stem()
        .map_or(String::new(), |s| s.to_string_lossy().into_owned())
}

/// The tg test (decode at a depth) and the pp test (the prompt, TTFT) of a
/// llama-bench output: at most one of each, at least one.
fn llama_bench_rep(path: &Path) -> Result<Rep, ResultsError> {
    let tests: Vec<LlamaBenchTest> = serde_json::from_str(&read(path)?).map_err(|source| ResultsError::Parse {
        path: path.into(),
        what: "llama-bench's JSON output (-o json)",
        source,
    })?;
    let pick = |tg: bool| -> Result<Option<&LlamaBenchTest>, ResultsError> {
        let mut it = tests.iter().filter(|t| {
            if tg {
                t.n_gen > 0 && t.n_prompt == 0
            } else {
                t.n_prompt > 0 && t.n_gen == 0
            }
        });
        let first = it.next();
        if it.next().is_some() {
            let kind = if tg { "tg" } else { "pp" };
            return Err(input(path, format!("several {kind} tests: one file per configuration")));
        }
        Ok(first)
    };
    let (tg, pp) = (pick(true)?, pick(false)?);
    let t = tg
        .or(pp)
        .ok_or_else(|| input(path, "no pp (-p N -n 0) or tg (-p 0 -n N) test"))?;
    let samples = tg.or(pp).map_or(1, |t| t.samples_ns.len().max(1) as u32);
    Ok(Rep {
        model: model_of(&t.model_filename),
        quant: quant_from_description(&t.model_type),
        threads: t.n_threads,
        prompt_tokens: pp.map_or(t.n_depth, |p| p.n_prompt),
        gen_tokens: tg.map_or(0, |t| t.n_gen),
        depth: tg.map_or(0, |t| t.n_depth),
        ubatch: Some(pp.unwrap_or(t).n_ubatch),
        setting: t.setting(),
        ttft_s: pp.map(|p| p.avg_ns as f64 / 1e9),
        decode_tok_s: tg.map(|t| t.avg_ts),
        decode_after_prompt_tok_s: None,
        samples,
        peak: None,
        budget: None,
        host: [t.gpu_info.as_str(), t.cpu_info.as_str()]
            .iter()
            .filter(|s| !s.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join("; "),
        commit: env!("PIPESHARD_COMMIT").to_string(),
        command: String::new(),
        flags: String::new(),
        routing: None,
        routing_stats: None,
    })
}

/// The value all repetitions share, or an error naming the field.
fn same<T: PartialEq + Clone + std::fmt::Debug>(
    reps: &[(PathBuf, Rep)],
    field: &str,
    get: impl Fn(&Rep) -> T,
) -> Result<T, ResultsError> {
    let first = get(&reps[0].1);
    for (path, r) in &reps[1..] {
        if get(r) != first {
            return Err(input(
                path,
                format!("{field} is {:?}, the first repetition's {:?}", get(r), first),
            ));
        }
    }
    Ok(first)
}

fn median_of(reps: &[(PathBuf, Rep)], get: impl Fn(&Rep) -> Option<f64>) -> Option<f64> {
    let v: Vec<f64> = reps.iter().filter_map(|(_, r)| get(r)).collect();
    (!v.is_empty()).then(|| median(v))
}

/// The routing statistics of the repetitions that measured them, each
/// field the median of theirs.
fn routing_stats_of(reps: &[(PathBuf, Rep)]) -> Option<serde_json::Value> {
    let stats: Vec<&RoutingStats> = reps.iter().filter_map(|(_, r)| r.routing_stats.as_ref()).collect();
    let first = stats.first()?;
    let med = |f: fn(&RoutingStats) -> f64| median(stats.iter().map(|s| f(s)).collect());
    serde_json::to_value(RoutingStats {
        reuse: med(|s| s.reuse),
        lru_hit_12_5: med(|s| s.lru_hit_12_5),
        lru_hit_25: med(|s| s.lru_hit_25),
        experts_90: med(|s| s.experts_90),
        top_share: med(|s| s.top_share),
        ..**first
    })
    .ok()
}

/// The row of `files` (one per repetition) under `opts`.
pub fn row_from_files(files: &[PathBuf], opts: &AddOptions) -> Result<Row, ResultsError> {
    if files.is_empty() {
        return Err(ResultsError::Options("no repetition files".into()));
    }
    if opts.format == Format::LlamaBench && opts.command.is_none() {
        return Err(ResultsError::Options(
            "llama-bench's JSON does not hold its command line: pass --command".into(),
        ));
    }
    let reps = files
        .iter()
        .map(|f| {
            let rep = match opts.format {
                Format::PipeshardBench => pipeshard_rep(f, opts),
                Format::LlamaBench => llama_bench_rep(f),
            }?;
            Ok((f.clone(), rep))
        })
        .collect::<Result<Vec<_>, ResultsError>>()?;
    let quant = match &opts.quant {
        Some(q) => q.to_uppercase(),
        None => same(&reps, "the quantization", |r| r.quant.clone())?
            .ok_or_else(|| ResultsError::Options("the files name no quantization: pass --quant".into()))?,
    };
    let budget = opts.budget.or(same(&reps, "the budget", |r| r.budget)?);
    let peak = if opts.peak_bytes.is_empty() {
        reps.iter().filter_map(|(_, r)| r.peak).max()
    } else {
        opts.peak_bytes.iter().copied().max()
    };
    let settings: Vec<String> = reps.iter().map(|(_, r)| r.setting.clone()).collect();
    let setting = match &opts.setting {
        Some(s) => s.clone(),
        None if settings.iter().all(|s| *s == settings[0]) => settings[0].clone(),
        None => settings
            .iter()
            .enumerate()
            .map(|(i, s)| format!("rep {}: {s}", i + 1))
            .collect::<Vec<_>>()
            .join("; "),
    };
    let budget_bytes = budget.map(Bytes::One);
    let peak_process_bytes = peak.map(Bytes::One);
    let over_budget = matches!((&peak_process_bytes, &budget_bytes), (Some(p), Some(b)) if p.exceeds(b));
    Ok(Row {
        call: opts.call.clone(),
        case: opts.case.clone(),
        model: match &opts.model {
            Some(m) => m.clone(),
            None => same(&reps, "the model", |r| r.model.clone())?,
        },
        quant,
        routing: match &opts.routing {
            Some(r) => Some(r.clone()),
            None => same(&reps, "the routing point", |r| r.routing.clone())?,
        },
        system: opts.system.clone(),
        entry: opts.entry.clone(),
        budget_bytes,
        devices: opts.devices,
        threads: same(&reps, "the threads", |r| r.threads)?,
        prompt_tokens: same(&reps, "the prompt", |r| r.prompt_tokens)?,
        gen_tokens: same(&reps, "the generated tokens", |r| r.gen_tokens)?,
        depth: same(&reps, "the depth", |r| r.depth)?,
        ubatch: same(&reps, "the ubatch", |r| r.ubatch)?,
        clients: opts.clients,
        flags: match &opts.flags {
            Some(f) => f.clone(),
            None => same(&reps, "the flags", |r| r.flags.clone())?,
        },
        setting,
        ttft_s: median_of(&reps, |r| r.ttft_s),
        decode_tok_s: median_of(&reps, |r| r.decode_tok_s),
        decode_after_prompt_tok_s: median_of(&reps, |r| r.decode_after_prompt_tok_s),
        reps: reps.len() as u32,
        samples_per_rep: same(&reps, "the samples per repetition", |r| r.samples)?,
        peak_process_bytes,
        over_budget,
        routing_stats: routing_stats_of(&reps),
        host: opts.host.clone().unwrap_or_else(|| reps[0].1.host.clone()),
        commit: opts.commit.clone().unwrap_or_else(|| reps[0].1.commit.clone()),
        command: opts.command.clone().unwrap_or_else(|| reps[0].1.command.clone()),
        raw: opts.raw.clone(),
        note: opts.note.clone(),
    })
}
