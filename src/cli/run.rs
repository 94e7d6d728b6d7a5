//! `pipeshard run`: one prompt, streamed to stdout, with timings.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, Result};

use pipeshard::engine::{
    self, ChatMessage, Context, ContextParams, FlashAttention, Model, ModelParams, SamplingParams,
};
use pipeshard::generate::{
    generate, generate_between, generate_from, generate_speculative, EvaluatedPrompt, GenerateOutput, GenerateRequest,
    SpeculationStats,
};
use pipeshard::{default_model, progress};

use pipeshard::launch::{self, live, PipeshardOptions};
use pipeshard::plan::Workload;

use super::plan::{parse_kv_type, plan_with_bar, DraftArgs};
use super::GlobalArgs;

/// Load a model with a progress bar labelled `label`.
pub(super) fn load_with_progress(path: &Path, mut params: ModelParams<'_>, label: &str) -> Result<Model> {
    let bar = progress::fraction_bar(label);
    let b = bar.clone();
    params.progress = Some(Box::new(move |p| {
        b.set_position((p * 1000.0) as u64);
        true
    }));
    let model = Model::load(path, params).with_context(|| format!("loading {}", path.display()))?;
    bar.finish_and_clear();
    Ok(model)
}

#[derive(clap::Args)]
pub struct RunArgs {
    /// GGUF model; defaults to SmolLM2-135M-Instruct, fetched on first use.
    #[arg(short = 'm', long = "model", env = "LLAMA_ARG_MODEL")]
    pub model: Option<PathBuf>,
    /// The prompt.
    #[arg(short = 'p', long = "prompt", default_value = "Write a haiku about the sea.")]
    pub prompt: String,
    /// Read the prompt from this file instead.
    #[arg(short = 'f', long = "file", conflicts_with = "prompt")]
    pub file: Option<PathBuf>,
    /// Keep generating past end-of-generation tokens.
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,
    /// Tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    pub n_predict: usize,
    /// Context size in tokens (0: the model's training length).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    pub ctx_size: u32,
    /// Logical batch size.
    #[arg(short = 'b', long = "batch-size", default_value_t = 2048)]
    pub batch_size: u32,
    /// Physical batch size.
    #[arg(long = "ubatch-size", visible_alias = "ub", default_value_t = 512)]
    pub ubatch_size: u32,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long)]
    pub chat: bool,
    /// System message for --chat.
    #[arg(long)]
    pub system: Option<String>,
    /// Layers to offload to the GPU (-1: all).
    #[arg(long = "n-gpu-layers", visible_alias = "ngl", default_value_t = -1, allow_negative_numbers = true)]
    pub n_gpu_layers: i32,
    /// Threads (default: all cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<i32>,
    /// Flash attention: on, off or auto.
    #[arg(long = "flash-attn", visible_alias = "fa", default_value = "auto")]
    pub flash_attn: String,
    /// Sampling temperature (0: greedy).
    #[arg(long = "temp", default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: i32,
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Greedy decoding takes each token's argmax on the host from the
    /// logits, instead of in the graph where the logits are computed.
    #[arg(long = "host-argmax")]
    pub host_argmax: bool,
    /// RNG seed (default: random).
    #[arg(short = 's', long = "seed", default_value_t = u32::MAX)]
    pub seed: u32,
    /// Print only the generated text, no timings.
    #[arg(long)]
    pub quiet: bool,
    /// Print the timings as JSON on stderr.
    #[arg(long)]
    pub json: bool,
    /// Multimodal projector GGUF (vision); needed by --image.
    #[arg(long = "mmproj", visible_alias = "mm")]
    pub mmproj: Option<PathBuf>,
    /// Image to show the model (PNG, JPEG, BMP, GIF); implies --chat.
    #[arg(long = "image", requires = "mmproj")]
    pub image: Option<PathBuf>,
    /// Run the vision encoder on the CPU (upstream's --no-mmproj-offload).
    #[arg(long = "no-mmproj-offload")]
    pub no_mmproj_offload: bool,
    /// KV cache type for K (llama.cpp's -ctk): f16, q8_0, ...
    #[arg(long = "cache-type-k", visible_alias = "ctk")]
    pub cache_type_k: Option<String>,
    /// KV cache type for V (llama.cpp's -ctv).
    #[arg(long = "cache-type-v", visible_alias = "ctv")]
    pub cache_type_v: Option<String>,
    #[command(flatten)]
    pub rpc: super::rpc::RpcArgs,
    #[command(flatten)]
    pub budget: PipeshardOptions,
    #[command(flatten)]
    pub draft: DraftArgs,
}

