//! Running the micro-benchmarks that make up a [`MachineProfile`].

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{AttnSample, Device, MachineProfile, MatmulSample, Missing, ProfileError, ProfileKey};
use crate::engine::opbench::{self, Backend};
use crate::engine::{self, ffi, DeviceKind};
use crate::gguf::GgmlType;

/// How thorough a measurement is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ProfileMode {
    /// A handful of samples, seconds on any machine (tests, smoke checks).
    Tiny,
    /// Under a minute: the common weight types and batch sizes.
    Fast,
    /// Every type, batch size and thread count, and the busy-link figures.
    Full,
}

struct Plan {
    types: Vec<GgmlType>,
    cpu_tokens: Vec<i64>,
    gpu_tokens: Vec<i64>,
    shape: (i64, i64),
    /// A smaller weight (an attention projection's size) timed on the GPU
    /// at these batch sizes: big batches run it less efficiently than
    /// `shape`. Small batches are left out: four such weights fit in the
    /// GPU's cache, which a model's weights do not.
    gpu_small: Option<((i64, i64), Vec<i64>)>,
    expert_shape: (i64, i64, i64, i64),
    min_time: Duration,
    attn: Vec<(i64, i64)>,
    busy: bool,
}

fn plan_for(mode: ProfileMode) -> Plan {
    use GgmlType::*;
    match mode {
        ProfileMode::Tiny => Plan {
            types: vec![Q4_0, F16],
            cpu_tokens: vec![1, 16],
            gpu_tokens: vec![1, 512],
            shape: (1024, 1024),
            gpu_small: None,
            expert_shape: (512, 256, 16, 4),
            min_time: Duration::from_millis(5),
            attn: vec![(1, 256)],
            busy: false,
        },
        ProfileMode::Fast => Plan {
            types: vec![F16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K],
            cpu_tokens: vec![1, 4, 32, 256],
            gpu_tokens: vec![1, 32, 512, 2048, 4096],
            // 4096 x 32768: 72 MiB at 4.5 bits, larger than the caches, so
            // small batches measure memory, not cache, bandwidth.
            shape: (4096, 32768),
            gpu_small: Some(((4096, 4096), vec![512, 4096])),
            expert_shape: (2048, 768, 128, 8),
            min_time: Duration::from_millis(30),
            attn: vec![(1, 4096), (512, 4096), (4096, 4096)],
            busy: true,
        },
        ProfileMode::Full => Plan {
            types: vec![F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K, Q3_K, Q2_K, IQ4_XS],
            cpu_tokens: vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
            gpu_tokens: vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096],
            // 4096 x 32768: 72 MiB at 4.5 bits, larger than the caches, so
            // small batches measure memory, not cache, bandwidth.
            shape: (4096, 32768),
            gpu_small: Some(((4096, 4096), vec![512, 1024, 2048, 4096])),
            expert_shape: (2048, 768, 128, 8),
            min_time: Duration::from_millis(100),
            attn: vec![
                (1, 1024),
                (1, 4096),
                (1, 16384),
                (512, 4096),
                (2048, 4096),
                (4096, 4096),
            ],
            busy: true,
        },
    }
}

/// Sustained read bandwidth of host memory with `threads` threads.
fn cpu_memory_bandwidth(threads: usize, bytes: usize, min_time: Duration) -> f64 {
    let words = bytes / 8 / threads * threads;
    let data: Vec<u64> = (0..words as u64).collect();
    let chunk = words / threads;
    let read_all = || {
        std::thread::scope(|s| {
            let hs: Vec<_> = data
                .chunks(chunk)
                .map(|c| s.spawn(move || c.iter().fold(0u64, |a, &x| a.wrapping_add(x))))
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0u64, u64::wrapping_add)
        })
    };
    std::hint::black_box(read_all());
    let t0 = Instant::now();
    let mut reps = 0usize;
    while reps < 2 || t0.elapsed() < min_time {
        std::hint::black_box(read_all());
        reps += 1;
    }
    (words * 8 * reps) as f64 / t0.elapsed().as_secs_f64()
}

/// One device's share of the measurements.
struct Sweep<'a> {
    plan: &'a Plan,
    device: Device,
    backend: &'a Backend,
}

