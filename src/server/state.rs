//! Server state: the configuration, counters, and — once loading is done —
//! the model, the slot worker, the embedder and the chat template.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};

use crate::engine::{self, ffi, ContextParams, Model, ModelParams};

use super::chat_template::ChatTemplate;
use super::config::ServerConfig;
use super::device_gate::DeviceGate;
use super::embedding::Embedder;
use super::error::{ApiError, ServerError};
use super::metrics::Metrics;
use super::scheduler::{self, SchedulerHandle};
use super::vision::VisionHandle;

/// What exists once the model is loaded.
pub struct Ready {
    pub model: Arc<Model>,
    pub scheduler: SchedulerHandle,
    pub embedder: Option<Embedder>,
    /// The image worker, with `--mmproj`.
    pub vision: Option<VisionHandle>,
    /// Samples device memory for `pipeshard_vram_peak_bytes` while serving.
    pub device_sampler: Option<crate::engine::MemorySampler>,
    /// `Err` holds why chat requests cannot be served.
    pub template: Result<ChatTemplate, String>,
    /// The id reported in `/v1/models` and responses.
    pub model_id: String,
    /// Unix time the model was loaded.
    pub created: u64,
}

/// Shared by every request handler.
pub struct AppState {
    pub config: ServerConfig,
    pub metrics: Arc<Metrics>,
    ready: OnceLock<Ready>,
}

impl AppState {
    /// State for a server whose model is still loading.
    pub fn new(config: ServerConfig) -> Self {
        let metrics = Arc::new(Metrics::default());
        metrics
            .vram_budget_bytes
            .store(config.vram_budget.unwrap_or(0), Relaxed);
        AppState {
            config,
            metrics,
            ready: OnceLock::new(),
        }
    }

    /// The loaded model and workers, or 503 while loading.
    pub fn ready(&self) -> Result<&Ready, ApiError> {
        self.ready.get().ok_or_else(ApiError::loading)
    }

    /// Whether loading has finished.
    pub fn is_ready(&self) -> bool {
        self.ready.get().is_some()
    }

    pub(crate) fn set_ready(&self, r: Ready) {
        let _ = self.ready.set(r);
    }
}

fn kv_type(name: &str) -> Option<ffi::ggml_type> {
    Some(match name {
        "f32" => ffi::GGML_TYPE_F32,
        "f16" => ffi::GGML_TYPE_F16,
        "bf16" => ffi::GGML_TYPE_BF16,
        "q8_0" => ffi::GGML_TYPE_Q8_0,
        "q4_0" => ffi::GGML_TYPE_Q4_0,
        "q4_1" => ffi::GGML_TYPE_Q4_1,
        "iq4_nl" => ffi::GGML_TYPE_IQ4_NL,
        "q5_0" => ffi::GGML_TYPE_Q5_0,
        "q5_1" => ffi::GGML_TYPE_Q5_1,
        _ => return None,
    })
}

