//! The process's device memory as NVML reports it (the figure nvidia-smi
//! shows), read from `libnvidia-ml.so.1` loaded at run time: there is no
//! build dependency on the driver, and without it every query is `None`.
//!
//! NVML lists each process's device memory by host PID. Inside a PID
//! namespace (a container) our own PID is not among them; then the figure
//! is the growth of the cards' used memory since [`take_baseline`], taken
//! before the CUDA backend created its context, which is exact while no
//! other process changes its use of the card.

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};
use std::sync::OnceLock;

type NvmlReturn = c_int;
type NvmlDevice = *mut c_void;

const NVML_SUCCESS: NvmlReturn = 0;
const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
/// `usedGpuMemory` when the driver cannot tell (e.g. no permission).
const NVML_VALUE_NOT_AVAILABLE: c_ulonglong = c_ulonglong::MAX;

/// `nvmlProcessInfo_t` of the `_v2`/`_v3` queries.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct MemoryInfo {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

type ProcessesFn = unsafe extern "C" fn(NvmlDevice, *mut c_uint, *mut ProcessInfo) -> NvmlReturn;
type MemoryFn = unsafe extern "C" fn(NvmlDevice, *mut MemoryInfo) -> NvmlReturn;
type ByPciFn = unsafe extern "C" fn(*const std::ffi::c_char, *mut NvmlDevice) -> NvmlReturn;

struct Nvml {
    // Keeps the library mapped for the function pointers below.
    _lib: libloading::Library,
    devices: Vec<NvmlDevice>,
    processes: ProcessesFn,
    memory: MemoryFn,
    by_pci: Option<ByPciFn>,
}

// SAFETY: NVML is thread-safe; device handles are plain identifiers.
unsafe impl Send for Nvml {}
unsafe impl Sync for Nvml {}

static NVML: OnceLock<Option<Nvml>> = OnceLock::new();
static BASELINE: OnceLock<Option<u64>> = OnceLock::new();

fn open() -> Option<Nvml> {
    // SAFETY: loading the driver's NVML library runs no code of ours; every
    // symbol is checked before use and called with NVML's documented types.
    unsafe {
        let lib = libloading::Library::new("libnvidia-ml.so.1").ok()?;
        let init: libloading::Symbol<unsafe extern "C" fn() -> NvmlReturn> = lib.get(b"nvmlInit_v2\0").ok()?;
        if init() != NVML_SUCCESS {
            return None;
        }
        let count_fn: libloading::Symbol<unsafe extern "C" fn(*mut c_uint) -> NvmlReturn> =
            lib.get(b"nvmlDeviceGetCount_v2\0").ok()?;
        let handle_fn: libloading::Symbol<unsafe extern "C" fn(c_uint, *mut NvmlDevice) -> NvmlReturn> =
            lib.get(b"nvmlDeviceGetHandleByIndex_v2\0").ok()?;
        let processes: ProcessesFn = *lib
            .get::<ProcessesFn>(b"nvmlDeviceGetComputeRunningProcesses_v3\0")
            .or_else(|_| lib.get::<ProcessesFn>(b"nvmlDeviceGetComputeRunningProcesses_v2\0"))
            .ok()?;
        let memory: MemoryFn = *lib.get::<MemoryFn>(b"nvmlDeviceGetMemoryInfo\0").ok()?;
        let by_pci = lib
            .get::<ByPciFn>(b"nvmlDeviceGetHandleByPciBusId_v2\0")
            .ok()
            .map(|f| *f);
        let mut n: c_uint = 0;
        if count_fn(&mut n) != NVML_SUCCESS {
            return None;
        }
        let mut devices = Vec::new();
        for i in 0..n {
            let mut d: NvmlDevice = std::ptr::null_mut();
            if handle_fn(i, &mut d) == NVML_SUCCESS {
                devices.push(d);
            }
        }
        if devices.is_empty() {
            return None;
        }
        Some(Nvml {
            _lib: lib,
            devices,
            processes,
            memory,
            by_pci,
        })
    }
}

fn nvml() -> Option<&'static Nvml> {
    NVML.get_or_init(open).as_ref()
}

impl Nvml {
    /// This PID's device memory summed over the cards, if NVML lists it.
    fn own_process_bytes(&self) -> Option<u64> {
        self.process_split().0
    }

    /// Every process's device memory NVML lists, summed over the cards:
    /// (this PID's, if listed; every other PID's).
    fn process_split(&self) -> (Option<u64>, u64) {
        let pid = std::process::id();
        let (mut own, mut others) = (None, 0u64);
        for &dev in &self.devices {
            for p in self.list(dev) {
                if p.used_gpu_memory == NVML_VALUE_NOT_AVAILABLE {
                    continue;
                }
                if p.pid == pid {
                    *own.get_or_insert(0) += p.used_gpu_memory;
                } else {
                    others += p.used_gpu_memory;
                }
            }
        }
        (own, others)
    }