impl Sweep<'_> {
    /// Dense `k` x `n` matmuls of every planned type at each batch size.
    fn dense(
        &self,
        (k, n): (i64, i64),
        tokens: &[i64],
        types: &[GgmlType],
        link_busy: bool,
        out: &mut Vec<MatmulSample>,
        step: &mut dyn FnMut(),
    ) -> Result<(), ProfileError> {
        for &ty in types {
            for &t in tokens {
                let seconds =
                    opbench::time_mul_mat(self.backend, ty.id() as ffi::ggml_type, k, n, t, self.plan.min_time)?;
                out.push(MatmulSample {
                    device: self.device,
                    ty: ty.name().into(),
                    k,
                    n,
                    tokens: t,
                    experts: None,
                    link_busy,
                    seconds,
                });
                step();
            }
        }
        Ok(())
    }

    /// Expert matmuls (MUL_MAT_ID) of type `ty` at each batch size; for
    /// single tokens also with half the experts per token, which shows the
    /// op's fixed cost (hybrid experts give each device part of a token's
    /// experts).
    fn experts(
        &self,
        ty: GgmlType,
        tokens: &[i64],
        out: &mut Vec<MatmulSample>,
        step: &mut dyn FnMut(),
    ) -> Result<(), ProfileError> {
        let (k, n, e, u) = self.plan.expert_shape;
        for &t in tokens {
            let used: &[i64] = if t == 1 && u > 1 { &[u, u / 2] } else { &[u] };
            for &u in used {
                let seconds = opbench::time_mul_mat_id(
                    self.backend,
                    ty.id() as ffi::ggml_type,
                    k,
                    n,
                    (e, u),
                    t,
                    self.plan.min_time,
                )?;
                out.push(MatmulSample {
                    device: self.device,
                    ty: ty.name().into(),
                    k,
                    n,
                    tokens: t,
                    experts: Some((e, u)),
                    link_busy: false,
                    seconds,
                });
            }
            step();
        }
        Ok(())
    }

    /// Flash attention (head dim 128, 32 query and 8 KV heads), queries capped at `max_tokens`.
    fn attention(
        &self,
        max_tokens: i64,
        out: &mut Vec<AttnSample>,
        step: &mut dyn FnMut(),
    ) -> Result<(), ProfileError> {
        for &(t, kv) in &self.plan.attn {
            let t = t.min(max_tokens);
            let seconds = opbench::time_flash_attn(self.backend, 128, 32, 8, t, kv, self.plan.min_time)?;
            out.push(AttnSample {
                device: self.device,
                head_dim: 128,
                n_head: 32,
                n_head_kv: 8,
                tokens: t,
                n_kv: kv,
                seconds,
            });
            step();
        }
        Ok(())
    }
}

