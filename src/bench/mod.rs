//! Side-by-side benchmarks: pipeshard's plan against upstream placement
//! policies, run through the same library with pipeshard's features off.
//!
//! Each policy loads the model, processes a prompt of random tokens (TTFT),
//! then decodes greedily at that depth (tokens/s), while a sampler thread
//! reads the device's free memory to find the peak actually used.

pub mod lossless;
mod report;
pub mod routing;
pub mod routing_stats;

pub(crate) use report::median;
pub use report::{write_reports, BenchRow, RunInfo};

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::engine::{
    self, BufferType, Context, ContextParams, DeviceKind, EngineError, FlashAttention, Model, ModelParams, Token,
};
use crate::gguf::ModelInfo;
use crate::plan;

/// How weights are placed for one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// pipeshard's plan from the cost model.
    Pipeshard,
    /// The same plan with llama.cpp's synchronous copy per streamed weight
    /// instead of the streaming slots: what overlapping copies buys.
    PipeshardSync,
    /// pipeshard's exact plan (`--exact`): GPU math only, the full-GPU
    /// result token for token; what exactness costs.
    PipeshardExact,
    /// Upstream's own fit (`common_fit_params`, what `--fit` runs): the
    /// layers and tensors it keeps on the GPU so that its projected device
    /// memory leaves the card's free memory minus the budget free, with the
    /// process's memory outside llama.cpp's buffers budgeted as pipeshard
    /// budgets it.
    Fit,
    /// The largest `-ngl` whose dry run fits the budget.
    Ngl,
    /// Attention (all layers) on the GPU, FFN or experts on the CPU
    /// (`-ngl 999 -ot ffn=CPU` / `--cpu-moe`).
    AttnGpu,
    /// Everything on the GPU with no budget (`-ngl 99`): the full-GPU
    /// reference every ratio is taken against; never over its budget.
    FullGpu,
}

impl Policy {
    /// pipeshard's own plan (with streaming slots or synchronous copies), as
    /// opposed to an upstream policy.
    pub fn is_pipeshard(self) -> bool {
        matches!(self, Policy::Pipeshard | Policy::PipeshardSync | Policy::PipeshardExact)
    }
}

/// Errors of a benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Plan(#[from] plan::PlanError),
    #[error(transparent)]
    Apply(#[from] plan::apply::ApplyError),
    #[error(transparent)]
    Launch(#[from] crate::launch::LaunchError),
    #[error("no placement of this policy fits {0} bytes")]
    NoFit(u64),
    #[error("writing reports: {0}")]
    Io(#[from] std::io::Error),
}

/// The workload and settings shared by all policies.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub prompt_tokens: u32,
    pub gen_tokens: u32,
    pub ubatch: u32,
    pub threads: i32,
    pub repetitions: u32,
    pub flash_attention: FlashAttention,
    /// pipeshard's options for its plan (streaming slots, hybrid experts,
    /// profile); the budget comes per run.
    pub options: crate::launch::PipeshardOptions,
    /// Let the upstream policies repack their CPU weights (llama.cpp's
    /// default; `--no-repack` turns it off).
    pub repack: bool,
    /// The ubatch of pipeshard's plan; `None`: the planner's choice.
    pub plan_ubatch: Option<u32>,
    /// Each token's argmax on the host, from the logits copied back, instead
    /// of in the graph (backend sampling: one token id copied back).
    pub host_argmax: bool,
    /// Also measure decode as llama-bench's `tg` at the prompt's depth
    /// ([`Sample::tg_tok_s`]).
    pub tg: bool,
    /// MoE routing point: `None` and `synthetic` keep the model's router;
    /// a MoE model's run then also measures the routing it selected.
    pub routing: Option<routing::RoutingPoint>,
}

/// The benchmark router's seed: every run routes the same.
pub const ROUTING_SEED: u64 = 0x5eed_4040;

/// One measured repetition.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Sample {
    pub ttft_s: f64,
    pub decode_tok_s: f64,
    /// With [`BenchConfig::tg`]: the same decode measured as llama-bench's
    /// tg at the prompt's depth (its first repetition right after the
    /// prompt, the others from the prompt's cache with the generated cells
    /// removed, no prompt in between).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tg_tok_s: Option<f64>,
}

