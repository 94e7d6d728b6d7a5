//! `pipeshard plan` and `pipeshard profile`.

use std::path::PathBuf;

use anyhow::{Context as _, Result};

use pipeshard::engine;
use pipeshard::gguf::ModelInfo;
use pipeshard::launch::{self, PipeshardOptions};
use pipeshard::plan::{self, Format, Workload};
use pipeshard::profile::{self, MachineProfile, ProfileMode};
use pipeshard::progress;

use super::GlobalArgs;

/// Speculative decoding with a draft model, with llama.cpp's flags and defaults.
#[derive(clap::Args, Clone, Debug)]
pub struct DraftArgs {
    /// Draft model for speculative decoding (same vocabulary): it proposes
    /// tokens that the model checks in one batch.
    #[arg(
        long = "spec-draft-model",
        visible_alias = "model-draft",
        env = "LLAMA_ARG_SPEC_DRAFT_MODEL"
    )]
    pub draft_model: Option<PathBuf>,
    /// Most tokens drafted per step; the model checks them in batches of this plus one.
    #[arg(long = "spec-draft-n-max", env = "LLAMA_ARG_SPEC_DRAFT_N_MAX", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=256))]
    pub draft_n_max: u32,
    /// A draft shorter than this is not checked.
    #[arg(long = "spec-draft-n-min", env = "LLAMA_ARG_SPEC_DRAFT_N_MIN", default_value_t = 0)]
    pub draft_n_min: u32,
    /// The draft stops at a token the draft model gives less than this probability.
    #[arg(
        long = "spec-draft-p-min",
        visible_alias = "draft-p-min",
        env = "LLAMA_ARG_SPEC_DRAFT_P_MIN",
        default_value_t = 0.0
    )]
    pub draft_p_min: f32,
    /// Draft model layers on the GPU: all (the whole draft, whose device
    /// memory comes out of --vram-budget), a number (0: CPU), or auto: with
    /// a budget, the GPU, the CPU or no speculation, whichever the plan
    /// predicts is fastest.
    #[arg(long = "spec-draft-ngl", visible_aliases = ["gpu-layers-draft", "n-gpu-layers-draft"], default_value = "auto")]
    pub draft_ngl: String,
    /// The planner's assumption of how often the model accepts a draft
    /// token (which depends on the two models and the text, so no profile
    /// measures it).
    #[arg(long = "draft-acceptance", env = "PIPESHARD_DRAFT_ACCEPTANCE", default_value_t = 0.7,
          value_parser = parse_probability)]
    pub draft_acceptance: f64,
}

fn parse_probability(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(format!("expected a probability between 0 and 1, not {s:?}")),
    }
}

impl DraftArgs {
    /// Draft layers on the GPU, as `ModelParams::n_gpu_layers` takes them:
    /// with `auto`, where `planned` (a plan's speculation) put the draft,
    /// all layers without one.
    pub fn n_gpu_layers(&self, planned: Option<&plan::Speculation>) -> Result<i32> {
        match (self.draft_ngl.trim(), planned) {
            ("auto", Some(s)) => Ok(if s.draft_on_gpu { -1 } else { 0 }),
            ("auto" | "all", _) => Ok(-1),
            (n, _) => n
                .parse::<i32>()
                .ok()
                .filter(|&n| n >= -1)
                .with_context(|| format!("--spec-draft-ngl takes auto, all or a layer count, not {n:?}")),
        }
    }

    /// How generation drafts.
    pub fn params(&self) -> pipeshard::generate::DraftParams {
        pipeshard::generate::DraftParams {
            n_max: self.draft_n_max,
            n_min: self.draft_n_min,
            p_min: self.draft_p_min,
        }
    }

    /// The draft as the planner prices it, if there is one: `auto` lets the
    /// plan choose between the GPU and the CPU. A draft split between them
    /// is planned as if all on the GPU (the larger device memory).
    pub fn source(&self) -> Result<Option<launch::DraftSource>> {
        let on_gpu = match self.draft_ngl.trim() {
            "auto" => None,
            _ => Some(self.n_gpu_layers(None)? != 0),
        };
        Ok(self.draft_model.as_ref().map(|path| launch::DraftSource {
            path: path.clone(),
            on_gpu,
            draft_tokens: self.draft_n_max,
            acceptance: self.draft_acceptance,
        }))
    }
}

