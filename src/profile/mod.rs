//! The machine profile: measured speeds of this machine's CPU, GPU and link,
//! which the planner's cost model reads.
//!
//! A profile is YAML under `profiles/`, keyed by CPU model, GPU and thread
//! count. [`measure`] produces one; [`MachineProfile::load_matching`] finds
//! one for the current machine. Rates are looked up by the nearest measured
//! batch size and scaled by work ([`MachineProfile::matmul_seconds`]).

mod consistency;
mod devices;
mod measure;
mod types_used;

pub use devices::load_devices;
pub use measure::{measure, measure_missing, missing_steps, ProfileMode};
pub use types_used::{Missing, TypesUsed};

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::gguf::GgmlType;

/// Errors reading, writing or finding a profile.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a valid profile: {source}")]
    Parse { path: PathBuf, source: serde_yaml::Error },
    #[error("serialising the profile: {0}")]
    Serialize(#[from] serde_yaml::Error),
    #[error("measuring: {0}")]
    Engine(#[from] crate::engine::EngineError),
    #[error("the profile has no {what} measurements for {ty}")]
    Missing { what: &'static str, ty: String },
    #[error("no directory for profiles: the user's data directory is unknown (set {PROFILE_DIR_ENV}, or HOME)")]
    NoDir,
}

/// Which device an op runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    Cpu,
    Gpu,
}

/// What identifies a machine for profile reuse.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileKey {
    pub cpu: String,
    /// GPU name, or None on a CPU-only machine.
    pub gpu: Option<String>,
    pub threads: i32,
}

impl ProfileKey {
    /// The key of this machine, with the devices ggml has loaded.
    pub fn current(threads: i32) -> ProfileKey {
        let gpu = crate::engine::first_device(crate::engine::DeviceKind::Gpu).map(|d| d.description);
        ProfileKey {
            cpu: cpu_model(),
            gpu,
            threads,
        }
    }

    /// A file name for this key.
    pub fn file_name(&self) -> String {
        let clean = |s: &str| {
            s.chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() {
                        c.to_ascii_lowercase()
                    } else {
                        '-'
                    }
                })
                .collect::<String>()
                .split('-')
                .filter(|p| !p.is_empty())
                .collect::<Vec<_>>()
                .join("-")
        };
        format!(
            "{}__{}__t{}.yaml",
            clean(&self.cpu),
            clean(self.gpu.as_deref().unwrap_or("cpu-only")),
            self.threads
        )
    }
}

/// The CPU model name from /proc/cpuinfo.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// One matmul measurement: `tokens` columns through a `k × n` weight.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MatmulSample {
    pub device: Device,
    #[serde(rename = "type")]
    pub ty: String,
    pub k: i64,
    pub n: i64,
    pub tokens: i64,
    /// For expert matmuls: experts in the tensor and experts per token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experts: Option<(i64, i64)>,
    /// Measured while the link was busy with host-to-device copies.
    #[serde(default)]
    pub link_busy: bool,
    pub seconds: f64,
}

impl MatmulSample {
    /// What a series of samples shares: everything but the batch size.
    fn series(&self) -> (Device, &str, Option<(i64, i64)>, bool, i64, i64) {
        (self.device, &self.ty, self.experts, self.link_busy, self.k, self.n)
    }
}

/// One flash-attention measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttnSample {
    pub device: Device,
    pub head_dim: i64,
    pub n_head: i64,
    pub n_head_kv: i64,
    pub tokens: i64,
    pub n_kv: i64,
    pub seconds: f64,
}

/// Host↔device copy speeds, bytes per second.
pub type Link = crate::engine::opbench::LinkBandwidth;