/// What one policy achieved at one budget.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PolicyResult {
    pub policy: Policy,
    pub budget: u64,
    /// Placement summary, e.g. "ngl 12" or the plan's resident bytes.
    pub setting: String,
    /// The ubatch the run's context used (the plan's for pipeshard).
    #[serde(default)]
    pub ubatch: u32,
    /// The weights' quantization as llama.cpp names the loaded model's file
    /// type, in the summary's spelling (`Q4_0`, `Q4_K_M`, ...).
    #[serde(default)]
    pub quant: Option<String>,
    pub load_s: f64,
    pub samples: Vec<Sample>,
    /// Peak device memory of the process during the run (sampled; NVML's
    /// figure where available), bytes.
    pub peak_vram: u64,
    /// How `peak_vram` was measured.
    #[serde(default)]
    pub peak_source: Option<engine::MemorySource>,
    /// Device bytes in llama.cpp's own buffers (weights, KV cache, compute).
    #[serde(default)]
    pub llama_device_bytes: u64,
    /// The process's device memory (NVML) at each step: before loading,
    /// after the model, after the context, after the warm-up, at the end.
    #[serde(default)]
    pub memory_steps: Vec<(String, u64)>,
    /// Peak resident host memory during the run, bytes.
    pub peak_rss: u64,
    pub over_budget: bool,
    /// Prediction of the cost model, for the pipeshard policy.
    pub predicted: Option<plan::Prediction>,
    /// With a routing point on a MoE model: the routing llama.cpp selected
    /// in one more, untimed, request of the same workload.
    #[serde(default)]
    pub routing_stats: Option<routing_stats::RoutingStats>,
}

fn cpu_buft() -> Option<BufferType> {
    engine::device_buffer_types(engine::first_device(DeviceKind::Cpu)?.index).map(|(b, _)| b)
}

fn expert_regex() -> &'static str {
    r"\.ffn_(up|down|gate|gate_up)_exps\."
}

/// Load parameters for an upstream policy with `n` as its knob.
fn upstream_params(policy: Policy, info: &ModelInfo, n: u32, repack: bool) -> ModelParams<'static> {
    let cpu = cpu_buft();
    let mut mp = ModelParams {
        repack,
        ..Default::default()
    };
    match policy {
        Policy::Ngl => mp.n_gpu_layers = n as i32,
        Policy::AttnGpu => {
            mp.n_gpu_layers = 999;
            let pat = if info.is_moe() {
                expert_regex().to_string()
            } else {
                r"\.ffn_(up|down|gate)\.".to_string()
            };
            if let Some(c) = cpu {
                mp.tensor_overrides = vec![(pat, c)];
            }
        }
        Policy::FullGpu => mp.n_gpu_layers = 999,
        Policy::Fit | Policy::Pipeshard | Policy::PipeshardSync | Policy::PipeshardExact => {}
    }
    mp
}

