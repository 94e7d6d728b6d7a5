//! Process-wide llama.cpp initialisation: logging and backend modules.
//!
//! ggml backends are built as loadable modules (`libggml-cpu.so`,
//! `libggml-cuda.so`, ...). They are loaded once per process from, in order:
//! the directory given to [`init`], `$PIPESHARD_BACKEND_DIR`, the directory of
//! the running executable (and its `lib/`), and the build tree.

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::error::{EngineError, Result};
use super::ffi;

static INIT: OnceLock<Result<Vec<Device>, String>> = OnceLock::new();
static AT_INIT: OnceLock<Option<u64>> = OnceLock::new();

/// The process's device memory (NVML) right after [`init`] loaded the
/// backends and the GPU's context exists, before any model: the CUDA
/// context and what the backends allocate up front. None without NVML or
/// a GPU.
pub fn process_bytes_at_init() -> Option<u64> {
    AT_INIT.get().copied().flatten()
}

/// A compute device that ggml found after loading the backend modules.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Device {
    pub index: usize,
    pub name: String,
    pub description: String,
    pub kind: DeviceKind,
    pub free_bytes: u64,
    pub total_bytes: u64,
    /// The PCI bus id ggml reports ("0000:c1:00.0"), where it knows one:
    /// how NVML finds the same card.
    pub device_id: Option<String>,
}

/// What kind of device a ggml backend device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum DeviceKind {
    Cpu,
    Gpu,
    IntegratedGpu,
    Accelerator,
    Other,
}

unsafe extern "C" fn log_to_tracing(level: ffi::ggml_log_level, text: *const c_char, _: *mut c_void) {
    if text.is_null() {
        return;
    }
    let msg = CStr::from_ptr(text).to_string_lossy();
    let msg = msg.trim_end();
    if msg.is_empty() || msg == "." {
        return;
    }
    match level {
        ffi::GGML_LOG_LEVEL_ERROR => tracing::error!(target: "llama.cpp", "{msg}"),
        ffi::GGML_LOG_LEVEL_WARN => tracing::warn!(target: "llama.cpp", "{msg}"),
        ffi::GGML_LOG_LEVEL_INFO => tracing::debug!(target: "llama.cpp", "{msg}"),
        _ => tracing::trace!(target: "llama.cpp", "{msg}"),
    }
}

fn candidate_dirs(explicit: Option<&Path>) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = explicit {
        dirs.push(d.to_path_buf());
    }
    if let Some(d) = std::env::var_os("PIPESHARD_BACKEND_DIR") {
        dirs.push(PathBuf::from(d));
    }
    if let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
    {
        dirs.push(exe_dir.join("lib"));
        dirs.push(exe_dir);
    }
    dirs.push(PathBuf::from(env!("PIPESHARD_BUILD_LIB_DIR")));
    dirs
}

/// Initialise llama.cpp once: route its log through `tracing` and load the
/// ggml backend modules. Later calls return the devices found the first time.
pub fn init(backend_dir: Option<&Path>) -> Result<Vec<Device>> {
    init_with(backend_dir, true)
}

/// [`init`] for a host that keeps llama.cpp's own log (llama.cpp's server,
/// which prints it its own way): only the backend modules are loaded.
pub fn init_keep_log(backend_dir: Option<&Path>) -> Result<Vec<Device>> {
    init_with(backend_dir, false)
}

fn init_with(backend_dir: Option<&Path>, log_to_tracing_too: bool) -> Result<Vec<Device>> {
    let res = INIT.get_or_init(|| {
        if log_to_tracing_too {
            // SAFETY: the callback is a plain function that only reads the C
            // string it is given; llama.cpp calls it from any thread.
            unsafe {
                ffi::llama_log_set(Some(log_to_tracing), std::ptr::null_mut());
                ffi::ggml_log_set(Some(log_to_tracing), std::ptr::null_mut());
            }
        }
        // The cards' memory before our CUDA context exists: the process
        // figure's fallback where NVML does not list this PID.
        super::nvml::take_baseline();
        let dirs = candidate_dirs(backend_dir);
        let mut loaded_from = None;
        for dir in &dirs {
            if !dir.is_dir() {
                continue;
            }
            let has_module = std::fs::read_dir(dir)
                .map(|rd| {
                    rd.flatten().any(|e| {
                        let n = e.file_name();
                        let n = n.to_string_lossy();
                        n.starts_with("libggml-") && n.ends_with(".so") && n != "libggml-base.so"
                    })
                })
                .unwrap_or(false);
            if !has_module {
                continue;
            }
            if let Ok(c) = CString::new(dir.to_string_lossy().as_bytes()) {
                tracing::debug!("loading ggml backends from {}", dir.display());
                // SAFETY: c is a valid NUL-terminated path that outlives the call.
                unsafe { ffi::ggml_backend_load_all_from_path(c.as_ptr()) };
            }
            // SAFETY: plain query.
            if unsafe { ffi::ggml_backend_dev_count() } > 0 {
                loaded_from = Some(dir.clone());
                break;
            }
        }
        // SAFETY: plain initialisation call, made once.
        unsafe { ffi::llama_backend_init() };
        let devices = list_devices();
        if devices.iter().any(|d| d.kind == DeviceKind::Gpu) {
            if let Some(bytes) = super::cuda_limits::stack_bytes(loaded_from.as_deref()) {
                let n = super::cuda_limits::set_stack_bytes(bytes);
                tracing::debug!("CUDA stack: {bytes} bytes per thread on {n} device(s)");
            }
        }
        let gpu = devices.iter().any(|d| d.kind == DeviceKind::Gpu);
        AT_INIT.get_or_init(|| gpu.then(super::process_device_bytes).flatten().map(|(b, _)| b));
        if devices.is_empty() {
            let searched: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
            return Err(searched.join(", "));
        }
        Ok(devices)
    });
    res.clone().map_err(|searched| EngineError::NoBackend { searched })
}