/// Load the profile named on the command line, or the one matching this
/// machine, measuring it (fast mode, with a progress bar) when none exists,
/// and the samples of `info`'s types it lacks.
pub fn resolve_profile(args: &PipeshardOptions, threads: i32, info: &ModelInfo) -> Result<MachineProfile> {
    let bar = progress::steps_bar(1, "profiling");
    let used = profile::TypesUsed::of(info);
    let p = launch::machine_profile(args.profile.as_deref(), threads, &used, |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    Ok(p?)
}

fn measure_with_bar(mode: ProfileMode, threads: i32) -> Result<MachineProfile> {
    let bar = progress::steps_bar(1, "profiling");
    let p = profile::measure(mode, threads, |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    Ok(p)
}

/// The plan for `req` in a context made with `cp`, from `--plan` or
/// `--vram-budget`, with a progress bar while a missing profile is
/// measured; None when neither is given (upstream placement).
pub fn plan_with_bar(req: &launch::LaunchRequest<'_>, cp: &engine::ContextParams) -> Result<Option<launch::Launch>> {
    let bar = progress::steps_bar(1, "profiling");
    let r = launch::plan_for(req, cp, |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    Ok(r?)
}

#[derive(clap::Args)]
pub struct PlanArgs {
    /// The GGUF model to plan.
    #[arg(short = 'm', long = "model", required_unless_present = "arch")]
    pub model: Option<PathBuf>,
    /// Plan a `pipeshard synth` preset instead, before having the model (e.g. qwen3-30b-a3b).
    #[arg(long = "arch", conflicts_with = "model")]
    pub arch: Option<String>,
    /// Weight scheme of --arch: q4_0, q8_0, q4_k_m, q5_k_m, q6_k, mxfp4 or f16.
    #[arg(long = "quant", default_value = "q4_0", requires = "arch")]
    pub quant: String,
    #[command(flatten)]
    pub budget: PipeshardOptions,
    #[command(flatten)]
    pub rpc: super::rpc::RpcArgs,
    #[command(flatten)]
    pub draft: DraftArgs,
    /// Context size in tokens.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 8192)]
    pub ctx_size: u64,
    /// Parallel sequences (each gets ctx-size / np tokens); they decode
    /// together, one token of each per ubatch, a tier of its own.
    #[arg(long = "parallel", visible_alias = "np", default_value_t = 1)]
    pub parallel: u32,
    /// One KV stream for all sequences (llama.cpp's --kv-unified) instead
    /// of one per sequence, llama-server's layout for an explicit -np.
    #[arg(long = "kv-unified")]
    pub kv_unified: bool,
    /// Flash attention: on, off or auto (as llama.cpp's -fa).
    #[arg(long = "flash-attn", visible_alias = "fa", default_value = "auto")]
    pub flash_attn: String,
    /// KV cache type for K (llama.cpp's -ctk).
    #[arg(long = "cache-type-k", visible_alias = "ctk")]
    pub cache_type_k: Option<String>,
    /// KV cache type for V (llama.cpp's -ctv).
    #[arg(long = "cache-type-v", visible_alias = "ctv")]
    pub cache_type_v: Option<String>,
    /// Prompt tokens of the workload to optimise for.
    #[arg(long = "prompt-tokens", default_value_t = 4096)]
    pub prompt_tokens: u64,
    /// Generated tokens of the workload.
    #[arg(long = "gen-tokens", default_value_t = 64)]
    pub gen_tokens: u64,
    /// Fix the ubatch size instead of choosing it.
    #[arg(long = "ubatch-size", visible_alias = "ub")]
    pub ubatch: Option<u32>,
    #[arg(long = "format", value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Threads the CPU ops would use (selects the profile).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<i32>,
}

impl PlanArgs {
    /// The work the plan is optimised for.
    pub fn workload(&self) -> Workload {
        Workload {
            prompt_tokens: self.prompt_tokens,
            gen_tokens: self.gen_tokens,
            speculation: None,
            parallel: self.parallel.max(1),
        }
    }
}

/// KV cache types as llama.cpp's `-ctk`/`-ctv` name them.
pub fn parse_kv_type(s: &str) -> Result<engine::ffi::ggml_type> {
    const KV_TYPES: [&str; 9] = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"];
    let t = pipeshard::gguf::GgmlType::from_name(s)
        .filter(|t| KV_TYPES.contains(&t.name()))
        .with_context(|| {
            format!("unsupported KV cache type {s:?} (f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1)")
        })?;
    Ok(t.id() as engine::ffi::ggml_type)
}

pub fn plan_cmd(global: &GlobalArgs, args: PlanArgs) -> Result<()> {
    let info = match (&args.model, &args.arch) {
        (Some(m), _) => {
            pipeshard::gguf::inspect(m)
                .with_context(|| format!("reading {}", m.display()))?
                .1
        }
        (None, Some(arch)) => {
            let quant = pipeshard_devtools::synth::Quant::from_name(&args.quant).with_context(|| {
                format!(
                    "unknown --quant {:?} (use {})",
                    args.quant,
                    pipeshard_devtools::synth::Quant::names()
                )
            })?;
            pipeshard_devtools::synth::model_info(arch, quant)?
        }
        (None, None) => anyhow::bail!("pass -m MODEL or --arch PRESET"),
    };
    engine::init(global.backend_dir.as_deref())?;
    args.rpc.connect()?;
    let threads = args.threads.unwrap_or_else(engine::default_threads);
    // The context the plan is for, as `run` would make it.
    let cp = engine::ContextParams {
        n_ctx: args.ctx_size.min(u32::MAX as u64) as u32,
        n_seq_max: args.parallel.max(1),
        kv_unified: args.kv_unified,
        flash_attention: super::run::parse_flash_attn(&args.flash_attn)?,
        type_k: args.cache_type_k.as_deref().map(parse_kv_type).transpose()?,
        type_v: args.cache_type_v.as_deref().map(parse_kv_type).transpose()?,
        ..Default::default()
    };
    if let Some(launch::devices::BudgetList::PerDevice(specs)) = args.budget.budget_list()? {
        return super::plan_devices::plan_devices(&args, &info, threads, &cp, &specs);
    }
    let budget = args.budget.budget_bytes()?.context("--vram-budget is required")?;
    let profile = resolve_profile(&args.budget, threads, &info)?;
    let model_path = args.model.clone().unwrap_or_default();
    let req = launch::LaunchRequest {
        budget: Some(budget),
        ubatch: args.ubatch,
        ..launch::LaunchRequest::new(&model_path, &args.budget, threads, args.workload())?
    };
    let (pr, _) = launch::plan_request(&req, &info, &cp, budget, &profile);
    // With a model file and a GPU, check the plan with llama.cpp's own reservation.
    let checked = args.model.as_deref().filter(|_| engine::has_gpu()).map(|m| (m, &cp));
    let draft = args.draft.source()?;
    let plan = launch::plan_with_draft(checked, &info, &profile, pr, draft.as_ref())?;
    print!("{}", plan::render(&plan, args.format));
    Ok(())
}

#[derive(clap::Args)]
pub struct ProfileArgs {
    /// How thorough: tiny (seconds), fast (under a minute), full.
    #[arg(long = "mode", value_enum, default_value_t = ProfileMode::Fast)]
    pub mode: ProfileMode,
    /// Where to write it (default: <machine key>.yaml in the profile
    /// directory: $PIPESHARD_PROFILE_DIR, else pipeshard/profiles in the
    /// user's data directory, e.g. ~/.local/share).
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
    #[arg(short = 't', long = "threads")]
    pub threads: Option<i32>,
    /// Also measure the expert and beside-copies samples of this model's
    /// weight types (plan, run, bench and the server do so on a model's
    /// first use otherwise).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Measure a remote device: with no local GPU visible (e.g.
    /// CUDA_VISIBLE_DEVICES=""), the first GPU is the server's, and the
    /// link measured is the network path to it.
    #[command(flatten)]
    pub rpc: super::rpc::RpcArgs,
}

pub fn profile_cmd(global: &GlobalArgs, args: ProfileArgs) -> Result<()> {
    let info = match &args.model {
        Some(m) => Some(
            pipeshard::gguf::inspect(m)
                .with_context(|| format!("reading {}", m.display()))?
                .1,
        ),
        None => None,
    };
    engine::init(global.backend_dir.as_deref())?;
    args.rpc.connect()?;
    let threads = args.threads.unwrap_or_else(engine::default_threads);
    let mut p = measure_with_bar(args.mode, threads)?;
    if let Some(info) = &info {
        let missing = profile::Missing::of(&p, &profile::TypesUsed::of(info));
        let bar = progress::steps_bar(1, "profiling the model's types");
        profile::measure_missing(&mut p, &missing, threads, |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        })?;
        bar.finish_and_clear();
    }
    let path = match args.output {
        Some(p) => p,
        None => profile::default_dir()?.join(p.key.file_name()),
    };
    p.save(&path)?;
    let gib = |b: f64| b / (1u64 << 30) as f64;
    eprintln!("profile written to {} in {:.1} s", path.display(), p.measured_in_s);
    eprintln!(
        "CPU: {} ({} threads), memory read {:.1} GiB/s",
        p.key.cpu,
        threads,
        gib(p.cpu_mem_bw)
    );
    if let Some(l) = &p.link {
        eprintln!(
            "GPU: {}; H2D pinned {:.1} GB/s, pageable {:.1} GB/s; D2H pinned {:.1} GB/s",
            p.key.gpu.as_deref().unwrap_or("?"),
            l.h2d_pinned / 1e9,
            l.h2d_pageable / 1e9,
            l.d2h_pinned / 1e9
        );
    }
    Ok(())
}