/// Load the model and start the workers (blocking; run it off the async runtime).
pub fn load(config: &ServerConfig, metrics: Arc<Metrics>) -> Result<Ready, ServerError> {
    let err = |e: &dyn std::fmt::Display| ServerError::Load(e.to_string());
    let path = match &config.model {
        Some(p) => p.clone(),
        None => crate::default_model::ensure().map_err(|e| err(&e))?,
    };
    engine::init(config.backend_dir.as_deref()).map_err(|e| err(&e))?;
    let device_sampler = engine::first_device(engine::DeviceKind::Gpu).map(|d| {
        let sampler = crate::engine::MemorySampler::every(Some(d.index), std::time::Duration::from_millis(10));
        let _ = metrics.vram_peak_bytes.set(sampler.device_peak());
        sampler
    });
    let mut overrides = Vec::new();
    for (pat, buft) in &config.tensor_overrides {
        let b = engine::buffer_types()
            .into_iter()
            .find(|b| b.name().eq_ignore_ascii_case(buft))
            .ok_or_else(|| ServerError::Load(format!("unknown buffer type {buft:?} in -ot {pat}={buft}")))?;
        overrides.push((pat.clone(), b));
    }
    // pipeshard's plan, when --plan or --vram-budget is given.
    let threads = config.threads.unwrap_or_else(engine::default_threads);
    let options = crate::launch::PipeshardOptions {
        vram_budget: None,
        profile: config.profile.clone(),
        plan: config.plan.clone(),
        stream_slots: config.stream_slots,
        hybrid_experts: config.hybrid_gpu_experts,
        ..Default::default()
    };
    let mut options_with_budget = options.clone();
    options_with_budget.vram_budget = config.vram_budget.map(|b| b.to_string());
    let vision_opts = crate::launch::vision_options(
        &options_with_budget,
        config.mmproj_offload && config.n_gpu_layers != 0,
        threads,
    );
    let vision = crate::launch::vision_setup(
        &path,
        config.mmproj.as_deref(),
        vision_opts,
        config.plan.is_none(),
        &engine::PeakImage::Largest,
    )
    .map_err(|e| err(&e))?;
    let mut mparams = ModelParams {
        n_gpu_layers: config.n_gpu_layers,
        use_mmap: config.use_mmap,
        repack: config.repack,
        tensor_overrides: overrides,
        ..Default::default()
    };
    let n_parallel = config.n_parallel.max(1);
    let mut cparams = ContextParams {
        n_ctx: config.n_ctx,
        n_batch: config.n_batch,
        n_seq_max: n_parallel,
        n_threads: config.threads,
        n_threads_batch: config.threads_batch.or(config.threads),
        flash_attention: config.flash_attention,
        embeddings: false,
        offload_kqv: config.kv_offload,
        op_offload: config.op_offload,
        type_k: config.cache_type_k.as_deref().and_then(kv_type),
        type_v: config.cache_type_v.as_deref().and_then(kv_type),
        kv_unified: config.kv_unified,
        n_ubatch: config.n_ubatch,
        n_outputs_max: 0,
        ..ContextParams::default()
    };
    let req = crate::launch::LaunchRequest {
        budget: config.vram_budget,
        vision: vision.unwrap_or_default(),
        // The vision worker and the embedder each have a context of one
        // slot's length beside the slots' own.
        side_contexts: [config.mmproj.is_some(), config.embeddings]
            .into_iter()
            .filter(|&on| on)
            .map(|_| (config.n_ctx as u64 / config.n_parallel.max(1) as u64).max(64))
            .collect(),
        ..crate::launch::LaunchRequest::new(&path, &options, threads, Default::default()).map_err(|e| err(&e))?
    };
    let planned = crate::launch::plan_for(&req, &cparams, |_, _| {}).map_err(|e| err(&e))?;
    if let Some(l) = &planned {
        tracing::info!(
            "plan: ubatch {}, {} resident, VRAM {} of {}",
            l.plan.ubatch,
            crate::plan::fmt_bytes(l.plan.resident_bytes()),
            crate::plan::fmt_bytes(l.plan.vram.total),
            crate::plan::fmt_bytes(l.plan.vram.budget)
        );
        l.install(&mut mparams, &mut cparams).map_err(|e| err(&e))?;
    }
    tracing::info!("loading model {}", path.display());
    let model = Model::load(&path, mparams).map_err(|e| err(&e))?;
    let model = Arc::new(model);
    let streamed = planned.as_ref().map(|l| l.plan.streamed_per_tier());
    // Lent by the text slots to the vision worker while it encodes an image.
    let gate = Arc::new(DeviceGate::default());
    let slots_gate = config.mmproj.is_some().then(|| gate.clone());
    let (scheduler, mem) =
        scheduler::spawn(model.clone(), cparams.clone(), streamed, slots_gate, metrics.clone()).map_err(|e| err(&e))?;
    let vram: u64 = mem.iter().filter(|m| !m.is_host).map(|m| m.total()).sum();
    let embedder = if config.embeddings {
        let n = scheduler.n_ctx_slot.max(64);
        let e = Embedder::spawn(
            model.clone(),
            ContextParams {
                n_ctx: n,
                n_batch: n,
                n_ubatch: n,
                n_seq_max: 1,
                ..cparams.clone()
            },
        )
        .map_err(|e| err(&e))?;
        Some(e)
    } else {
        None
    };
    let vision = match &config.mmproj {
        Some(mm) => {
            tracing::info!("loading multimodal projector {}", mm.display());
            let n = scheduler.n_ctx_slot.max(64);
            let v = VisionHandle::spawn(
                model.clone(),
                mm,
                config.media_dir.clone(),
                vision_opts,
                ContextParams {
                    n_ctx: n,
                    n_seq_max: 1,
                    offload: None,
                    ..cparams.clone()
                },
                gate,
            )
            .map_err(|e| err(&e))?;
            tracing::info!(
                "vision requests are served one at a time ({} tokens of context)",
                v.n_ctx
            );
            Some(v)
        }
        None => None,
    };
    metrics.vram_used_bytes.store(vram, Relaxed);
    let template =
        ChatTemplate::select(&model, config.chat_template.as_deref(), config.jinja).map_err(|e| e.to_string());
    match &template {
        Ok(t) => tracing::info!(
            "chat template: {}",
            if t.is_jinja() { "jinja" } else { "llama.cpp built-in" }
        ),
        Err(e) => tracing::warn!("chat requests will fail: {e}"),
    }
    let model_id = config
        .alias
        .first()
        .cloned()
        .unwrap_or_else(|| path.display().to_string());
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    tracing::info!(
        "model loaded: {} ({} slots, {} tokens of context each)",
        model.description(),
        scheduler.n_parallel,
        scheduler.n_ctx_slot
    );
    Ok(Ready {
        model,
        scheduler,
        embedder,
        vision,
        device_sampler,
        template,
        model_id,
        created,
    })
}