fn c_str(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: ggml returns NUL-terminated strings that live as long as the device.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// The devices ggml knows about now, with their current free memory.
pub fn list_devices() -> Vec<Device> {
    // SAFETY: device queries on registered devices; indices are in range.
    unsafe {
        (0..ffi::ggml_backend_dev_count())
            .map(|i| {
                let dev = ffi::ggml_backend_dev_get(i);
                let (mut free, mut total) = (0usize, 0usize);
                ffi::ggml_backend_dev_memory(dev, &mut free, &mut total);
                let mut props: ffi::ggml_backend_dev_props = std::mem::zeroed();
                ffi::ggml_backend_dev_get_props(dev, &mut props);
                let kind = match ffi::ggml_backend_dev_type(dev) {
                    ffi::GGML_BACKEND_DEVICE_TYPE_CPU => DeviceKind::Cpu,
                    ffi::GGML_BACKEND_DEVICE_TYPE_GPU => DeviceKind::Gpu,
                    ffi::GGML_BACKEND_DEVICE_TYPE_IGPU => DeviceKind::IntegratedGpu,
                    ffi::GGML_BACKEND_DEVICE_TYPE_ACCEL => DeviceKind::Accelerator,
                    _ => DeviceKind::Other,
                };
                Device {
                    index: i,
                    name: c_str(ffi::ggml_backend_dev_name(dev)),
                    description: c_str(ffi::ggml_backend_dev_description(dev)),
                    kind,
                    free_bytes: free as u64,
                    total_bytes: total as u64,
                    device_id: (!props.device_id.is_null()).then(|| c_str(props.device_id)),
                }
            })
            .collect()
    }
}

/// The features of the loaded CPU backend module, as it reports them
/// (`("AVX2", "1")`, `("AVX512_VNNI", "1")`, ...): those it was built with,
/// which ggml's loader takes only where this CPU has them. Empty where no
/// CPU module is loaded or it reports none.
pub fn cpu_features() -> Vec<(String, String)> {
    // SAFETY: registry lookups with valid C strings. The entry point, where
    // the module offers it, has ggml's `ggml_backend_get_features_t` type
    // and returns an array that ends with a null name, whose strings live
    // as long as the module (loaded for the process's life).
    unsafe {
        let reg = ffi::ggml_backend_reg_by_name(c"CPU".as_ptr());
        if reg.is_null() {
            return Vec::new();
        }
        let f = ffi::ggml_backend_reg_get_proc_address(reg, c"ggml_backend_get_features".as_ptr());
        if f.is_null() {
            return Vec::new();
        }
        let get: unsafe extern "C" fn(ffi::ggml_backend_reg_t) -> *mut ffi::ggml_backend_feature =
            std::mem::transmute(f);
        let mut out = Vec::new();
        let mut p = get(reg);
        while !p.is_null() && !(*p).name.is_null() {
            out.push((c_str((*p).name), c_str((*p).value)));
            p = p.add(1);
        }
        out
    }
}

/// The first loaded device of a kind (ggml lists GPUs before the CPU).
pub fn first_device(kind: DeviceKind) -> Option<Device> {
    list_devices().into_iter().find(|d| d.kind == kind)
}

/// Whether any GPU device was loaded.
pub fn has_gpu() -> bool {
    first_device(DeviceKind::Gpu).is_some()
}

/// Free memory of one device right now, bytes.
pub fn device_free_bytes(index: usize) -> Option<u64> {
    // SAFETY: the index is checked against the device count.
    unsafe {
        if index >= ffi::ggml_backend_dev_count() {
            return None;
        }
        let (mut free, mut total) = (0usize, 0usize);
        ffi::ggml_backend_dev_memory(ffi::ggml_backend_dev_get(index), &mut free, &mut total);
        Some(free as u64)
    }
}