/// Measure this machine. `progress` gets (done, total) steps.
pub fn measure(
    mode: ProfileMode,
    threads: i32,
    mut progress: impl FnMut(u64, u64),
) -> Result<MachineProfile, ProfileError> {
    let t_start = Instant::now();
    engine::init(None)?;
    // The devices now, remote ones (--rpc) included.
    let devices = engine::list_devices();
    let cpu_index = devices.iter().find(|d| d.kind == DeviceKind::Cpu).map(|d| d.index);
    let gpu = devices.iter().find(|d| d.kind == DeviceKind::Gpu).cloned();
    let plan = plan_for(mode);

    let n_types = plan.types.len() as u64;
    let gpu_steps = if gpu.is_some() {
        n_types * (plan.gpu_tokens.len() + plan.gpu_small.as_ref().map_or(0, |s| s.1.len())) as u64
            + 4
            + plan.attn.len() as u64
    } else {
        0
    };
    let busy_steps = if gpu.is_some() && plan.busy {
        plan.cpu_tokens.len() as u64
    } else {
        0
    };
    let total = 1 + n_types * plan.cpu_tokens.len() as u64 + 2 + plan.attn.len() as u64 + gpu_steps + busy_steps;
    let mut done = 0u64;
    let mut step = |progress: &mut dyn FnMut(u64, u64)| {
        done += 1;
        progress(done, total);
    };

    let mem_bytes = if mode == ProfileMode::Tiny { 64 << 20 } else { 1 << 30 };
    let cpu_mem_bw = cpu_memory_bandwidth(threads.max(1) as usize, mem_bytes, plan.min_time * 4);
    step(&mut progress);

    let mut matmul = Vec::new();
    let mut attention = Vec::new();
    let mut tick = || step(&mut progress);
    if let Some(ci) = cpu_index {
        let mut cpu = Backend::open(ci)?;
        cpu.set_threads(threads);
        let sweep = Sweep {
            plan: &plan,
            device: Device::Cpu,
            backend: &cpu,
        };
        sweep.dense(plan.shape, &plan.cpu_tokens, &plan.types, false, &mut matmul, &mut tick)?;
        sweep.experts(GgmlType::Q4_0, CPU_EXPERT_TOKENS, &mut matmul, &mut tick)?;
        // A prompt chunk's attention on the CPU costs far less per query
        // than a few queries' (measured on the H200's host: R1 with 24 of
        // 32 layers' KV on the CPU prefilled 4,090 tokens in 0.92 s where
        // 64-query samples predicted 11 s), so chunks are sampled too.
        sweep.attention(
            if mode == ProfileMode::Tiny { 1 } else { 512 },
            &mut attention,
            &mut tick,
        )?;
    }

    let mut link = None;
    let mut gpu_memory = None;
    if let Some(g) = &gpu {
        gpu_memory = Some((g.free_bytes, g.total_bytes));
        let link_bytes = if mode == ProfileMode::Tiny { 16 << 20 } else { 256 << 20 };
        link = Some(opbench::measure_link(g.index, link_bytes, plan.min_time * 4)?);
        tick();
        let gb = Backend::open(g.index)?;
        let sweep = Sweep {
            plan: &plan,
            device: Device::Gpu,
            backend: &gb,
        };
        sweep.dense(plan.shape, &plan.gpu_tokens, &plan.types, false, &mut matmul, &mut tick)?;
        if let Some((shape, tokens)) = &plan.gpu_small {
            sweep.dense(*shape, tokens, &plan.types, false, &mut matmul, &mut tick)?;
        }
        sweep.experts(GgmlType::Q4_0, GPU_EXPERT_TOKENS, &mut matmul, &mut tick)?;
        sweep.attention(i64::MAX, &mut attention, &mut tick)?;
        // CPU matmuls while the link streams host-to-device copies.
        if let (true, Some(ci)) = (plan.busy, cpu_index) {
            beside_copies(&plan, (ci, g.index), threads, &[GgmlType::Q4_0], &mut matmul, &mut tick)?;
        }
    }
    let index = |device| match device {
        Device::Cpu => cpu_index,
        Device::Gpu => gpu.as_ref().map(|g| g.index),
    };
    measure_outliers_again(&plan, &mut matmul, threads, index);

    let mut profile = MachineProfile {
        key: ProfileKey::current(threads),
        mode,
        measured_in_s: t_start.elapsed().as_secs_f64(),
        cpu_mem_bw,
        link,
        host_read_bw_with_link: None,
        gpu_memory,
        process_context_bytes: crate::engine::process_bytes_at_init(),
        matmul,
        attention,
    };
    profile.make_consistent();
    Ok(profile)
}

/// Batch sizes of the expert samples on the CPU and on the GPU.
const CPU_EXPERT_TOKENS: &[i64] = &[1, 16];
const GPU_EXPERT_TOKENS: &[i64] = &[1, 512, 4096];

/// Dense CPU matmuls of `types` (the plan's shape and CPU batch sizes) on
/// the CPU backend `ci` while the link streams host-to-device copies to the
/// GPU `gi`: what a row split's CPU part runs at beside its copies.
fn beside_copies(
    plan: &Plan,
    (ci, gi): (usize, usize),
    threads: i32,
    types: &[GgmlType],
    out: &mut Vec<MatmulSample>,
    tick: &mut dyn FnMut(),
) -> Result<(), ProfileError> {
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| -> Result<(), ProfileError> {
        let copier = s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if opbench::measure_link(gi, 256 << 20, Duration::from_millis(50)).is_err() {
                    break;
                }
            }
        });
        let res = Backend::open(ci).map_err(ProfileError::from).and_then(|mut cpu| {
            cpu.set_threads(threads);
            let sweep = Sweep {
                plan,
                device: Device::Cpu,
                backend: &cpu,
            };
            sweep.dense(plan.shape, &plan.cpu_tokens, types, true, out, tick)
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = copier.join();
        res
    })
}

/// Steps [`measure_missing`] takes for `missing` (one per batch size).
pub fn missing_steps(profile: &MachineProfile, missing: &Missing) -> u64 {
    let plan = plan_for(profile.mode);
    let experts: usize = missing
        .experts
        .iter()
        .map(|(d, _)| match d {
            Device::Cpu => CPU_EXPERT_TOKENS.len(),
            Device::Gpu => GPU_EXPERT_TOKENS.len(),
        })
        .sum();
    (experts + missing.beside_copies.len() * plan.cpu_tokens.len()) as u64
}

