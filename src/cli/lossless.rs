//! `pipeshard lossless`: generate greedily under the full-GPU placement and
//! under the plans of both modes (the default, whose CPU ops may round
//! differently, and `--exact`, GPU math only), and compare tokens and logits.

use std::path::PathBuf;

use anyhow::{Context as _, Result};

use pipeshard::bench::lossless::{compare, greedy_trace, GreedyTrace};
use pipeshard::default_model;
use pipeshard::engine::{self, Context, ContextParams, FlashAttention, ModelParams};

use pipeshard::launch::{self, PipeshardOptions};

use super::plan::plan_with_bar;
use super::run::load_with_progress;
use super::GlobalArgs;

#[derive(clap::Args, Debug)]
pub struct LosslessArgs {
    /// Model (GGUF); default: the default model.
    #[arg(short = 'm', long = "model", env = "LLAMA_ARG_MODEL")]
    pub model: Option<PathBuf>,
    #[command(flatten)]
    pub budget: PipeshardOptions,
    /// Prompt text.
    #[arg(
        short = 'p',
        long = "prompt",
        default_value = "The history of the printing press begins with movable type, which spread across Europe and changed how knowledge was shared. Describe its effects."
    )]
    pub prompt: String,
    /// Tokens to generate greedily.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    pub n_predict: usize,
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    pub ctx_size: u32,
    #[arg(short = 't', long = "threads")]
    pub threads: Option<i32>,
    /// Exit with status 1 unless the exact plan's tokens all match the
    /// full-GPU run's.
    #[arg(long = "require-identical")]
    pub require_identical: bool,
    /// Vision projector: with --image, compare the image embeddings of the
    /// encoder with its weights streamed from the host against the encoder
    /// entirely on the GPU, instead of generating text.
    #[arg(long = "mmproj", requires = "image")]
    pub mmproj: Option<PathBuf>,
    /// The image for --mmproj.
    #[arg(long = "image", requires = "mmproj")]
    pub image: Option<PathBuf>,
}

/// Image embeddings of the encoder with its weights streamed from the host
/// (pipeshard's budgeted vision) against the encoder entirely on the GPU
/// (upstream's default), for the same image at the same resolution.
fn compare_image_embeddings(
    model_path: &std::path::Path,
    mmproj: &std::path::Path,
    image: &std::path::Path,
    threads: i32,
    stream_slots: u32,
) -> Result<()> {
    if !engine::has_gpu() {
        anyhow::bail!("comparing image embeddings needs a GPU: both encoders would run on the CPU");
    }
    // Memory-mapped and on the CPU: the encoder needs the language model's
    // vocabulary and input width, not its weights.
    let vocab = engine::Model::load(
        model_path,
        ModelParams {
            n_gpu_layers: 0,
            use_mmap: true,
            ..Default::default()
        },
    )
    .with_context(|| format!("loading {}", model_path.display()))?;
    let embed = |opts: engine::VisionOptions| -> Result<(Vec<f32>, f64)> {
        let proj = engine::VisionProjector::load(&vocab, mmproj, opts)
            .with_context(|| format!("loading {}", mmproj.display()))?;
        let bmp = engine::Bitmap::from_file(&proj, image)?;
        let t = std::time::Instant::now();
        let e = proj.image_embeddings(&bmp)?;
        Ok((e, t.elapsed().as_secs_f64() * 1e3))
    };
    let (reference, ref_ms) = embed(engine::VisionOptions::upstream(true, threads))?;
    let (streamed, streamed_ms) = embed(engine::VisionOptions {
        stream_slots,
        ..engine::VisionOptions::budgeted(threads)
    })?;
    if reference.len() != streamed.len() || reference.is_empty() {
        anyhow::bail!(
            "the encoders made {} and {} values for the same image",
            reference.len(),
            streamed.len()
        );
    }
    let max_diff = reference
        .iter()
        .zip(&streamed)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    let max_ref = reference.iter().map(|a| a.abs()).fold(0f32, f32::max);
    let finite = streamed.iter().all(|x| x.is_finite());
    eprintln!(
        "{} embedding values: max |diff| {max_diff} (max |value| {max_ref}); encode {ref_ms:.1} ms on the GPU, {streamed_ms:.1} ms streamed",
        reference.len()
    );
    println!(
        "{}",
        serde_json::json!({
            "mmproj": mmproj.display().to_string(),
            "image": image.display().to_string(),
            "values": reference.len(),
            "max_abs_diff": max_diff,
            "max_abs_value": max_ref,
            "finite": finite,
            "encode_ms_gpu": ref_ms,
            "encode_ms_streamed": streamed_ms,
        })
    );
    if !finite {
        anyhow::bail!("the streamed encoder produced non-finite values");
    }
    Ok(())
}