/// Run one policy at one budget.
pub fn run_policy(
    path: &Path,
    info: &ModelInfo,
    policy: Policy,
    budget: u64,
    cfg: &BenchConfig,
) -> Result<PolicyResult, BenchError> {
    // The prompt and the generated tokens (at least the warm-up's one),
    // rounded up to llama.cpp's 256-cell padding: 4352 for the reference
    // 4096 + 64, the context of the issues' reference cases and of
    // llama-bench's tg64 @ d4096.
    let n_ctx = (cfg.prompt_tokens + cfg.gen_tokens.max(1)).div_ceil(256) * 256;
    let mut ctx_params = ContextParams {
        n_ctx,
        n_batch: cfg.ubatch.max(cfg.prompt_tokens.min(4096)),
        n_ubatch: cfg.ubatch,
        n_threads: Some(cfg.threads),
        n_threads_batch: Some(cfg.threads),
        flash_attention: cfg.flash_attention,
        // Greedy decoding samples where the logits are: a step copies back
        // one token id, not a row of logits for the host's argmax (about 1%
        // of full-GPU decode at ~275 tok/s, issue 16).
        backend_greedy: !cfg.host_argmax,
        ..Default::default()
    };
    let mut predicted = None;
    // The process overhead pipeshard's plan budgets outside llama.cpp's buffers.
    let mut launch_check = None;
    // pipeshard's running session, whose decode split is chosen after the warm-up.
    let mut running = None;
    let margin = 64u64 << 20;
    let (mp, setting): (ModelParams<'static>, String) = match policy {
        Policy::Pipeshard | Policy::PipeshardSync | Policy::PipeshardExact => {
            let options = crate::launch::PipeshardOptions {
                exact: policy == Policy::PipeshardExact || cfg.options.exact,
                ..cfg.options.clone()
            };
            let req = crate::launch::LaunchRequest {
                budget: Some(budget),
                ubatch: cfg.plan_ubatch,
                ..crate::launch::LaunchRequest::new(
                    path,
                    &options,
                    cfg.threads,
                    plan::Workload {
                        prompt_tokens: cfg.prompt_tokens as u64,
                        gen_tokens: cfg.gen_tokens as u64,
                        speculation: None,
                        parallel: 1,
                    },
                )?
            };
            let launch =
                crate::launch::plan_for(&req, &ctx_params, |_, _| {})?.ok_or(crate::launch::LaunchError::NoGpu)?;
            let mut mp = ModelParams::default();
            let session = launch.install(&mut mp, &mut ctx_params)?;
            if policy == Policy::PipeshardSync {
                ctx_params.stream_slots = 0;
            }
            predicted = Some(launch.plan.predicted);
            launch_check = Some(launch.overhead.total());
            let p = &launch.plan;
            let streamed: u64 = p
                .tensors
                .iter()
                .filter(|t| t.exec.iter().any(|&(n, e)| n == p.ubatch && e == plan::Exec::Stream))
                .map(|t| t.bytes)
                .sum();
            let setting = format!(
                "ub {}, {} resident, {} streamed per ubatch, {} slots, KV {}/{} layers, hybrid experts {}, row split {:.0}% GPU",
                p.ubatch,
                plan::fmt_bytes(p.resident_bytes()),
                plan::fmt_bytes(streamed),
                ctx_params.stream_slots,
                p.kv_gpu_layers,
                p.n_layer,
                p.hybrid_gpu_experts,
                p.row_split_share * 100.0
            );
            running = Some(session);
            (mp, setting)
        }
        Policy::AttnGpu => (
            upstream_params(policy, info, 0, cfg.repack),
            "ngl 999, ffn/experts on CPU".into(),
        ),
        Policy::FullGpu => (
            upstream_params(policy, info, 0, cfg.repack),
            "ngl 999, no budget".into(),
        ),
        Policy::Fit => {
            // The fit leaves `margin` bytes of the GPU's free memory free;
            // what the process holds and grows outside llama.cpp's buffers
            // comes out of the budget first, as in pipeshard's plans.
            let overhead = crate::launch::ProcessOverhead::for_machine(None, n_ctx as u64);
            let held = engine::process_device_bytes().map_or(0, |(b, _)| b);
            let free = engine::first_device(DeviceKind::Gpu).map_or(0, |d| d.free_bytes);
            let buffers = budget.saturating_sub(overhead.total().max(held + overhead.runtime));
            if buffers == 0 || free <= buffers {
                return Err(BenchError::NoFit(budget));
            }
            let fitted = engine::fit_params(path, &ctx_params, free - buffers)?;
            let mut mp = upstream_params(policy, info, 0, cfg.repack);
            mp.n_gpu_layers = fitted.n_gpu_layers;
            let moved = fitted.tensor_overrides.len();
            mp.tensor_overrides = fitted.tensor_overrides;
            (
                mp,
                format!(
                    "common_fit_params: ngl {}, {moved} tensor overrides, {} MiB for llama.cpp's buffers",
                    fitted.n_gpu_layers,
                    buffers >> 20
                ),
            )
        }
        Policy::Ngl => {
            // The knob: most layers on the GPU whose dry run fits.
            let fits = |n: u32| -> Result<bool, BenchError> {
                let make = move || upstream_params(policy, info, n, cfg.repack);
                Ok(engine::dry_run_device_bytes(path, make(), ctx_params.clone())? + margin <= budget)
            };
            let (mut lo, mut hi) = (0u32, info.n_layer + 1);
            while lo < hi {
                let mid = (lo + hi).div_ceil(2);
                if fits(mid)? {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            (upstream_params(policy, info, lo, cfg.repack), format!("ngl {lo}"))
        }
    };
    let setting = if cfg.repack || policy.is_pipeshard() {
        setting
    } else {
        format!("{setting}, no repack")
    };

    let gpu_index = engine::first_device(DeviceKind::Gpu).map(|d| d.index);
    let mut memory_steps = Vec::new();
    let mut step = |label: &str| {
        if let Some((b, _)) = engine::process_device_bytes() {
            memory_steps.push((label.to_string(), b));
        }
    };
    step("before load");
    let sampler = engine::MemorySampler::start(gpu_index, Vec::new());
    let t_load = Instant::now();
    let model = Arc::new(Model::load(path, mp)?);
    let quant = crate::results::quant_from_description(&model.description());
    step("model");
    let ubatch = ctx_params.n_ubatch;
    let router = cfg.routing.and_then(|p| p.router(ROUTING_SEED));
    ctx_params.moe_route = router.as_ref().map(|r| r.policy());
    let mut ctx = Context::new(&model, ctx_params)?;
    step("context");
    let load_s = t_load.elapsed().as_secs_f64();
    let llama_device_bytes = ctx.device_bytes();

    let n_vocab = model.n_vocab();
    let mut s: u64 = 0x2545f4914f6cdd1d;
    let mut rand_token = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % (n_vocab.max(2) as u64 - 1)) as Token
    };
    let prompt: Vec<Token> = (0..cfg.prompt_tokens).map(|_| rand_token()).collect();
    // Warm-up as llama-bench's: the whole prompt, then one decode step
    // after it. Every ubatch of the timed prompt then runs at a depth that
    // already ran once (first launches of a kernel at a new shape, the
    // device pool's growth); warming up only the first ubatch left those
    // in the first repetition (R2's full-GPU TTFT 0.307 and 0.328 s in its
    // two repetitions, CHANGELOG.md, session 9).
    ctx.decode_tokens(&prompt, 0, true)?;
    ctx.decode_tokens(&[prompt[0]], prompt.len() as i32, true)?;
    // Reading the token waits for the warm-up's last decode, as
    // llama-bench's warm-up synchronises, so none of it runs into the first
    // timed prompt.
    ctx.greedy_token(-1)?;
    // pipeshard's decode split: the cost model's share or a neighbour,
    // whichever decodes fastest here, at the prompt's depth.
    let mut setting = setting;
    if let Some(session) = running.as_mut() {
        // The decode tier is in force while decoding, so the split is
        // tuned with its residency.
        if let Some(e) = session.enter_decode(&mut ctx)? {
            setting = format!("{setting}; {e}");
        }
        if let Some(t) = crate::launch::tune_split(session, &mut ctx, prompt.len() as u32 + 1)? {
            setting = format!("{setting}; decode split tuned: {t}");
        }
    }
    step("warm-up");
    if let Some(overhead) = launch_check {
        // A benchmark measures on: the row is marked over budget below.
        let check = crate::launch::verify(crate::launch::LoadedMemory {
            budget,
            llama: llama_device_bytes,
            overhead,
            process: engine::process_device_bytes(),
        });
        if let Err(e) = check {
            tracing::warn!("{e}");
        }
    }
    let mut samples = Vec::new();
    for _ in 0..cfg.repetitions.max(1) {
        ctx.clear();
        // The prompt's residency and compute buffers, outside the timing,
        // as `run` restores them when a reply ends rather than when the
        // next prompt comes.
        if let Some(session) = running.as_mut() {
            session.leave_decode(&mut ctx)?;
        }
        ctx.reset_perf();
        let t0 = Instant::now();
        ctx.decode_tokens(&prompt, 0, true)?;
        let mut tok = ctx.greedy_token(-1)?;
        let ttft = t0.elapsed().as_secs_f64();
        let prompt_perf = ctx.perf();
        ctx.reset_perf();
        let t1 = Instant::now();
        // The decode tier's change of residency counts in the decode time.
        if let Some(session) = running.as_mut() {
            session.enter_decode(&mut ctx)?;
        }
        // The first step after the prompt builds its graph again (the
        // prompt's replaced it), and CUDA captures the graph again on a
        // later one; the others reuse both. llama-bench's tg restores its
        // depth's state instead of decoding it again from its second
        // repetition on, so only its first repetition pays these steps.
        let mut first_steps = [0.0f64; 2];
        for i in 0..cfg.gen_tokens {
            ctx.decode_tokens(&[tok], (cfg.prompt_tokens + i) as i32, true)?;
            tok = ctx.greedy_token(-1)?;
            if let Some(t) = first_steps.get_mut(i as usize) {
                *t = t1.elapsed().as_secs_f64();
            }
        }
        let gen_s = t1.elapsed().as_secs_f64();
        let dec = cfg.gen_tokens as f64 / gen_s;
        // llama.cpp's own time of the same decodes, without this loop's
        // work between them (the token or the logits' argmax): what the
        // loop costs.
        let perf = ctx.perf();
        if perf.decode_tokens > 0 && perf.decode_ms > 0.0 {
            tracing::info!(
                "TTFT {ttft:.4} s (llama.cpp's prompt time {:.4} s); decode {dec:.1} tok/s, llama.cpp's time of the same {} decodes {:.1} tok/s, {} of them reused the previous graph; steps 1 and 2 {:.2} and {:.2} ms, the others {:.1} tok/s",
                prompt_perf.prompt_ms / 1e3,
                perf.decode_tokens,
                perf.decode_tokens as f64 * 1e3 / perf.decode_ms,
                perf.graphs_reused,
                first_steps[0] * 1e3,
                (first_steps[1] - first_steps[0]) * 1e3,
                cfg.gen_tokens.saturating_sub(2) as f64 / (gen_s - first_steps[1]).max(1e-9)
            );
        }
        samples.push(Sample {
            ttft_s: ttft,
            decode_tok_s: dec,
            tg_tok_s: None,
        });
    }
    if cfg.tg {
        // llama-bench's tg64 @ d4096: its first repetition decodes the depth
        // and then the timed tokens; the others restore the depth's cache
        // and decode the timed tokens only, so the graph of the previous
        // repetition's last step is reused from their first step on. Here
        // the prompt's cells stay and the generated ones are removed. The
        // first token is the prompt's greedy one, as in the repetitions above.
        // llama-bench does not time its depth's fill: the decode tier comes
        // with it.
        let first = fill_depth(&mut ctx, &prompt, running.as_mut())?;
        // Each repetition's tokens continue the prompt's routing process,
        // and its cache (a recurrent state restored, not cut back).
        let depth_routing = router.as_ref().map(|r| r.snapshot());
        let depth = ctx.seq0().mark()?;
        for sample in samples.iter_mut() {
            ctx.seq0().rewind(&depth)?;
            if let (Some(r), Some(s)) = (&router, &depth_routing) {
                r.restore(s);
            }
            let t = Instant::now();
            decode_greedy(&mut ctx, first, cfg.prompt_tokens, cfg.gen_tokens)?;
            let tg = cfg.gen_tokens as f64 / t.elapsed().as_secs_f64();
            tracing::info!(
                "tg{} @ d{} (as llama-bench measures it): {tg:.1} tok/s",
                cfg.gen_tokens,
                cfg.prompt_tokens
            );
            sample.tg_tok_s = Some(tg);
        }
    }
    let routing_stats = match cfg.routing {
        Some(_) if info.is_moe() => measure_routing(&mut ctx, &prompt, cfg, running.as_mut())?,
        _ => None,
    };
    step("end");
    drop(ctx);
    drop(model);
    let peaks = sampler.stop();
    Ok(PolicyResult {
        policy,
        budget,
        setting,
        ubatch,
        quant,
        load_s,
        samples,
        peak_vram: peaks.device,
        peak_source: peaks.source,
        llama_device_bytes,
        memory_steps,
        peak_rss: peaks.rss,
        over_budget: policy != Policy::FullGpu && peaks.device > budget,
        predicted,
        routing_stats,
    })
}

