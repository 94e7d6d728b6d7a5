//! The process's memory on each of several cards, sampled in the background
//! for its peak per card: what a budget per device is held to. Only cards
//! NVML knows (by their PCI bus id) are sampled; a remote device behind
//! ggml's RPC backend is another process's memory.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::backend::Device;
use super::nvml;

/// How often the cards are read, as [`super::MemorySampler`] reads the process.
const PERIOD: Duration = Duration::from_millis(20);

/// Samples the process's memory on each card until stopped.
pub struct DevicePeaks {
    names: Vec<String>,
    peaks: Arc<Vec<AtomicU64>>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl DevicePeaks {
    /// Start sampling those of `devices` that NVML knows; None where it
    /// knows none of them.
    pub fn start(devices: &[Device]) -> Option<DevicePeaks> {
        let known: Vec<(String, String)> = devices
            .iter()
            .filter_map(|d| {
                let id = d.device_id.clone()?;
                nvml::device_usage(&id)?;
                Some((d.name.clone(), id))
            })
            .collect();
        if known.is_empty() {
            return None;
        }
        let peaks: Arc<Vec<AtomicU64>> = Arc::new(known.iter().map(|_| AtomicU64::new(0)).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let (p, flag) = (peaks.clone(), stop.clone());
        let ids: Vec<String> = known.iter().map(|(_, id)| id.clone()).collect();
        let handle = std::thread::spawn(move || loop {
            for (id, peak) in ids.iter().zip(p.iter()) {
                if let Some(u) = nvml::device_usage(id) {
                    peak.fetch_max(u.own, Ordering::Relaxed);
                }
            }
            if flag.load(Ordering::Relaxed) {
                break;
            }
            std::thread::sleep(PERIOD);
        });
        Some(DevicePeaks {
            names: known.into_iter().map(|(n, _)| n).collect(),
            peaks,
            stop,
            handle: Some(handle),
        })
    }

    /// Stop and return each sampled device's name and peak, bytes.
    pub fn stop(mut self) -> Vec<(String, u64)> {
        self.halt();
        let names = std::mem::take(&mut self.names);
        names
            .into_iter()
            .zip(self.peaks.iter())
            .map(|(n, p)| (n, p.load(Ordering::Relaxed)))
            .collect()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for DevicePeaks {
    fn drop(&mut self) {
        self.halt();
    }
}