/// Everything measured about a machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineProfile {
    pub key: ProfileKey,
    pub mode: ProfileMode,
    /// Seconds the measurement took.
    pub measured_in_s: f64,
    /// Sustained CPU memory read bandwidth with all threads, bytes/s.
    pub cpu_mem_bw: f64,
    /// None without a GPU.
    pub link: Option<Link>,
    /// Host memory read bandwidth, bytes/s, of the CPU's reads and pinned
    /// host-to-device copies together, while both run: what a row split's
    /// CPU part has left beside its copies (patch 0017). None where not
    /// measured: the CPU is priced as if the copies took nothing from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_read_bw_with_link: Option<f64>,
    /// Free and total device memory when measured, bytes.
    #[serde(default)]
    pub gpu_memory: Option<(u64, u64)>,
    /// The process's device memory (NVML) once the GPU backend is up and
    /// before any model is loaded: the CUDA context and what the backend
    /// allocates up front. Planning on another machine budgets this for the
    /// process; a run on this one measures its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_context_bytes: Option<u64>,
    pub matmul: Vec<MatmulSample>,
    pub attention: Vec<AttnSample>,
}

impl MachineProfile {
    /// Read a profile file.
    pub fn load(path: &Path) -> Result<MachineProfile, ProfileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut profile: MachineProfile = serde_yaml::from_str(&text).map_err(|source| ProfileError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        profile.make_consistent();
        Ok(profile)
    }

    /// Repairs what a slowed host left in the samples: expert samples
    /// inconsistent across the experts used, with a warning
    /// ([`consistency::consistent_expert_seconds`] has the rule), then each
    /// series across batch sizes ([`Self::make_monotone`]).
    pub fn make_consistent(&mut self) {
        consistency::repair(&mut self.matmul);
        self.make_monotone();
    }

    /// Makes every matmul series non-decreasing in tokens: more columns
    /// through the same weight never take less time (one column could be
    /// computed as part of many). A noisy sample that breaks this would
    /// make the planner prefer the larger batch for the wrong reason.
    pub fn make_monotone(&mut self) {
        self.matmul
            .sort_by(|a, b| (a.series(), a.tokens).cmp(&(b.series(), b.tokens)));
        for i in 1..self.matmul.len() {
            let (prev, cur) = (&self.matmul[i - 1], &self.matmul[i]);
            if prev.series() == cur.series() && cur.seconds < prev.seconds {
                self.matmul[i].seconds = prev.seconds;
            }
        }
    }