pub fn lossless_cmd(global: &GlobalArgs, args: LosslessArgs) -> Result<()> {
    let model_path = match &args.model {
        Some(p) => p.clone(),
        None => default_model::ensure().context("fetching the default model")?,
    };
    engine::init(global.backend_dir.as_deref()).context("initialising llama.cpp")?;
    let threads = args.threads.unwrap_or_else(engine::default_threads);
    if let (Some(mmproj), Some(image)) = (&args.mmproj, &args.image) {
        return compare_image_embeddings(&model_path, mmproj, image, threads, args.budget.vision_stream_slots);
    }
    let base_ctx = ContextParams {
        n_ctx: args.ctx_size,
        n_threads: Some(threads),
        n_threads_batch: Some(threads),
        flash_attention: FlashAttention::On,
        ..Default::default()
    };
    if args.budget.plan.is_some() && args.budget.vram_budget.is_none() {
        anyhow::bail!("lossless plans both modes (default and --exact) itself: give --vram-budget, not --plan");
    }
    // Both modes: the cost model's choice per weight and tier, and --exact.
    let modes = [("default", false), ("exact", true)];
    let mut launches = Vec::new();
    for (label, exact) in modes {
        let options = PipeshardOptions {
            exact,
            ..args.budget.clone()
        };
        let req = launch::LaunchRequest::new(&model_path, &options, threads, Default::default())?;
        let launched = plan_with_bar(&req, &base_ctx)?
            .context("lossless compares plans with the full-GPU placement: give --vram-budget (and a GPU)")?;
        launches.push((label, launched));
    }
    let ctx_for = |ubatch: u32| ContextParams {
        n_batch: ubatch.max(512),
        n_ubatch: ubatch,
        ..base_ctx.clone()
    };
    let trace = |label: &str,
                 mp: ModelParams<'_>,
                 cp: ContextParams,
                 check: Option<&mut launch::Session>|
     -> Result<GreedyTrace> {
        let model = load_with_progress(&model_path, mp, label)?;
        let mut ctx = Context::new(&model, cp).context("creating the context")?;
        if let Some(l) = check {
            l.verify_loaded(&mut ctx, &[])?;
        }
        let prompt = model.tokenize(&args.prompt, true, false)?;
        Ok(greedy_trace(&mut ctx, &prompt, args.n_predict)?)
    };

    // The reference runs with the exact plan's ubatch (the same kernels
    // per chunk); greedy decode is one token at a time in every mode.
    let reference = trace(
        "full GPU",
        ModelParams {
            n_gpu_layers: 999,
            ..Default::default()
        },
        ctx_for(launches[1].1.plan.ubatch),
        None,
    )?;
    let mut report = serde_json::Map::new();
    report.insert("model".into(), model_path.display().to_string().into());
    let mut exact_identical = true;
    for (label, launched) in &mut launches {
        let mut mp = ModelParams::default();
        let mut cp = ctx_for(launched.plan.ubatch);
        let mut session = launched.install(&mut mp, &mut cp)?;
        let t = std::time::Instant::now();
        let planned = trace(label, mp, cp, Some(&mut session))?;
        // With the decode split chosen at load.
        let plan = session.plan();
        let secs = t.elapsed().as_secs_f64();
        let c = compare(&reference, &planned);
        eprintln!(
            "{label}: {} greedy tokens {}; max |logit diff| {} over {} steps (plan: {} resident, KV {}/{} layers on the GPU, hybrid experts {}, row split {:.0}% GPU, predicted {:.1} tok/s)",
            c.n_tokens,
            match c.first_divergence {
                None => "identical to the full-GPU run".to_string(),
                Some(i) => format!("first diverge at token {i}"),
            },
            c.max_abs_logit_diff,
            c.steps_compared,
            pipeshard::plan::fmt_bytes(plan.resident_bytes()),
            plan.kv_gpu_layers,
            plan.n_layer,
            plan.hybrid_gpu_experts,
            plan.row_split_share * 100.0,
            plan.predicted.decode_tok_s,
        );
        if plan.exact {
            exact_identical &= c.identical_tokens();
        }
        report.insert(
            (*label).into(),
            serde_json::json!({
                "exact": plan.exact,
                "ubatch": plan.ubatch,
                "stream_slots": plan.stream_slots,
                "resident_bytes": plan.resident_bytes(),
                "kv_gpu_layers": plan.kv_gpu_layers,
                "hybrid_gpu_experts": plan.hybrid_gpu_experts,
                "row_split_share": plan.row_split_share,
                "predicted_decode_tok_s": plan.predicted.decode_tok_s,
                "load_and_generate_s": secs,
                "n_tokens": c.n_tokens,
                "identical_tokens": c.identical_tokens(),
                "first_divergence": c.first_divergence,
                "steps_compared": c.steps_compared,
                "max_abs_logit_diff": c.max_abs_logit_diff,
            }),
        );
    }
    println!("{}", serde_json::Value::Object(report));
    if args.require_identical && !exact_identical {
        anyhow::bail!("the exact plan diverged from the full-GPU run");
    }
    Ok(())
}
