//! pipeshard's own options, one definition for every command that loads a
//! model: `run`, `plan`, `bench`, `lossless`, `serve` and `pipeshard-server`.

use std::path::PathBuf;

use crate::engine;
use crate::plan;

use super::devices::{self, BudgetList, DeviceBudget, Headroom};
use super::LaunchError;

/// Options that decide where weights go. Each has a `PIPESHARD_*`
/// environment variable, as llama.cpp's flags have `LLAMA_ARG_*`.
#[derive(clap::Args, Clone, Debug)]
pub struct PipeshardOptions {
    /// Hard VRAM budget for the whole process as nvidia-smi shows it, e.g.
    /// 4GiB or 2048MiB; `auto` takes what is free on the card now, minus
    /// a margin. `bench` takes a comma-separated list. One budget per
    /// device: `CUDA0=10GiB,CUDA1=6GiB` (ggml's device names; a device not
    /// listed is not used): `run`, `plan` and the server split the layers
    /// across them in the order given (llama.cpp's `-sm layer`).
    #[arg(long = "vram-budget", env = "PIPESHARD_VRAM_BUDGET", value_parser = check_budgets)]
    pub vram_budget: Option<String>,
    /// With `--vram-budget auto`: device memory left free for other
    /// programs, e.g. 1GiB. `serve` and `run` follow the card while they
    /// run: the budget is the card's memory less every other process's use
    /// and this headroom. Default: 5% of the card, at least 512 MiB. One
    /// per device: `CUDA0=1GiB,CUDA1=512MiB`.
    #[arg(long = "vram-headroom", env = "PIPESHARD_VRAM_HEADROOM", value_parser = Headroom::parse)]
    pub vram_headroom: Option<Headroom>,
    /// Machine profile (YAML); default: the one matching this machine in
    /// the profile directory ($PIPESHARD_PROFILE_DIR, else pipeshard/profiles
    /// in the user's data directory), measured on first use.
    #[arg(long = "profile", env = "PIPESHARD_PROFILE")]
    pub profile: Option<PathBuf>,
    /// A saved plan (YAML or JSON from `pipeshard plan`) to use as is.
    #[arg(long = "plan", env = "PIPESHARD_PLAN")]
    pub plan: Option<PathBuf>,
    /// Device slots through which host weights stream to the GPU, copied ahead
    /// of use on their own stream; 0 plans for llama.cpp's synchronous copy per op.
    #[arg(long = "stream-slots", env = "PIPESHARD_STREAM_SLOTS", default_value_t = plan::DEFAULT_STREAM_SLOTS,
          value_parser = clap::value_parser!(u32).range(0..=8))]
    pub stream_slots: u32,
    /// Hybrid experts: how many of each token's routed experts the GPU
    /// computes in decode, copying only those, while the CPU computes the
    /// others (MoE layers whose experts stay in host memory); 0 turns the
    /// split off. Default: the cost model's choice.
    #[arg(long = "hybrid-experts", env = "PIPESHARD_HYBRID_EXPERTS")]
    pub hybrid_experts: Option<u32>,
    /// Dense row split: the share (0 to 1) of the rows of each dense
    /// feed-forward weight in host memory that the GPU streams and computes
    /// in decode while the CPU computes the others; 0 turns the split off.
    /// Default: the cost model's choice.
    #[arg(long = "dense-split", env = "PIPESHARD_DENSE_SPLIT", value_parser = parse_share)]
    pub dense_split: Option<f64>,
    /// With a budget: streaming slots for the vision encoder's weights
    /// (0: llama.cpp's synchronous copies).
    #[arg(long = "vision-stream-slots", env = "PIPESHARD_VISION_STREAM_SLOTS",
          default_value_t = engine::VisionOptions::BUDGETED_STREAM_SLOTS,
          value_parser = clap::value_parser!(u32).range(0..=8))]
    pub vision_stream_slots: u32,
    /// Exact mode: every op runs on the GPU, host weights streamed to it
    /// (never computed on the CPU or split with it), and attention over a
    /// KV cache in host memory on the GPU after a copy, so the output is token for token the full-GPU result.
    /// Default: the cost model chooses per weight and tier, and CPU math
    /// may round differently.
    #[arg(long = "exact", env = "PIPESHARD_EXACT")]
    pub exact: bool,
    /// Choose the decode split (hybrid experts, dense row split) at run
    /// time: after load, time a few decode steps at the cost model's share
    /// and the others around it and keep the fastest; `false` keeps the cost
    /// model's share. A share given with --hybrid-experts or --dense-split
    /// is never changed.
    #[arg(long = "split-tune", env = "PIPESHARD_SPLIT_TUNE", default_value_t = true,
          action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub split_tune: bool,
    /// Make more weights resident while decoding: once a prompt is done,
    /// shrink the compute buffers to a decode step's size and fill the
    /// memory they free with weights, until the next prompt (`run` and
    /// `bench`; the server keeps one residency). `false` keeps the plan's.
    #[arg(long = "decode-tier", env = "PIPESHARD_DECODE_TIER", default_value_t = true,
          action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub decode_tier: bool,
    /// Hybrid experts and dense row split: the CPU computes its part from
    /// copies of those host weights in its repacked layout (made at load,
    /// as much host memory again), where host memory holds them; `false`
    /// computes with the weights in place.
    #[arg(long = "cpu-copies", env = "PIPESHARD_CPU_COPIES", default_value_t = true,
          action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub cpu_copies: bool,
}