    /// Write it as YAML.
    pub fn save(&self, path: &Path) -> Result<(), ProfileError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| ProfileError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        let text = serde_yaml::to_string(self)?;
        std::fs::write(path, text).map_err(|source| ProfileError::Io {
            path: path.to_path_buf(),
            source,
        })
    }

    /// A profile in `dir` whose key matches `key`, if any.
    pub fn load_matching(dir: &Path, key: &ProfileKey) -> Option<MachineProfile> {
        let p = MachineProfile::load(&dir.join(key.file_name())).ok()?;
        (p.key == *key).then_some(p)
    }

    /// Whether GPU figures are present.
    pub fn has_gpu(&self) -> bool {
        self.link.is_some()
    }

    /// Predicted seconds for `tokens` columns through a `k × n` weight of
    /// type `ty` on `device`: the nearest measured sample of that type (by
    /// log-distance in tokens), scaled by the work ratio; where weights of
    /// several sizes were measured at this batch, interpolated between them
    /// by size. Types never measured fall back to the closest type by bits
    /// per weight.
    pub fn matmul_seconds(&self, device: Device, ty: GgmlType, k: u64, n: u64, tokens: u64, link_busy: bool) -> f64 {
        let samples: Vec<&MatmulSample> = self
            .matmul
            .iter()
            .filter(|s| s.device == device && s.experts.is_none() && s.link_busy == link_busy)
            .collect();
        let samples = if samples.is_empty() {
            self.matmul
                .iter()
                .filter(|s| s.device == device && s.experts.is_none())
                .collect()
        } else {
            samples
        };
        let Some(ty_name) = nearest_type(&samples, ty) else {
            return f64::INFINITY;
        };
        let same: Vec<&MatmulSample> = samples.iter().copied().filter(|s| s.ty == ty_name).collect();
        // Each measured shape predicts from its own samples; where shapes of
        // different sizes cover this batch (big batches, where a small
        // weight keeps the GPU less busy), interpolate between them in log
        // weight size.
        let mut shapes: Vec<(i64, i64)> = same.iter().map(|s| (s.k, s.n)).collect();
        shapes.sort_by_key(|&(k, n)| k * n);
        shapes.dedup();
        let mut by_size: Vec<(f64, f64)> = shapes
            .iter()
            .filter_map(|&shape| {
                let of_shape: Vec<&MatmulSample> = same.iter().copied().filter(|s| (s.k, s.n) == shape).collect();
                let min_t = of_shape.iter().map(|s| s.tokens).min()?;
                if shape != shapes[shapes.len() - 1] && (tokens as i64) < min_t {
                    return None;
                }
                Some((((shape.0 * shape.1) as f64).ln(), scaled_from(&of_shape, k, n, tokens)))
            })
            .collect();
        by_size.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal));
        let size = ((k * n).max(1) as f64).ln();
        match by_size.iter().position(|&(s, _)| s >= size) {
            None => by_size.last().map_or(f64::INFINITY, |x| x.1),
            Some(0) => by_size[0].1,
            Some(i) => {
                let (lo, hi) = (by_size[i - 1], by_size[i]);
                lo.1 + (hi.1 - lo.1) * (size - lo.0) / (hi.0 - lo.0)
            }
        }
    }

    /// Predicted seconds for an expert matmul: `tokens` tokens each using
    /// `n_used` of `n_expert` experts of `k × n`.
    pub fn expert_seconds(
        &self,
        device: Device,
        ty: GgmlType,
        k: u64,
        n: u64,
        (n_expert, n_used): (u64, u64),
        tokens: u64,
    ) -> f64 {
        let samples: Vec<&MatmulSample> = self
            .matmul
            .iter()
            .filter(|s| s.device == device && s.experts.is_some() && !s.link_busy)
            .collect();
        let ty_name = nearest_type(&samples, ty);
        let best = ty_name.as_ref().and_then(|name| {
            samples
                .iter()
                .filter(|s| &s.ty == name)
                .min_by(|a, b| closer_in_batch(a.tokens, b.tokens, tokens))
        });
        // Work = distinct experts touched x expert size x tokens per expert.
        let touched = |e: f64, u: f64, t: f64| e * (1.0 - (1.0 - u / e).powf(t));
        let work = |s: &MatmulSample| {
            let (se, su) = s.experts.unwrap_or((1, 1));
            touched(se as f64, su as f64, s.tokens as f64) * (s.k * s.n) as f64
        };
        let w = touched(n_expert as f64, n_used as f64, tokens as f64) * (k * n) as f64;
        // Between one token and the first measured batch, the seconds per
        // unit of work (an expert's weights read once per distinct expert
        // touched) go from one to the other, log-linearly in the batch:
        // scaling the nearer sample's seconds by the batch would count every
        // token's read of an expert that the tokens share (the H200
        // profile priced a 4-token ubatch's GPU experts at 22 times one
        // token's, and the CPU's above its own 16-token sample). Between two
        // batches the time stays linear in tokens (below).
        if let Some(name) = &ty_name {
            let of_type: Vec<&&MatmulSample> = samples.iter().filter(|s| &s.ty == name).collect();
            let t = tokens as i64;
            // The sample of most work at the nearest measured batch below and above.
            let side = |below: bool| {
                of_type
                    .iter()
                    .filter(|s| if below { s.tokens < t } else { s.tokens > t })
                    .max_by(|a, b| {
                        let ka = if below { a.tokens } else { -a.tokens };
                        let kb = if below { b.tokens } else { -b.tokens };
                        ka.cmp(&kb).then(work(a).total_cmp(&work(b)))
                    })
                    .copied()
            };
            if !of_type.iter().any(|s| s.tokens == t) {
                if let (Some(lo), Some(hi)) = (side(true).filter(|lo| lo.tokens <= 1), side(false)) {
                    let (rl, rh) = (lo.seconds / work(lo), hi.seconds / work(hi));
                    if rl > 0.0 && rh > 0.0 {
                        let ln = |x: i64| (x.max(1) as f64).ln();
                        let f = (ln(t) - ln(lo.tokens)) / (ln(hi.tokens) - ln(lo.tokens));
                        return (rl.ln() * (1.0 - f) + rh.ln() * f).exp() * w;
                    }
                }
            }
        }
        match best {
            Some(s) => {
                // Two samples of this batch with different work give the
                // op's fixed cost too: seconds = fixed + per-work x work.
                let other = samples
                    .iter()
                    .find(|o| o.ty == s.ty && o.tokens == s.tokens && (work(o) - work(s)).abs() > 0.1 * work(s));
                if let Some(o) = other {
                    let slope = (s.seconds - o.seconds) / (work(s) - work(o));
                    if slope > 0.0 && tokens as i64 == s.tokens {
                        let fixed = (o.seconds - slope * work(o)).max(0.0);
                        return fixed + slope * w;
                    }
                }
                // Between two batch samples (more than one token each), linear
                // in tokens as for dense weights: the nearest sample alone
                // prices a ubatch below it at the sample's own size.
                let of_ty = || samples.iter().filter(|o| o.ty == s.ty && o.tokens > 1);
                let lo = of_ty().filter(|o| o.tokens < tokens as i64).max_by_key(|o| o.tokens);
                let hi = of_ty().filter(|o| o.tokens > tokens as i64).min_by_key(|o| o.tokens);
                if let (Some(lo), Some(hi)) = (lo, hi) {
                    let at = |o: &MatmulSample| {
                        o.seconds * touched(n_expert as f64, n_used as f64, o.tokens as f64) * (k * n) as f64 / work(o)
                    };
                    let f = (tokens as f64 - lo.tokens as f64) / (hi.tokens - lo.tokens) as f64;
                    return at(lo) + (at(hi) - at(lo)) * f;
                }
                let mut t = s.seconds * w / work(s);
                if tokens as i64 > s.tokens {
                    t *= tokens as f64 / s.tokens as f64;
                }
                t
            }
            // No expert samples: treat each used expert as a dense matmul.
            None => {
                let per_expert_tokens = (tokens * n_used).div_ceil(n_expert).max(1);
                let touched =
                    (n_expert as f64 * (1.0 - (1.0 - n_used as f64 / n_expert as f64).powf(tokens as f64))).max(1.0);
                touched * self.matmul_seconds(device, ty, k, n, per_expert_tokens, false)
            }
        }
    }

    /// Predicted seconds of flash attention for `tokens` queries over `n_kv`
    /// positions, scaled from the nearest sample by work.
    pub fn attention_seconds(&self, device: Device, head_dim: u64, n_head: u64, tokens: u64, n_kv: u64) -> f64 {
        let work = |hd: f64, h: f64, t: f64, kv: f64| hd * h * t * kv.max(1.0);
        let best = self
            .attention
            .iter()
            .filter(|s| s.device == device)
            .min_by(|a, b| closer_in_batch(a.tokens, b.tokens, tokens));
        match best {
            Some(s) => {
                s.seconds * work(head_dim as f64, n_head as f64, tokens as f64, n_kv as f64)
                    / work(s.head_dim as f64, s.n_head as f64, s.tokens as f64, s.n_kv as f64)
            }
            None => 0.0,
        }
    }
}