pub fn parse_flash_attn(s: &str) -> Result<FlashAttention> {
    match s {
        "on" | "1" | "true" | "enabled" => Ok(FlashAttention::On),
        "off" | "0" | "false" | "disabled" => Ok(FlashAttention::Off),
        "auto" => Ok(FlashAttention::Auto),
        _ => anyhow::bail!("--flash-attn takes on, off or auto, not {s:?}"),
    }
}

pub fn run(global: &GlobalArgs, mut args: RunArgs) -> Result<()> {
    let fa = parse_flash_attn(&args.flash_attn)?;
    if let Some(f) = &args.file {
        args.prompt = std::fs::read_to_string(f).with_context(|| format!("reading the prompt file {}", f.display()))?;
    }
    if let Some(img) = &args.image {
        if !img.is_file() {
            anyhow::bail!("the image {} does not exist", img.display());
        }
        if args.draft.draft_model.is_some() {
            anyhow::bail!("speculative decoding (--spec-draft-model) does not take an --image yet");
        }
    }
    // A bad --spec-draft-ngl fails before anything loads.
    args.draft.n_gpu_layers(None)?;
    let model_path = match &args.model {
        Some(p) => p.clone(),
        None => default_model::ensure().context("fetching the default model")?,
    };
    engine::init(global.backend_dir.as_deref()).context("initialising llama.cpp")?;
    args.rpc.connect()?;
    let across = launch::across::budgets_across(&args.budget)?;
    if across.is_some() {
        check_across(&args)?;
    }

    let threads = args.threads.unwrap_or_else(engine::default_threads);
    // The process's device memory, sampled until the end.
    let sampler =
        engine::first_device(engine::DeviceKind::Gpu).map(|d| engine::MemorySampler::start(Some(d.index), Vec::new()));
    let mut model_params = ModelParams {
        n_gpu_layers: args.n_gpu_layers,
        ..Default::default()
    };
    let mut ctx_params = ContextParams {
        n_ctx: args.ctx_size,
        n_batch: args.batch_size,
        n_ubatch: args.ubatch_size,
        n_threads: Some(threads),
        n_threads_batch: Some(threads),
        flash_attention: fa,
        type_k: args.cache_type_k.as_deref().map(parse_kv_type).transpose()?,
        type_v: args.cache_type_v.as_deref().map(parse_kv_type).transpose()?,
        ..Default::default()
    };
    let vision_opts = launch::vision_options(&args.budget, args.n_gpu_layers != 0 && !args.no_mmproj_offload, threads);
    let image = match &args.image {
        Some(img) => engine::PeakImage::File(img.clone()),
        None => engine::PeakImage::Largest,
    };
    let vision = launch::vision_setup(
        &model_path,
        args.mmproj.as_deref(),
        vision_opts,
        args.budget.plan.is_none(),
        &image,
    )
    .with_context(|| {
        let mm = args.mmproj.as_deref().unwrap_or(Path::new(""));
        format!("measuring the vision encoder of {}", mm.display())
    })?;
    if let Some(v) = vision {
        eprintln!(
            "vision encoder: {} of device memory while it runs, {} held after",
            pipeshard::plan::fmt_bytes(v.peak),
            pipeshard::plan::fmt_bytes(v.resident)
        );
    }
    let chat = args.chat || args.image.is_some();
    // The plan is for this prompt: its tokens, from the model's vocabulary
    // alone, before anything is placed.
    let workload = if args.budget.vram_budget.is_some() && args.budget.plan.is_none() {
        let vocab = Model::load(
            &model_path,
            ModelParams {
                vocab_only: true,
                ..Default::default()
            },
        )
        .with_context(|| format!("reading the vocabulary of {}", model_path.display()))?;
        let text = prompt_text(&vocab, &args, chat)?;
        let n = vocab.tokenize(&text, !chat || vocab.add_bos(), chat)?.len() as u64;
        Workload {
            // An image adds tokens that only its encoder knows.
            prompt_tokens: if args.image.is_some() {
                n.max(4096.min(args.ctx_size as u64 / 2))
            } else {
                n.max(1)
            },
            gen_tokens: args.n_predict as u64,
            speculation: None,
            parallel: 1,
        }
    } else {
        Workload::default()
    };
    let across = match across {
        Some(budgets) => {
            let req = launch::LaunchRequest::with_budget(&model_path, &args.budget, threads, workload, None)?;
            let l = plan_across_with_bar(&req, &ctx_params, budgets)?;
            eprint!(
                "{}",
                pipeshard::plan::render_devices(&l.plan, pipeshard::plan::Format::Table)
            );
            Some((l.install(&mut model_params, &mut ctx_params)?, l))
        }
        None => None,
    };
    let launched = match across {
        Some(_) => None,
        None => {
            let req = launch::LaunchRequest {
                vision: vision.unwrap_or_default(),
                draft: args.draft.source()?,
                ..launch::LaunchRequest::new(&model_path, &args.budget, threads, workload)?
            };
            plan_with_bar(&req, &ctx_params)?
        }
    };
    let mut session = None;
    if let Some(l) = &launched {
        let plan = &l.plan;
        eprintln!(
            "plan: ubatch {}, {} resident, KV {}/{} layers on GPU, VRAM {} of {} ({} outside llama.cpp's buffers); predicted TTFT {:.3} s and {:.1} tok/s for {}+{} tokens",
            plan.ubatch,
            pipeshard::plan::fmt_bytes(plan.resident_bytes()),
            plan.kv_gpu_layers,
            plan.n_layer,
            pipeshard::plan::fmt_bytes(plan.vram.total),
            pipeshard::plan::fmt_bytes(plan.vram.budget),
            pipeshard::plan::fmt_bytes(plan.vram.reserve),
            plan.predicted.ttft_s,
            plan.predicted.decode_tok_s,
            plan.workload.prompt_tokens,
            plan.workload.gen_tokens
        );
        session = Some(l.install(&mut model_params, &mut ctx_params)?);
    }
    // --vram-budget auto: the plan follows the card between the decodes of
    // a plain generation (not with a draft model or an image); a re-plan's
    // decisions replace the session's, which the context's callbacks ask.
    let follows = match &mut session {
        Some(s) if args.draft.draft_model.is_none() && args.image.is_none() => {
            s.follow_card(args.budget.headroom(), Box::new(|| {})).is_some()
        }
        _ => false,
    };
    if follows {
        model_params.movable_weights = true;
    }
    let plan = launched.as_ref().map(|l| l.plan.clone());
    let plan = plan.as_ref();
    if args.draft.draft_model.is_some() && ctx_params.n_outputs_max != 0 {
        // Each verification batch samples every position it holds.
        ctx_params.n_outputs_max = ctx_params.n_outputs_max.max(args.draft.draft_n_max + 1);
    }

    let planned = plan.and_then(|p| p.workload.speculation);
    if let (Some(w), Some(s)) = (planned, plan.and_then(|p| p.predicted.speculation)) {
        eprintln!(
            "plan: draft on the {}; speculative steps of {:.1} ms verifying {} tokens, {:.2} tokens per step at the assumed acceptance; {:.1} tok/s without the draft",
            if w.draft_on_gpu { "GPU" } else { "CPU" },
            s.step_s * 1e3,
            w.verify_tokens(),
            s.tokens_per_step,
            s.plain_decode_tok_s
        );
    }

    // Plain greedy decoding (no penalty, no draft model, which verifies
    // with the logits) takes its argmax where the logits are computed: a
    // step copies back one token id instead of a row of logits.
    let greedy_only =
        args.temperature <= 0.0 && args.repeat_penalty == 1.0 && args.draft.draft_model.is_none() && !args.host_argmax;
    let t_load = Instant::now();
    let model = load_with_progress(&model_path, model_params, "loading")?;
    let mut ctx = Context::new(
        &model,
        ContextParams {
            backend_greedy: greedy_only,
            ..ctx_params.clone()
        },
    )
    .context("creating the context")?;
    // With `auto`, a plan puts the draft where it predicted it pays.
    let draft_ngl = args.draft.n_gpu_layers(planned.as_ref())?;
    let speculate = match plan {
        Some(_) if args.draft.draft_model.is_some() && planned.is_none() => {
            eprintln!("plan: the draft model does not pay under this budget; decoding without it");
            false
        }
        _ => true,
    };
    let draft_model = match &args.draft.draft_model {
        Some(path) if speculate => {
            let params = ModelParams {
                n_gpu_layers: draft_ngl,
                ..Default::default()
            };
            Some(load_with_progress(path, params, "loading the draft")?)
        }
        _ => None,
    };
    let mut draft_ctx = match &draft_model {
        Some(m) => {
            let params = ContextParams {
                n_ubatch: ctx_params.n_ubatch.min(512),
                // A draft on the CPU stays there: its prompt's ops do not
                // borrow device memory that no budget counted.
                op_offload: draft_ngl != 0 && ctx_params.op_offload,
                offload: None,
                stream_slots: 0,
                stream_routed_max: 0,
                moe_split: None,
                row_split: None,
                ..ctx_params.clone()
            };
            Some(Context::new(m, params).context("creating the draft model's context")?)
        }
        None => None,
    };
    let mut device_peaks = None;
    if let Some((applied, l)) = &across {
        for d in l.verify_loaded(applied, &mut ctx)? {
            eprintln!("loaded:   {d}");
        }
        device_peaks = l.sample_peaks();
    }
    let loaded = match &mut session {
        Some(s) => {
            let others: Vec<&Context<'_>> = draft_ctx.iter().collect();
            Some(s.verify_loaded(&mut ctx, &others)?)
        }
        None => None,
    };
    let load_ms = t_load.elapsed().as_secs_f64() * 1e3;
    if let Some(f) = session.as_ref().and_then(|s| s.follower()) {
        if let Some(path) = std::env::var_os(live::RECORD_ENV).filter(|p| !p.is_empty()) {
            f.record_to(Path::new(&path))
                .with_context(|| format!("recording the card's samples to {}", path.to_string_lossy()))?;
        }
        f.spawn(live::source::from_env()?)
            .context("starting the sampling thread")?;
        eprintln!("plan: --vram-budget auto follows the card's free memory between decodes");
    }

    let vision = match &args.mmproj {
        Some(mm) => Some(
            engine::VisionProjector::load(&model, mm, vision_opts)
                .with_context(|| format!("loading the projector for {}", model_path.display()))?,
        ),
        None => None,
    };
    let image = match (&vision, &args.image) {
        (Some(v), Some(img)) => Some(engine::Bitmap::from_file(v, img)?),
        _ => None,
    };
    let prompt_text = prompt_text(&model, &args, chat)?;
    let sampling = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        seed: args.seed,
        ..Default::default()
    };
    let mut stdout = std::io::stdout().lock();
    let mut on_text = |piece: &str| {
        let _ = stdout.write_all(piece.as_bytes());
        let _ = stdout.flush();
        true
    };
    let mut encode_ms = None;
    let mut speculation: Option<SpeculationStats> = None;
    let out: GenerateOutput = match (&vision, &image) {
        (Some(v), Some(img)) => {
            ctx.clear();
            let started = Instant::now();
            let ev = v
                .eval_prompt(
                    &mut ctx,
                    &prompt_text,
                    std::slice::from_ref(img),
                    0,
                    model.add_bos(),
                    None,
                )
                .context("evaluating the prompt with the image")?;
            encode_ms = Some(ev.encode_ms);
            let prompt = EvaluatedPrompt {
                n_past: ev.n_past,
                n_tokens: ev.n_tokens,
                started,
            };
            generate_from(&mut ctx, prompt, args.n_predict, &sampling, &[], &mut on_text)?
        }
        _ => {
            // A chat template already carries its special tokens as text.
            let prompt = model.tokenize(&prompt_text, !chat || model.add_bos(), chat)?;
            let req = GenerateRequest {
                ignore_eos: args.ignore_eos,
                ..GenerateRequest::new(prompt, args.n_predict, sampling)
            };
            match &mut draft_ctx {
                Some(draft) => {
                    let (out, s) = generate_speculative(&mut ctx, draft, &args.draft.params(), &req, &mut on_text)?;
                    speculation = Some(s);
                    out
                }
                // Between decodes: the follower's re-plans, or the decode
                // tier in force before the first step after the prompt.
                None => match &mut session {
                    Some(session) => {
                        let mut failed = None;
                        let out = generate_between(&mut ctx, &req, &mut on_text, &mut |ctx| {
                            if let Err(e) = session.between_decodes(ctx) {
                                failed.get_or_insert(e);
                            }
                        })?;
                        if let Some(e) = failed {
                            return Err(e).context("making the decode tier's weights resident");
                        }
                        out
                    }
                    None => generate(&mut ctx, &req, &mut on_text)?,
                },
            }
        }
    };
    let _ = writeln!(stdout);
    drop(stdout);

    let s = &out.stats;
    let peak_device = sampler.map(|s| s.stop());
    let device_peaks = match (&across, device_peaks) {
        (Some((_, l)), Some(p)) => l.peaks_and_budgets(p.stop().cards),
        _ => Vec::new(),
    };
    if args.json {
        let v = serde_json::json!({
            "model": model_path, "load_ms": load_ms, "stats": s, "image_encode_ms": encode_ms,
            "devices": engine::list_devices(), "memory": ctx.memory_breakdown(),
            "peak_device_bytes": peak_device, "device_peaks": device_peaks, "speculation": speculation,
            "predicted": plan.map(|p| p.predicted),
            "loaded_memory": loaded,
            "live": session.as_ref().and_then(|s| s.follower()).map(|f| {
                let l = f.stats();
                serde_json::json!({
                    "allowance_bytes": l.allowance, "budget_bytes": l.budget, "replans": l.replans,
                    "failures": l.failures, "unfit": l.unfit, "last_migration_s": l.last_migration_s,
                    "total_migration_s": l.total_migration_s, "bytes_to_host": l.bytes_to_host,
                    "bytes_to_device": l.bytes_to_device,
                })
            }),
        });
        eprintln!("{}", serde_json::to_string(&v)?);
    } else if !args.quiet {
        eprintln!();
        eprintln!("model:    {} ({})", model.description(), model_path.display());
        eprintln!("load:     {load_ms:.1} ms");
        if let Some(ms) = encode_ms {
            eprintln!("image:    encoded in {ms:.1} ms");
        }
        eprintln!(
            "prompt:   {} tokens, TTFT {:.1} ms, {:.1} tok/s",
            s.prompt_tokens, s.ttft_ms, s.prompt_tokens_per_s
        );
        eprintln!(
            "decode:   {} tokens, {:.1} tok/s ({:?})",
            s.generated_tokens, s.decode_tokens_per_s, s.stop
        );
        if let Some(sp) = &speculation {
            eprintln!(
                "draft:    {} of {} tokens accepted ({:.0}%) in {} steps; drafting {:.1} ms, verifying {:.1} ms ({:.1} ms per step), draft prompt {:.1} ms",
                sp.accepted,
                sp.drafted,
                sp.acceptance() * 100.0,
                sp.steps,
                sp.draft_ms,
                sp.verify_ms,
                sp.verify_ms / sp.steps.max(1) as f64,
                sp.draft_prompt_ms
            );
        }
        if let Some(peak) = peak_device {
            eprintln!(
                "device:   process peak {} ({:?}){}",
                pipeshard::plan::fmt_bytes(peak.device),
                peak.source,
                plan.map_or(String::new(), |p| format!(
                    ", budget {}",
                    pipeshard::plan::fmt_bytes(p.vram.budget)
                ))
            );
        }
        for (device, peak, budget) in &device_peaks {
            eprintln!(
                "device:   {device} process peak {}, budget {}",
                pipeshard::plan::fmt_bytes(*peak),
                pipeshard::plan::fmt_bytes(*budget)
            );
        }
        for m in ctx.memory_breakdown() {
            eprintln!(
                "memory:   {:<12} model {:>8.1} MiB  context {:>8.1} MiB  compute {:>8.1} MiB",
                m.buffer_type,
                m.model as f64 / 1048576.0,
                m.context as f64 / 1048576.0,
                m.compute as f64 / 1048576.0
            );
        }
    }
    Ok(())
}