impl Default for PipeshardOptions {
    fn default() -> Self {
        PipeshardOptions {
            vram_budget: None,
            vram_headroom: None,
            profile: None,
            plan: None,
            stream_slots: plan::DEFAULT_STREAM_SLOTS,
            hybrid_experts: None,
            dense_split: None,
            vision_stream_slots: engine::VisionOptions::BUDGETED_STREAM_SLOTS,
            exact: false,
            split_tune: true,
            decode_tier: true,
            cpu_copies: true,
        }
    }
}

/// A share between 0 and 1.
fn parse_share(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
        _ => Err(format!("{s:?} is not a share between 0 and 1")),
    }
}

/// The memory `--vram-budget auto` leaves free on a card of `total` bytes
/// without `--vram-headroom`: 5% of it, at least 512 MiB.
pub fn default_headroom(total: u64) -> u64 {
    (total / 20).max(512 << 20)
}

/// `--vram-budget` as given, once every budget in it parses.
fn check_budgets(s: &str) -> Result<String, String> {
    let specs = match BudgetList::parse(s).map_err(|e| e.to_string())? {
        BudgetList::Sizes(v) => v,
        BudgetList::PerDevice(v) => v.into_iter().map(|d| d.budget).collect(),
    };
    if specs.contains(&BudgetSpec::Bytes(0)) {
        return Err("a budget of 0 bytes leaves nothing for the model".into());
    }
    Ok(s.to_string())
}

/// What `--vram-budget` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetSpec {
    /// A fixed number of bytes.
    Bytes(u64),
    /// What the card has free now (plus what this process already holds),
    /// minus a margin.
    Auto,
}

impl BudgetSpec {
    /// Parse one budget: a size, or `auto`.
    pub fn parse(s: &str) -> Result<BudgetSpec, LaunchError> {
        match s.trim() {
            "auto" => Ok(BudgetSpec::Auto),
            t => Ok(BudgetSpec::Bytes(plan::parse_bytes(t)?)),
        }
    }

    /// The budget in bytes, for the process's device memory; `auto`
    /// leaves `headroom` free (None: [`default_headroom`]).
    pub fn resolve(self, headroom: Option<u64>) -> Result<u64, LaunchError> {
        match self {
            BudgetSpec::Bytes(b) => Ok(b),
            BudgetSpec::Auto => {
                let gpu = engine::first_device(engine::DeviceKind::Gpu).ok_or(LaunchError::AutoNeedsGpu)?;
                // NVML sees every process's use; ggml's free figure is the
                // same card's as the driver reports it.
                if let Some(u) = engine::nvml::card_usage() {
                    let headroom = headroom.unwrap_or_else(|| default_headroom(u.total));
                    return Ok(u.total.saturating_sub(u.others).saturating_sub(headroom));
                }
                let (total, free) = (gpu.total_bytes, gpu.free_bytes);
                let own = engine::process_device_bytes().map_or(0, |(b, _)| b);
                let headroom = headroom.unwrap_or_else(|| default_headroom(total));
                Ok((free + own).saturating_sub(headroom))
            }
        }
    }
}