/// Seconds of a `k` x `n` matmul over `tokens` columns from the samples of
/// one type and shape: the nearest batch size (by log-distance), scaled by
/// the weight size; linear in tokens between two samples, beyond the
/// largest (compute-bound) and flat below the smallest (weight-read-bound).
fn scaled_from(same: &[&MatmulSample], k: u64, n: u64, tokens: u64) -> f64 {
    let mut by_dist: Vec<&&MatmulSample> = same.iter().collect();
    by_dist.sort_by(|a, b| closer_in_batch(a.tokens, b.tokens, tokens));
    let Some(best) = by_dist.first() else {
        return f64::INFINITY;
    };
    let work = |s: &MatmulSample| (s.k * s.n) as f64;
    let per_weight = best.seconds / work(best);
    let scale = (k * n) as f64;
    let max_t = same.iter().map(|s| s.tokens).max().unwrap_or(1);
    let t = if tokens as i64 > max_t && best.tokens == max_t {
        per_weight * scale * tokens as f64 / max_t as f64
    } else {
        per_weight * scale
    };
    if let Some(second) = by_dist.get(1) {
        let (lo, hi) = if best.tokens < second.tokens {
            (best, second)
        } else {
            (second, best)
        };
        if (lo.tokens as u64) < tokens && tokens < hi.tokens as u64 {
            let a = lo.seconds / work(lo) * scale;
            let b = hi.seconds / work(hi) * scale;
            let f = (tokens as f64 - lo.tokens as f64) / (hi.tokens - lo.tokens) as f64;
            return a + (b - a) * f;
        }
    }
    t
}

