//! Sampling the process's device memory and host RSS in the background, to
//! find the peaks a run really reached.
//!
//! The device figure is the process's memory as NVML reports it (see
//! [`super::nvml`]); without NVML it falls back to how much the first GPU's
//! free memory dropped since sampling started, as ggml reports it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::nvml::{self, ProcessMemorySource};

/// How a device-memory figure was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemorySource {
    /// NVML's entry for this process (the figure nvidia-smi shows).
    NvmlProcess,
    /// The cards' used memory grown since before our CUDA context (NVML
    /// does not list this PID, e.g. inside a container).
    NvmlCardGrowth,
    /// The first GPU's free memory dropped since sampling started (no NVML):
    /// misses what was allocated before.
    FreeDrop,
}

impl From<ProcessMemorySource> for MemorySource {
    fn from(s: ProcessMemorySource) -> Self {
        match s {
            ProcessMemorySource::NvmlProcess => MemorySource::NvmlProcess,
            ProcessMemorySource::NvmlCardGrowth => MemorySource::NvmlCardGrowth,
        }
    }
}

/// The process's device memory now, and how it was measured: NVML's figure
/// when available; None without NVML (use a [`MemorySampler`] for the
/// free-memory fallback, which needs a starting point).
pub fn process_device_bytes() -> Option<(u64, MemorySource)> {
    nvml::process_bytes().map(|(b, s)| (b, s.into()))
}

/// Resident set size of this process, bytes.
pub fn current_rss() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()))
        .map_or(0, |pages| pages * 4096)
}

/// Bytes the C allocator has handed out and not had back, over all its
/// arenas (glibc's `mallinfo2`): what the CPU backend's buffers take,
/// among the process's other allocations. None where it cannot tell.
pub fn heap_in_use() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        #[repr(C)]
        struct Mallinfo2 {
            arena: usize,
            ordblks: usize,
            smblks: usize,
            hblks: usize,
            hblkhd: usize,
            usmblks: usize,
            fsmblks: usize,
            uordblks: usize,
            fordblks: usize,
            keepcost: usize,
        }
        extern "C" {
            fn mallinfo2() -> Mallinfo2;
        }
        // SAFETY: glibc's mallinfo2 takes no arguments and returns the
        // struct above by value.
        let m = unsafe { mallinfo2() };
        let _ = (
            m.arena, m.ordblks, m.smblks, m.hblks, m.usmblks, m.fsmblks, m.fordblks, m.keepcost,
        );
        Some((m.uordblks + m.hblkhd) as u64)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// The peaks a [`MemorySampler`] saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemoryPeaks {
    /// Peak device memory of the process, bytes (0 without a GPU).
    pub device: u64,
    /// How `device` was measured; None without a GPU.
    pub source: Option<MemorySource>,
    /// The device figure when sampling started (0 with [`MemorySource::FreeDrop`]).
    pub start: u64,
    /// Peak resident host memory, bytes.
    pub rss: u64,
}

impl MemoryPeaks {
    /// How far the device memory rose above where it started.
    pub fn growth(&self) -> u64 {
        self.device.saturating_sub(self.start)
    }
}

/// Polls the process's device memory and RSS in a background thread.
pub struct MemorySampler {
    stop: Arc<AtomicBool>,
    device_peak: Arc<AtomicU64>,
    source: Option<MemorySource>,
    start: u64,
    handle: Option<JoinHandle<u64>>,
}

impl MemorySampler {
    /// Sample every 20 ms, as nvidia-smi's fastest loop does; `gpu` is the
    /// ggml device index for the fallback without NVML (None: no GPU, only
    /// RSS). Faster polling can cost CPU-bound decode (a query preempts one
    /// of the threads the CPU's matmuls wait for), and the device memory
    /// that matters only grows: pools and workspaces are kept, buffers are
    /// reserved up front. `PIPESHARD_MEMORY_SAMPLE_MS` sets another
    /// period in milliseconds (to measure what sampling costs).
    pub fn start(gpu: Option<usize>) -> MemorySampler {
        let ms = std::env::var("PIPESHARD_MEMORY_SAMPLE_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&ms| ms > 0)
            .unwrap_or(20);
        Self::every(gpu, Duration::from_millis(ms))
    }

    /// Sample every `period` (a long-running server polls less often).
    pub fn every(gpu: Option<usize>, period: Duration) -> MemorySampler {
        let stop = Arc::new(AtomicBool::new(false));
        let device_peak = Arc::new(AtomicU64::new(0));
        let (flag, peak) = (stop.clone(), device_peak.clone());
        // NVML when it knows this process; otherwise the free memory's drop.
        let nvml_now = gpu.and_then(|_| process_device_bytes());
        let nvml_source = nvml_now.map(|(_, s)| s);
        let start = nvml_now.map_or(0, |(b, _)| b);
        let baseline_free = match nvml_source {
            Some(_) => None,
            None => gpu.and_then(super::device_free_bytes),
        };
        let source = nvml_source.or(baseline_free.map(|_| MemorySource::FreeDrop));
        let handle = std::thread::spawn(move || {
            let mut max_rss = 0;
            loop {
                let now = match (nvml_source, baseline_free) {
                    (Some(_), _) => process_device_bytes().map(|(b, _)| b),
                    (None, Some(base)) => gpu
                        .and_then(super::device_free_bytes)
                        .map(|free| base.saturating_sub(free)),
                    (None, None) => None,
                };
                if let Some(b) = now {
                    peak.fetch_max(b, Ordering::Relaxed);
                }
                max_rss = max_rss.max(current_rss());
                if flag.load(Ordering::Relaxed) {
                    break;
                }
                std::thread::sleep(period);
            }
            max_rss
        });
        MemorySampler {
            stop,
            device_peak,
            source,
            start,
            handle: Some(handle),
        }
    }

    /// The peak device bytes so far, updated while sampling.
    pub fn device_peak(&self) -> Arc<AtomicU64> {
        self.device_peak.clone()
    }

    /// How the device figure is measured; None without a GPU.
    pub fn source(&self) -> Option<MemorySource> {
        self.source
    }

    /// Stop and return the peaks.
    pub fn stop(mut self) -> MemoryPeaks {
        self.stop.store(true, Ordering::Relaxed);
        let rss = self.handle.take().and_then(|h| h.join().ok()).unwrap_or(0);
        MemoryPeaks {
            device: self.device_peak.load(Ordering::Relaxed),
            source: self.source,
            start: self.start,
            rss,
        }
    }
}

impl Drop for MemorySampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