/// Measure the samples `missing` names on this machine into `profile`, at
/// its mode's shapes, with `threads` CPU threads; `progress` gets (done,
/// total) steps. A type ggml cannot time is left out with a warning (the
/// cost model then prices it by the nearest type measured).
pub fn measure_missing(
    profile: &mut MachineProfile,
    missing: &Missing,
    threads: i32,
    mut progress: impl FnMut(u64, u64),
) -> Result<(), ProfileError> {
    let devices = engine::init(None)?;
    let index = |kind: DeviceKind| devices.iter().find(|d| d.kind == kind).map(|d| d.index);
    let plan = plan_for(profile.mode);
    let total = missing_steps(profile, missing);
    let mut done = 0u64;
    let mut tick = || {
        done += 1;
        progress(done.min(total), total);
    };
    let t0 = Instant::now();
    let mut matmul = Vec::new();
    for &(device, ty) in &missing.experts {
        let (Some(i), tokens) = (match device {
            Device::Cpu => (index(DeviceKind::Cpu), CPU_EXPERT_TOKENS),
            Device::Gpu => (index(DeviceKind::Gpu), GPU_EXPERT_TOKENS),
        }) else {
            continue;
        };
        let mut backend = Backend::open(i)?;
        if device == Device::Cpu {
            backend.set_threads(threads);
        }
        let sweep = Sweep {
            plan: &plan,
            device,
            backend: &backend,
        };
        let mut samples = Vec::new();
        match sweep.experts(ty, tokens, &mut samples, &mut tick) {
            Ok(()) => matmul.append(&mut samples),
            Err(e) => tracing::warn!("profile: {ty} experts on the {device:?} not measured: {e}"),
        }
    }
    if let (false, Some(ci), Some(gi)) = (
        missing.beside_copies.is_empty(),
        index(DeviceKind::Cpu),
        index(DeviceKind::Gpu),
    ) {
        for &ty in &missing.beside_copies {
            let mut samples = Vec::new();
            match beside_copies(&plan, (ci, gi), threads, &[ty], &mut samples, &mut tick) {
                Ok(()) => matmul.append(&mut samples),
                Err(e) => tracing::warn!("profile: {ty} beside the link's copies not measured: {e}"),
            }
        }
    }
    measure_outliers_again(&plan, &mut matmul, threads, |device| match device {
        Device::Cpu => index(DeviceKind::Cpu),
        Device::Gpu => index(DeviceKind::Gpu),
    });
    profile.matmul.append(&mut matmul);
    profile.measured_in_s += t0.elapsed().as_secs_f64();
    profile.make_consistent();
    Ok(())
}

/// A second pass over the expert samples whose group breaks the
/// consistency rule ([`super::consistency`]): each is timed again, later
/// than the first pass (whatever slowed the host may have passed), and
/// keeps the faster of its two times. `index` gives a device's backend
/// index. A sample that cannot be timed again keeps its first time
/// (the repair after this pass bounds it).
fn measure_outliers_again(
    plan: &Plan,
    samples: &mut [MatmulSample],
    threads: i32,
    index: impl Fn(Device) -> Option<usize>,
) {
    for i in super::consistency::inconsistent(samples) {
        let s = &mut samples[i];
        match time_again(plan, s, threads, index(s.device)) {
            Ok(Some(t)) => s.seconds = s.seconds.min(t),
            Ok(None) => {}
            Err(e) => tracing::warn!(
                "profile: {} experts on the {:?} not measured again: {e}",
                s.ty,
                s.device
            ),
        }
    }
}

/// The expert sample `s` timed again on the backend `backend` (None where
/// the device or the type is unknown here).
fn time_again(
    plan: &Plan,
    s: &MatmulSample,
    threads: i32,
    backend: Option<usize>,
) -> Result<Option<f64>, ProfileError> {
    let (Some(bi), Some(ty), Some(experts)) = (backend, GgmlType::from_name(&s.ty), s.experts) else {
        return Ok(None);
    };
    let mut backend = Backend::open(bi)?;
    if s.device == Device::Cpu {
        backend.set_threads(threads);
    }
    let t = opbench::time_mul_mat_id(
        &backend,
        ty.id() as ffi::ggml_type,
        s.k,
        s.n,
        experts,
        s.tokens,
        plan.min_time,
    )?;
    Ok(Some(t))
}