/// Orders two measured batch sizes by how close they are to `tokens` on a
/// log scale (the nearest sample first).
fn closer_in_batch(a: i64, b: i64, tokens: u64) -> std::cmp::Ordering {
    let target = (tokens.max(1) as f64).ln();
    let da = ((a.max(1) as f64).ln() - target).abs();
    let db = ((b.max(1) as f64).ln() - target).abs();
    da.partial_cmp(&db).unwrap_or(std::cmp::Ordering::Equal)
}

/// The measured type closest to `ty` in bits per weight.
fn nearest_type(samples: &[&MatmulSample], ty: GgmlType) -> Option<String> {
    if samples.iter().any(|s| s.ty == ty.name()) {
        return Some(ty.name().to_string());
    }
    let bpw = |t: GgmlType| t.type_size() as f64 * 8.0 / t.block_size() as f64;
    let target = bpw(ty);
    samples
        .iter()
        .filter_map(|s| GgmlType::from_name(&s.ty).map(|t| (s.ty.clone(), (bpw(t) - target).abs())))
        .min_by(|a, b| a.1.partial_cmp(&b.1).unwrap_or(std::cmp::Ordering::Equal))
        .map(|(n, _)| n)
}

/// The environment variable naming the directory of profiles.
pub const PROFILE_DIR_ENV: &str = "PIPESHARD_PROFILE_DIR";

/// Where profiles are kept: `$PIPESHARD_PROFILE_DIR`, else `pipeshard/profiles`
/// in the user's data directory (`$XDG_DATA_HOME`, else `~/.local/share`
/// on Linux).
pub fn default_dir() -> Result<PathBuf, ProfileError> {
    profile_dir(std::env::var_os(PROFILE_DIR_ENV), dirs::data_dir())
}