    /// The compute processes NVML lists on `dev` (none if the query fails).
    fn list(&self, dev: NvmlDevice) -> Vec<ProcessInfo> {
        let mut buf = vec![ProcessInfo::default(); 64];
        let mut n = buf.len() as c_uint;
        // SAFETY: buf holds n entries; NVML writes at most n and sets n.
        let mut rc = unsafe { (self.processes)(dev, &mut n, buf.as_mut_ptr()) };
        if rc == NVML_ERROR_INSUFFICIENT_SIZE {
            buf = vec![ProcessInfo::default(); n as usize + 16];
            n = buf.len() as c_uint;
            // SAFETY: as above, with the larger buffer.
            rc = unsafe { (self.processes)(dev, &mut n, buf.as_mut_ptr()) };
        }
        if rc != NVML_SUCCESS {
            return Vec::new();
        }
        buf.truncate((n as usize).min(buf.len()));
        buf
    }

    /// The card at PCI bus id `pci` ("0000:c1:00.0", as ggml's CUDA
    /// backend reports it), if NVML knows it.
    fn card(&self, pci: &str) -> Option<NvmlDevice> {
        let by_pci = self.by_pci?;
        let id = std::ffi::CString::new(pci).ok()?;
        let mut d: NvmlDevice = std::ptr::null_mut();
        // SAFETY: id is NUL-terminated and d a valid out-pointer.
        (unsafe { by_pci(id.as_ptr(), &mut d) } == NVML_SUCCESS).then_some(d)
    }

    /// One card's memory split by owner, as [`card_usage`] reads it for all.
    fn usage_of(&self, dev: NvmlDevice) -> Option<CardUsage> {
        let mut m = MemoryInfo::default();
        // SAFETY: m is a valid out-pointer.
        if unsafe { (self.memory)(dev, &mut m) } != NVML_SUCCESS {
            return None;
        }
        let pid = std::process::id();
        let listed = self.list(dev);
        let used = |own: bool| {
            listed
                .iter()
                .filter(|p| p.used_gpu_memory != NVML_VALUE_NOT_AVAILABLE && (p.pid == pid) == own)
                .map(|p| p.used_gpu_memory)
                .sum::<u64>()
        };
        let own = used(true);
        Some(CardUsage {
            total: m.total,
            others: used(false).max(m.used.saturating_sub(own)),
            own,
        })
    }

    /// (total, free, used) summed over the cards.
    fn cards(&self) -> Option<(u64, u64, u64)> {
        let (mut total, mut free, mut used) = (0, 0, 0);
        for &dev in &self.devices {
            let mut m = MemoryInfo::default();
            // SAFETY: m is a valid out-pointer.
            if unsafe { (self.memory)(dev, &mut m) } != NVML_SUCCESS {
                return None;
            }
            total += m.total;
            free += m.free;
            used += m.used;
        }
        Some((total, free, used))
    }
}

/// Where a process figure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProcessMemorySource {
    /// NVML's entry for this process: what nvidia-smi shows.
    NvmlProcess,
    /// The growth of the cards' used memory since before the CUDA context
    /// existed (this PID is not visible to NVML, e.g. in a container).
    NvmlCardGrowth,
}

/// Record the cards' used memory before any device context exists, so that
/// [`process_bytes`] can fall back to its growth. Called by
/// [`super::init`] before the backends load; later calls do nothing.
pub fn take_baseline() {
    BASELINE.get_or_init(|| nvml().and_then(Nvml::cards).map(|(_, _, used)| used));
}

/// The process's device memory as NVML reports it, and how it was read;
/// None without NVML.
pub fn process_bytes() -> Option<(u64, ProcessMemorySource)> {
    let n = nvml()?;
    if let Some(b) = n.own_process_bytes() {
        return Some((b, ProcessMemorySource::NvmlProcess));
    }
    let base = (*BASELINE.get()?)?;
    Some((n.cards()?.2.saturating_sub(base), ProcessMemorySource::NvmlCardGrowth))
}

/// Whether NVML could be loaded.
pub fn available() -> bool {
    nvml().is_some()
}

/// The cards' (total, free) memory as NVML sees it (every process's use
/// counted); None without NVML.
pub fn cards_memory() -> Option<(u64, u64)> {
    nvml()?.cards().map(|(total, free, _)| (total, free))
}

/// The cards' memory split by owner, summed over the cards, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CardUsage {
    /// The cards' memory.
    pub total: u64,
    /// Everything in use that is not this process's: every other process's
    /// memory, and what the driver holds for no process.
    pub others: u64,
    /// This process's memory (as [`process_bytes`] reads it).
    pub own: u64,
}

/// The cards' memory: total, every other process's use and this process's;
/// None without NVML. "Others" is the larger of the other processes NVML
/// lists and the cards' use less this process's, so memory the driver
/// holds for no process counts as taken.
pub fn card_usage() -> Option<CardUsage> {
    let n = nvml()?;
    let (total, _, used) = n.cards()?;
    let (listed_own, listed_others) = n.process_split();
    let own = match listed_own {
        Some(b) => b,
        None => process_bytes().map_or(0, |(b, _)| b),
    };
    Some(CardUsage {
        total,
        others: listed_others.max(used.saturating_sub(own)),
        own,
    })
}

/// One card's memory split by owner, the card named by its PCI bus id (a
/// ggml device's `device_id`); None without NVML or where NVML does not
/// know the id. Inside a PID namespace this process's own use is not
/// listed, so it counts among the others': the budget is then what the
/// card has free.
pub fn device_usage(pci_bus_id: &str) -> Option<CardUsage> {
    let n = nvml()?;
    n.usage_of(n.card(pci_bus_id)?)
}