/// The routing llama.cpp selects for one more request of the workload (the
/// prompt, then the generated tokens), read back from the graph outside the
/// timed runs: reading the ids waits for each ubatch.
fn measure_routing(
    ctx: &mut Context<'_>,
    prompt: &[Token],
    cfg: &BenchConfig,
    session: Option<&mut crate::launch::Session>,
) -> Result<Option<routing_stats::RoutingStats>, BenchError> {
    let recorder = routing_stats::Recorder::default();
    ctx.set_moe_observer(Some(recorder.observer()));
    let first = fill_depth(ctx, prompt, session)?;
    decode_greedy(ctx, first, cfg.prompt_tokens, cfg.gen_tokens)?;
    ctx.set_moe_observer(None);
    Ok(recorder.stats())
}

/// A new request's `prompt` in `ctx`, with the prompt's residency before
/// it and the decode tier's after it: the depth generated tokens continue
/// from. Returns the prompt's greedy token.
fn fill_depth(
    ctx: &mut Context<'_>,
    prompt: &[Token],
    mut session: Option<&mut crate::launch::Session>,
) -> Result<Token, BenchError> {
    ctx.clear();
    if let Some(s) = session.as_deref_mut() {
        s.leave_decode(ctx)?;
    }
    ctx.decode_tokens(prompt, 0, true)?;
    let first = ctx.greedy_token(-1)?;
    if let Some(s) = session {
        s.enter_decode(ctx)?;
    }
    Ok(first)
}

/// `n` greedy tokens decoded one by one after `first`, at `depth` on.
fn decode_greedy(ctx: &mut Context<'_>, first: Token, depth: u32, n: u32) -> Result<(), BenchError> {
    let mut tok = first;
    for i in 0..n {
        ctx.decode_tokens(&[tok], (depth + i) as i32, true)?;
        tok = ctx.greedy_token(-1)?;
    }
    Ok(())
}