/// The directory of profiles, from the variable's value `env` and the
/// user's data directory `data`.
fn profile_dir(env: Option<std::ffi::OsString>, data: Option<PathBuf>) -> Result<PathBuf, ProfileError> {
    match env.filter(|d| !d.is_empty()) {
        Some(d) => Ok(PathBuf::from(d)),
        None => data
            .map(|d| d.join("pipeshard").join("profiles"))
            .ok_or(ProfileError::NoDir),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_live_in_the_users_data_directory_unless_the_variable_says() {
        let data = Some(PathBuf::from("/home/u/.local/share"));
        assert_eq!(
            profile_dir(None, data.clone()).unwrap(),
            Path::new("/home/u/.local/share/pipeshard/profiles")
        );
        assert_eq!(
            profile_dir(Some("/tmp/p".into()), data.clone()).unwrap(),
            Path::new("/tmp/p")
        );
        // An empty variable is no override.
        assert_eq!(
            profile_dir(Some("".into()), data).unwrap(),
            Path::new("/home/u/.local/share/pipeshard/profiles")
        );
        assert!(matches!(profile_dir(None, None), Err(ProfileError::NoDir)));
    }

    fn sample(device: Device, ty: &str, tokens: i64, seconds: f64) -> MatmulSample {
        MatmulSample {
            device,
            ty: ty.into(),
            k: 1024,
            n: 1024,
            tokens,
            experts: None,
            link_busy: false,
            seconds,
        }
    }

    fn profile() -> MachineProfile {
        let mut p = MachineProfile {
            key: ProfileKey {
                cpu: "test".into(),
                gpu: None,
                threads: 2,
            },
            mode: ProfileMode::Tiny,
            measured_in_s: 0.0,
            cpu_mem_bw: 1e10,
            link: None,
            host_read_bw_with_link: None,
            gpu_memory: None,
            process_context_bytes: None,
            matmul: vec![
                sample(Device::Cpu, "q4_0", 1, 1e-4),
                sample(Device::Cpu, "q4_0", 32, 1e-3),
                sample(Device::Cpu, "f16", 1, 4e-4),
            ],
            attention: vec![],
        };
        p.make_monotone();
        p
    }

    #[test]
    fn a_smaller_weight_measured_at_big_batches_sets_their_rate() {
        let mut p = profile();
        let gpu = |k: i64, n: i64, tokens: i64, seconds: f64| MatmulSample {
            k,
            n,
            ..sample(Device::Gpu, "q4_0", tokens, seconds)
        };
        // The small weight runs big batches at half the big one's rate per weight.
        p.matmul.extend([
            gpu(4096, 32768, 1, 1e-5),
            gpu(4096, 32768, 4096, 1e-2),
            gpu(4096, 4096, 512, 0.25e-3),
            gpu(4096, 4096, 4096, 2.5e-3),
        ]);
        let t = |k: u64, n: u64, tokens: u64| p.matmul_seconds(Device::Gpu, GgmlType::Q4_0, k, n, tokens, false);
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1e-12);
        assert!(close(t(4096, 32768, 4096), 1e-2));
        assert!(close(t(4096, 4096, 4096), 2.5e-3));
        // Smaller than every measured weight: the small one's rate.
        assert!(close(t(4096, 1024, 4096), 2.5e-3 / 4.0));
        // Between the two sizes: between their rates, in log size.
        let mid = t(4096, 11585, 4096) / 11585.0;
        assert!(mid < 2.5e-3 / 4096.0 && mid > 1e-2 / 32768.0, "{mid}");
        // Batches below the small weight's samples (cached there) use the big one.
        assert!(close(t(4096, 4096, 1), 1e-5 / 8.0));
    }

    #[test]
    fn a_noisy_small_batch_never_predicts_more_than_a_larger_one() {
        let mut p = profile();
        // A preempted 1-token run, slower than the 32-token one.
        p.matmul.push(sample(Device::Cpu, "q8_0", 1, 5e-3));
        p.matmul.push(sample(Device::Cpu, "q8_0", 32, 1e-3));
        p.matmul.push(sample(Device::Cpu, "q8_0", 256, 4e-3));
        p.make_monotone();
        let t = |n| p.matmul_seconds(Device::Cpu, GgmlType::Q8_0, 1024, 1024, n, false);
        let series: Vec<f64> = [1, 8, 32, 100, 256, 1024].into_iter().map(t).collect();
        assert!(series.windows(2).all(|w| w[0] <= w[1]), "{series:?}");
        assert_eq!(t(32), 5e-3, "raised to the 1-token figure");
        assert_eq!(t(256), 5e-3, "4 ms < 5 ms, raised too");
        // Other series are untouched.
        assert_eq!(
            p.matmul_seconds(Device::Cpu, GgmlType::Q4_0, 1024, 1024, 32, false),
            1e-3
        );
    }

    #[test]
    fn lookup_scales_by_work_and_interpolates() {
        let p = profile();
        let t1 = p.matmul_seconds(Device::Cpu, GgmlType::Q4_0, 1024, 1024, 1, false);
        assert!((t1 - 1e-4).abs() < 1e-12);
        let t2 = p.matmul_seconds(Device::Cpu, GgmlType::Q4_0, 2048, 1024, 1, false);
        assert!((t2 - 2e-4).abs() < 1e-12);
        let mid = p.matmul_seconds(Device::Cpu, GgmlType::Q4_0, 1024, 1024, 16, false);
        assert!(mid > 1e-4 && mid < 1e-3, "{mid}");
        let beyond = p.matmul_seconds(Device::Cpu, GgmlType::Q4_0, 1024, 1024, 64, false);
        assert!((beyond - 2e-3).abs() < 1e-9, "{beyond}");
        // Q4_1 is closest to Q4_0 in bits per weight.
        let q41 = p.matmul_seconds(Device::Cpu, GgmlType::Q4_1, 1024, 1024, 1, false);
        assert!((q41 - 1e-4).abs() < 1e-12);
        assert!(p
            .matmul_seconds(Device::Gpu, GgmlType::Q4_0, 1, 1, 1, false)
            .is_infinite());
    }

    #[test]
    fn two_expert_counts_give_the_fixed_cost_of_an_expert_matmul() {
        let expert = |used: i64, seconds: f64| MatmulSample {
            experts: Some((128, used)),
            ..sample(Device::Cpu, "q4_0", 1, seconds)
        };
        let mut p = profile();
        p.matmul.push(expert(8, 125e-6));
        let t = |p: &MachineProfile, used| p.expert_seconds(Device::Cpu, GgmlType::Q4_0, 1024, 1024, (128, used), 1);
        // One sample: proportional to the experts used.
        assert!((t(&p, 2) - 125e-6 / 4.0).abs() < 1e-12, "{}", t(&p, 2));
        // With half the experts measured too: 15 us fixed + 13.75 us per expert.
        p.matmul.push(expert(4, 70e-6));
        p.make_monotone();
        for (used, want) in [(2, 42.5e-6), (4, 70e-6), (8, 125e-6)] {
            assert!((t(&p, used) - want).abs() < 1e-9, "{used}: {}", t(&p, used));
        }
    }

    #[test]
    fn expert_batches_between_two_samples_are_linear_in_tokens() {
        let expert = |tokens: i64, seconds: f64| MatmulSample {
            experts: Some((128, 8)),
            ..sample(Device::Gpu, "q4_0", tokens, seconds)
        };
        let mut p = profile();
        p.matmul.push(expert(512, 0.4e-3));
        p.matmul.push(expert(4096, 1.6e-3));
        p.make_monotone();
        let t = |tokens| p.expert_seconds(Device::Gpu, GgmlType::Q4_0, 1024, 1024, (128, 8), tokens);
        // Every expert is touched at both samples: linear between them.
        assert!((t(512) - 0.4e-3).abs() < 1e-9, "{}", t(512));
        assert!(
            (t(2048) - (0.4e-3 + 1.2e-3 * 1536.0 / 3584.0)).abs() < 1e-9,
            "{}",
            t(2048)
        );
        assert!((t(4096) - 1.6e-3).abs() < 1e-9, "{}", t(4096));
        // Beyond the largest sample: proportional to the tokens.
        assert!((t(8192) - 3.2e-3).abs() < 1e-9, "{}", t(8192));
        // A ubatch below the nearest sample is no longer priced at its size.
        assert!(t(2048) < t(4096));
    }

    #[test]
    fn an_expert_batch_between_two_measured_ones_costs_between_them() {
        let expert = |tokens: i64, seconds: f64| MatmulSample {
            experts: Some((128, 8)),
            ..sample(Device::Cpu, "q4_0", tokens, seconds)
        };
        // The H200 host's CPU: 122 us for one token's 8 of 128 experts, 1.647 ms for 16 tokens.
        let mut p = profile();
        p.matmul.push(expert(1, 122e-6));
        p.matmul.push(expert(16, 1.647e-3));
        let t = |tokens| p.expert_seconds(Device::Cpu, GgmlType::Q4_0, 1024, 1024, (128, 8), tokens);
        assert!((t(1) - 122e-6).abs() < 1e-12 && (t(16) - 1.647e-3).abs() < 1e-12);
        // Four tokens touch ~29 distinct experts: more than one token's 8,
        // fewer than sixteen tokens' ~81, read once each whatever the tokens.
        let mut last = t(1);
        for tokens in 2..16 {
            assert!(t(tokens) > last && t(tokens) < t(16), "{tokens}: {}", t(tokens));
            last = t(tokens);
        }
        let touched = |n: f64| 128.0 * (1.0 - (1.0 - 8.0 / 128.0f64).powf(n));
        let (r1, r16) = (122e-6 / touched(1.0), 1.647e-3 / touched(16.0));
        let r4 = (r1.ln() * 0.5 + r16.ln() * 0.5).exp();
        assert!((t(4) - r4 * touched(4.0)).abs() < 1e-9, "{}", t(4));
    }

    #[test]
    fn a_loaded_profile_with_an_expert_outlier_is_repaired() {
        let expert = |ty: &str, used: i64, seconds: f64| MatmulSample {
            experts: Some((128, used)),
            ..sample(Device::Cpu, ty, 1, seconds)
        };
        let mut p = profile();
        // The H200 host's first-use samples: q4_K's 4 experts and q6_K's 8 were slowed.
        p.matmul.extend([
            expert("q4_K", 4, 10100.8e-6),
            expert("q4_K", 8, 150.5e-6),
            expert("q6_K", 4, 93.0e-6),
            expert("q6_K", 8, 2964.5e-6),
        ]);
        let dir = std::env::temp_dir().join(format!("pipeshard-outlier-{}", std::process::id()));
        let path = dir.join(p.key.file_name());
        p.save(&path).unwrap();
        let p = MachineProfile::load(&path).unwrap();
        let t = |ty, used| p.expert_seconds(Device::Cpu, ty, 1024, 1024, (128, used), 1);
        assert!(
            (t(GgmlType::Q4_K, 4) - 150.5e-6).abs() < 1e-9,
            "{}",
            t(GgmlType::Q4_K, 4)
        );
        assert!(
            (t(GgmlType::Q6_K, 8) - 186.0e-6).abs() < 1e-9,
            "{}",
            t(GgmlType::Q6_K, 8)
        );
        assert!(
            (t(GgmlType::Q6_K, 4) - 93.0e-6).abs() < 1e-9,
            "{}",
            t(GgmlType::Q6_K, 4)
        );
    }

    #[test]
    fn profiles_round_trip_through_yaml() {
        let p = profile();
        let dir = std::env::temp_dir().join(format!("pipeshard-profile-{}", std::process::id()));
        let path = dir.join(p.key.file_name());
        p.save(&path).unwrap();
        assert_eq!(MachineProfile::load(&path).unwrap(), p);
        assert_eq!(MachineProfile::load_matching(&dir, &p.key), Some(p));
        std::fs::write(&path, "not: [a, profile").unwrap();
        assert!(matches!(MachineProfile::load(&path), Err(ProfileError::Parse { .. })));
    }
}
