//! Sampling the process's device memory and host RSS in the background, to
//! find the peaks a run really reached.
//!
//! The device figure is the process's memory as NVML reports it (see
//! [`super::nvml`]); without NVML it falls back to how much the first GPU's
//! free memory dropped since sampling started, as ggml reports it. Cards
//! named apart (see [`nvml_cards`]) each get a peak of their own: what a
//! budget per device is held to.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::backend::Device;
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

/// A card whose share of the process's memory NVML reads: a ggml device
/// NVML knows by its PCI bus id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Card {
    /// ggml's name of the device (`CUDA0`).
    pub name: String,
    pci_bus_id: String,
}

/// Those of `devices` that NVML knows: a device without a PCI bus id, such
/// as one behind ggml's RPC backend (another process's memory), is left out.
pub fn nvml_cards(devices: &[Device]) -> Vec<Card> {
    devices
        .iter()
        .filter_map(|d| {
            let id = d.device_id.clone()?;
            nvml::device_usage(&id)?;
            Some(Card {
                name: d.name.clone(),
                pci_bus_id: id,
            })
        })
        .collect()
}

/// The peaks a [`MemorySampler`] saw.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemoryPeaks {
    /// Peak device memory of the process, bytes (0 without a GPU).
    pub device: u64,
    /// How `device` was measured; None without a GPU.
    pub source: Option<MemorySource>,
    /// The device figure when sampling started (0 with [`MemorySource::FreeDrop`]).
    pub start: u64,
    /// Peak resident host memory, bytes.
    pub rss: u64,
    /// Each sampled card's name and the process's peak there, bytes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cards: Vec<(String, u64)>,
}

impl MemoryPeaks {
    /// How far the device memory rose above where it started.
    pub fn growth(&self) -> u64 {
        self.device.saturating_sub(self.start)
    }
}

/// Polls the process's device memory, its memory on each of some cards and
/// its RSS in one background thread.
pub struct MemorySampler {
    stop: Arc<AtomicBool>,
    device_peak: Arc<AtomicU64>,
    source: Option<MemorySource>,
    start: u64,
    card_names: Vec<String>,
    card_peaks: Arc<Vec<AtomicU64>>,
    handle: Option<JoinHandle<u64>>,
}

impl MemorySampler {
    /// Sample every 20 ms, as nvidia-smi's fastest loop does; `gpu` is the
    /// ggml device index for the fallback without NVML (None: no GPU, only
    /// RSS and `cards`). Faster polling can cost CPU-bound decode (a query preempts one
    /// of the threads the CPU's matmuls wait for), and the device memory
    /// that matters only grows: pools and workspaces are kept, buffers are
    /// reserved up front. `PIPESHARD_MEMORY_SAMPLE_MS` sets another
    /// period in milliseconds (to measure what sampling costs).
    pub fn start(gpu: Option<usize>, cards: Vec<Card>) -> MemorySampler {
        let ms = std::env::var("PIPESHARD_MEMORY_SAMPLE_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&ms| ms > 0)
            .unwrap_or(20);
        Self::every(gpu, cards, Duration::from_millis(ms))
    }

    /// Sample every `period` (a long-running server polls less often).
    pub fn every(gpu: Option<usize>, cards: Vec<Card>, period: Duration) -> MemorySampler {
        let stop = Arc::new(AtomicBool::new(false));
        let device_peak = Arc::new(AtomicU64::new(0));
        let card_peaks: Arc<Vec<AtomicU64>> = Arc::new(cards.iter().map(|_| AtomicU64::new(0)).collect());
        let (flag, peak, per_card) = (stop.clone(), device_peak.clone(), card_peaks.clone());
        let ids: Vec<String> = cards.iter().map(|c| c.pci_bus_id.clone()).collect();
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
                for (id, card_peak) in ids.iter().zip(per_card.iter()) {
                    if let Some(u) = nvml::device_usage(id) {
                        card_peak.fetch_max(u.own, Ordering::Relaxed);
                    }
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
            card_names: cards.into_iter().map(|c| c.name).collect(),
            card_peaks,
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
            cards: std::mem::take(&mut self.card_names)
                .into_iter()
                .zip(self.card_peaks.iter())
                .map(|(name, p)| (name, p.load(Ordering::Relaxed)))
                .collect(),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `run --json`'s `peak_device_bytes` keeps its fields where no card is
    /// sampled apart.
    #[test]
    fn peaks_without_cards_keep_their_fields() {
        let peaks = MemorySampler::start(None, Vec::new()).stop();
        assert!(peaks.rss > 0 && peaks.cards.is_empty(), "{peaks:?}");
        let v = serde_json::to_value(&peaks).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["device", "rss", "source", "start"]);
    }
}