/// What a run across devices does not take yet.
fn check_across(args: &RunArgs) -> Result<()> {
    let unsupported = [
        (args.draft.draft_model.is_some(), "a draft model (--model-draft)"),
        (args.mmproj.is_some(), "a vision projector (--mmproj)"),
        (args.budget.plan.is_some(), "a saved plan (--plan)"),
    ];
    match unsupported.iter().find(|(given, _)| *given) {
        Some((_, what)) => anyhow::bail!(
            "--vram-budget {}: a run across devices does not take {what} yet",
            args.budget.vram_budget.as_deref().unwrap_or_default()
        ),
        None => Ok(()),
    }
}

/// A plan across the devices of `budgets`, with a progress bar while a
/// missing profile is measured.
fn plan_across_with_bar(
    req: &launch::LaunchRequest<'_>,
    cp: &ContextParams,
    budgets: Vec<launch::devices::DeviceBudget>,
) -> Result<launch::across::AcrossLaunch> {
    let bar = progress::steps_bar(1, "profiling");
    let r = launch::across::plan_across(req, cp, budgets, |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    Ok(r?)
}

/// The prompt as the model reads it: wrapped in its chat template as a user
/// message (after an optional system message) with `chat`, behind the
/// media marker when there is an image.
fn prompt_text(model: &Model, args: &RunArgs, chat: bool) -> Result<String> {
    let user_text = if args.image.is_some() {
        format!("{}\n{}", engine::media_marker(), args.prompt)
    } else {
        args.prompt.clone()
    };
    if !chat {
        return Ok(user_text);
    }
    model.chat_template(None).ok_or(engine::EngineError::NoChatTemplate)?;
    let mut msgs = Vec::new();
    if let Some(sys) = &args.system {
        msgs.push(ChatMessage {
            role: "system".into(),
            content: sys.clone(),
        });
    }
    msgs.push(ChatMessage {
        role: "user".into(),
        content: user_text,
    });
    // common's chat templates: what llama.cpp's server renders with.
    Ok(model.apply_common_chat_template(&msgs, true)?)
}