impl PipeshardOptions {
    /// Whether pipeshard plans the placement (`--vram-budget` or `--plan`).
    pub fn is_set(&self) -> bool {
        self.vram_budget.is_some() || self.plan.is_some()
    }

    /// Options that contradict each other.
    pub fn check(&self) -> Result<(), LaunchError> {
        if self.exact && self.hybrid_experts.is_some_and(|k| k > 0) {
            return Err(LaunchError::Options(
                "--exact runs every op on the GPU, so it cannot split experts with the CPU (--hybrid-experts)".into(),
            ));
        }
        if self.exact && self.dense_split.is_some_and(|f| f > 0.0) {
            return Err(LaunchError::Options(
                "--exact runs every op on the GPU, so it cannot split weights with the CPU (--dense-split)".into(),
            ));
        }
        Ok(())
    }

    /// Whether the budget is `auto`: `serve` and `run` follow the card's
    /// free memory while they run.
    pub fn follows_card(&self) -> bool {
        matches!(self.budgets().as_deref(), Ok([BudgetSpec::Auto]))
    }

    /// `--vram-budget` parsed; None where it is not given.
    pub fn budget_list(&self) -> Result<Option<BudgetList>, LaunchError> {
        self.vram_budget.as_deref().map(BudgetList::parse).transpose()
    }

    /// Every budget given (`bench` takes several, comma-separated).
    pub fn budgets(&self) -> Result<Vec<BudgetSpec>, LaunchError> {
        match self.budget_list()? {
            None => Ok(Vec::new()),
            Some(BudgetList::Sizes(v)) => Ok(v),
            Some(BudgetList::PerDevice(_)) => Err(LaunchError::Options(
                "--vram-budget DEVICE=SIZE pairs are one budget per device, not a list of budgets: bench sweeps sizes (e.g. 4GiB,6GiB)".into(),
            )),
        }
    }

    /// The headroom of the first GPU, which one-device commands use.
    pub fn headroom(&self) -> Option<u64> {
        let first = engine::first_device(engine::DeviceKind::Gpu).map(|d| d.name);
        self.vram_headroom
            .as_ref()
            .and_then(|h| h.of(first.as_deref().unwrap_or_default()))
    }

    /// Per-device budgets resolved against the devices ggml loaded; None
    /// where `--vram-budget` is not a list of `DEVICE=SIZE` pairs.
    pub fn device_budgets(&self) -> Result<Option<Vec<DeviceBudget>>, LaunchError> {
        match self.budget_list()? {
            Some(BudgetList::PerDevice(specs)) => {
                devices::resolve(&specs, self.vram_headroom.as_ref(), &engine::list_devices()).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// The one budget of a command that loads one model, resolved. Budgets
    /// per device resolve here when they name one device, the first GPU,
    /// which one-device plans run on.
    pub fn budget_bytes(&self) -> Result<Option<u64>, LaunchError> {
        if let Some(devices) = self.device_budgets()? {
            let first = engine::first_device(engine::DeviceKind::Gpu).map(|d| d.index);
            return match devices.as_slice() {
                [one] if Some(one.index) == first => Ok(Some(one.bytes)),
                _ => Err(LaunchError::Options(format!(
                    "--vram-budget {}: this command runs on one device, the first GPU; `pipeshard run` and `pipeshard plan` take budgets across devices",
                    self.vram_budget.as_deref().unwrap_or_default()
                ))),
            };
        }
        match self.budgets()?.as_slice() {
            [] => Ok(None),
            [one] => Ok(Some(one.resolve(self.headroom())?)),
            _ => Err(LaunchError::Options(
                "--vram-budget takes one size here (only bench takes a list)".into(),
            )),
        }
    }
}
