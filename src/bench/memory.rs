//! Sampling device memory and host RSS while a benchmark runs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Polls the device's free memory (every 2 ms) and the process RSS in a
/// background thread; [`MemorySampler::stop`] returns the peaks.
pub struct MemorySampler {
    stop: Arc<AtomicBool>,
    device_peak: Arc<AtomicU64>,
    handle: Option<JoinHandle<(u64, u64)>>,
}

/// Resident set size of this process, bytes.
pub fn current_rss() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()))
        .map_or(0, |pages| pages * 4096)
}

impl MemorySampler {
    /// Start sampling; `gpu` is the device index (None: only RSS).
    pub fn start(gpu: Option<usize>) -> MemorySampler {
        Self::every(gpu, Duration::from_millis(2))
    }

    /// Start sampling every `period` (a long-running server polls less often).
    pub fn every(gpu: Option<usize>, period: Duration) -> MemorySampler {
        let stop = Arc::new(AtomicBool::new(false));
        let device_peak = Arc::new(AtomicU64::new(0));
        let (flag, peak) = (stop.clone(), device_peak.clone());
        let baseline = gpu.and_then(crate::engine::device_free_bytes);
        let handle = std::thread::spawn(move || {
            let mut min_free = baseline.unwrap_or(0);
            let mut max_rss = 0;
            loop {
                if let Some(free) = gpu.and_then(crate::engine::device_free_bytes) {
                    min_free = min_free.min(free);
                    peak.store(baseline.map_or(0, |b| b.saturating_sub(min_free)), Ordering::Relaxed);
                }
                max_rss = max_rss.max(current_rss());
                if flag.load(Ordering::Relaxed) {
                    break;
                }
                std::thread::sleep(period);
            }
            (peak.load(Ordering::Relaxed), max_rss)
        });
        MemorySampler {
            stop,
            device_peak,
            handle: Some(handle),
        }
    }

    /// The peak device bytes used above the baseline so far, updated while
    /// sampling.
    pub fn device_peak(&self) -> Arc<AtomicU64> {
        self.device_peak.clone()
    }

    /// Stop and return (peak device bytes used above the baseline, peak RSS).
    pub fn stop(mut self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take().and_then(|h| h.join().ok()).unwrap_or((0, 0))
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
