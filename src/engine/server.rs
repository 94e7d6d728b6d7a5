//! llama.cpp's own server (`tools/server`) run in this process, and the load
//! hook (patch 0007) through which pipeshard sees, and may set, the exact
//! parameters upstream loads each model with.

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::PathBuf;

use super::context::ContextParams;
use super::ffi;
use super::migrate::ContextRef;
use super::model::ModelParams;
use super::placement::tensor_buft_trampoline;
use super::routing::{moe_route_trampoline, MoeRoutePolicy};

/// What a model is loaded for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadRole {
    /// The main model.
    Target,
    /// The draft model of speculative decoding (`-md`).
    Draft,
}

/// A model upstream is about to load.
#[derive(Debug, Clone)]
pub struct LoadRequest {
    pub role: LoadRole,
    pub model: PathBuf,
    /// For the target: the draft model loaded after it (`-md`).
    pub draft: Option<PathBuf>,
    /// For the target: the multimodal projector loaded after it (`-mm`).
    pub mmproj: Option<PathBuf>,
}

/// What the hook did with a load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadDecision {
    /// Upstream places the model as it would without pipeshard (and
    /// `--fit` runs if it is on); of the hook's changes only a benchmark's
    /// routing policy ([`ContextParams::moe_route`]) is installed.
    Upstream,
    /// The hook placed the model; its changes to the parameters are
    /// installed, and upstream's `--fit` does not move anything.
    Placed,
}

/// Called with each model load's parameters as upstream resolved them.
///
/// Of the model parameters, `n_gpu_layers`, `use_mmap`, `movable_weights` and `placement` are
/// installed (upstream's own `-ot` overrides stay as given; `placement` is
/// asked first). Every context parameter is installed, with its callbacks.
/// An error fails the load, and upstream exits with its own message after
/// the hook's. Installed through [`ServerHooks::load`].
pub type LoadHook = Box<
    dyn Fn(&LoadRequest, &mut ModelParams<'static>, &mut ContextParams) -> Result<LoadDecision, String> + Send + Sync,
>;

fn path_of(p: *const c_char) -> Option<PathBuf> {
    if p.is_null() {
        return None;
    }
    // SAFETY: common passes NUL-terminated paths that outlive the call.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    (!s.is_empty()).then(|| PathBuf::from(s))
}

impl ModelParams<'static> {
    /// The parameters `mp` holds, as far as these fields describe them.
    fn from_c(mp: &ffi::llama_model_params) -> ModelParams<'static> {
        ModelParams {
            n_gpu_layers: mp.n_gpu_layers,
            use_mmap: matches!(
                mp.load_mode,
                ffi::LLAMA_LOAD_MODE_MMAP | ffi::LLAMA_LOAD_MODE_MMAP_MLOCK
            ),
            vocab_only: mp.vocab_only,
            no_alloc: mp.no_alloc,
            repack: mp.use_extra_bufts,
            movable_weights: mp.movable_weights,
            cpu_weight_copies: mp.cpu_weight_copies,
            ..Default::default()
        }
    }

    /// Install what the hook may set; the placement callback, the layer
    /// split and the added tensor overrides are leaked, as a model may be
    /// loaded again (the server's sleep and resume) at any time.
    fn write_c_placed(self, mp: &mut ffi::llama_model_params) -> Result<(), String> {
        if !self.devices.is_empty() {
            let (devices, shares) =
                super::model::layer_split_arrays(&self.devices, &self.tensor_split).map_err(|e| e.to_string())?;
            mp.devices = Box::leak(devices.into_boxed_slice()).as_mut_ptr();
            mp.split_mode = ffi::LLAMA_SPLIT_MODE_LAYER;
            if !self.tensor_split.is_empty() {
                mp.tensor_split = Box::leak(shares.into_boxed_slice()).as_ptr();
            }
        }
        if !self.tensor_overrides.is_empty() {
            mp.tensor_buft_overrides = with_overrides(mp.tensor_buft_overrides, &self.tensor_overrides)?;
        }
        mp.n_gpu_layers = self.n_gpu_layers;
        mp.movable_weights = self.movable_weights;
        mp.cpu_weight_copies = self.cpu_weight_copies;
        if !self.use_mmap && matches!(mp.load_mode, ffi::LLAMA_LOAD_MODE_MMAP | ffi::LLAMA_LOAD_MODE_AUTO) {
            mp.load_mode = ffi::LLAMA_LOAD_MODE_NONE;
        }
        if let Some(placement) = self.placement {
            let placement: &'static _ = Box::leak(Box::new(placement));
            mp.tensor_buft_cb = Some(tensor_buft_trampoline);
            mp.tensor_buft_cb_user_data = placement as *const _ as *mut c_void;
        }
        Ok(())
    }
}

/// Upstream's tensor overrides (`-ot`, ended by a null pattern; null: none)
/// followed by `added`, as a leaked list that ends the same way.
fn with_overrides(
    upstream: *const ffi::llama_model_tensor_buft_override,
    added: &[(String, super::BufferType)],
) -> Result<*const ffi::llama_model_tensor_buft_override, String> {
    let mut list = Vec::new();
    if !upstream.is_null() {
        // SAFETY: common's list of overrides ends with a null pattern.
        unsafe {
            let mut o = upstream;
            while !(*o).pattern.is_null() {
                list.push(*o);
                o = o.add(1);
            }
        }
    }
    for (pattern, buft) in added {
        let c = CString::new(pattern.as_str()).map_err(|_| format!("a NUL in the tensor override {pattern:?}"))?;
        list.push(ffi::llama_model_tensor_buft_override {
            pattern: Box::leak(c.into_boxed_c_str()).as_ptr(),
            buft: buft.0,
        });
    }
    list.push(ffi::llama_model_tensor_buft_override {
        pattern: std::ptr::null(),
        buft: std::ptr::null_mut(),
    });
    Ok(Box::leak(list.into_boxed_slice()).as_ptr())
}

unsafe extern "C" fn load_hook_trampoline(
    info: *const ffi::common_load_info,
    mp: *mut ffi::llama_model_params,
    cp: *mut ffi::llama_context_params,
    user: *mut c_void,
) -> ffi::common_load_hook_result {
    if user.is_null() || info.is_null() || mp.is_null() || cp.is_null() {
        return ffi::COMMON_LOAD_HOOK_DEFAULT;
    }
    // SAFETY: `user` is the hook [`run_llama_server`] installed, alive
    // until it returns; common passes valid pointers for the call.
    let (hook, info, mp, cp) = (&*(user as *const LoadHook), &*info, &mut *mp, &mut *cp);
    let Some(model) = path_of(info.path_model) else {
        return ffi::COMMON_LOAD_HOOK_DEFAULT;
    };
    let req = LoadRequest {
        role: if info.role == ffi::COMMON_LOAD_ROLE_DRAFT {
            LoadRole::Draft
        } else {
            LoadRole::Target
        },
        model,
        draft: path_of(info.path_draft),
        mmproj: path_of(info.path_mmproj),
    };
    let mut model_params = ModelParams::from_c(mp);
    let mut context = ContextParams::from_c(cp);
    let decided = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        hook(&req, &mut model_params, &mut context)
    }));
    match decided {
        Ok(Ok(LoadDecision::Upstream)) => {
            if let Some(route) = context.moe_route {
                // Leaked, as the context's callbacks are below.
                let route: &'static MoeRoutePolicy = Box::leak(Box::new(route));
                cp.moe_route_cb = Some(moe_route_trampoline);
                cp.moe_route_cb_user_data = route as *const MoeRoutePolicy as *mut c_void;
            }
            ffi::COMMON_LOAD_HOOK_DEFAULT
        }
        Ok(Ok(LoadDecision::Placed)) => {
            if let Err(message) = model_params.write_c_placed(mp) {
                tracing::error!("{}: {message}", req.model.display());
                return ffi::COMMON_LOAD_HOOK_ERROR;
            }
            // The context's callbacks live as long as the process: upstream
            // owns the context and may free and recreate it.
            let callbacks = context.write_c(cp);
            std::mem::forget(callbacks);
            ffi::COMMON_LOAD_HOOK_APPLIED
        }
        Ok(Err(message)) => {
            tracing::error!("{}: {message}", req.model.display());
            ffi::COMMON_LOAD_HOOK_ERROR
        }
        Err(_) => {
            tracing::error!("{}: the load hook panicked", req.model.display());
            ffi::COMMON_LOAD_HOOK_ERROR
        }
    }
}

/// The multimodal projector's parameters the server will load it with, as
/// far as pipeshard sets them (patch 0004's fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProjectorParams {
    /// Upstream's `--mmproj-offload` (on by default).
    pub use_gpu: bool,
    /// Keep the encoder's weights in pinned host memory and stream them.
    pub weights_on_host: bool,
    /// Device slots for the streamed weights.
    pub stream_slots: u32,
    /// Upstream's `--image-max-tokens` as the server passes it (read
    /// only); None: the projector's own maximum.
    pub image_max_tokens: Option<u32>,
    /// Encode a dummy image when the projector loads (upstream's warm-up).
    pub warmup: bool,
    /// Window attention in chunks of whole windows (patch 0021; 0: one mask).
    pub window_attn_max_tokens: u32,
}

/// Called with the projector's path and parameters right before the server
/// measures and loads it (patch 0008); changes are installed.
pub type ProjectorHook = Box<dyn Fn(&std::path::Path, &mut ProjectorParams) + Send + Sync>;

/// Text for the server's reports: `/props`' field and `/metrics`' lines.
pub type ReportText = Box<dyn Fn() -> String + Send + Sync>;

/// Called by the server's loop between two batches (patch 0024) with its
/// main context, borrowed for the call: no graph of it runs meanwhile.
pub type LoopHook = Box<dyn Fn(ContextRef<'_>) + Send + Sync>;

/// A field of the server's `GET /props` and lines of its `GET /metrics`
/// (patch 0008).
pub struct ServerReports {
    /// The field's name in `/props`.
    pub key: String,
    /// The field's value, JSON text.
    pub props: ReportText,
    /// Prometheus text appended to upstream's metrics.
    pub metrics: ReportText,
}

/// What a program running the server in its process adds to it, for one
/// run ([`run_llama_server`]). Each hook is handed to llama.cpp as the
/// `user_data` of its C callback, so it reaches the state it captured and
/// nothing process-wide.
#[derive(Default)]
pub struct ServerHooks {
    /// Every model load of llama.cpp's `common`: the server's target and
    /// draft models (patch 0007).
    pub load: Option<LoadHook>,
    /// The multimodal projector (`-mm`), right before it loads.
    pub projector: Option<ProjectorHook>,
    /// The server's loop, between two batches.
    pub between_batches: Option<LoopHook>,
    pub reports: Option<ServerReports>,
}

/// `hook` as a C callback's `user_data`.
fn user_data<T>(hook: &T) -> *mut c_void {
    hook as *const T as *mut c_void
}

/// [`ServerHooks`] installed in llama.cpp for as long as this lives; they
/// are removed when it drops.
struct InstalledHooks<'a>(std::marker::PhantomData<&'a ServerHooks>);

impl<'a> InstalledHooks<'a> {
    fn new(hooks: &'a ServerHooks) -> InstalledHooks<'a> {
        // SAFETY: each user_data points at a hook of `hooks`, which outlives
        // the installation: Drop removes every callback before the borrow
        // ends. The trampolines only read their hook.
        unsafe {
            if let Some(h) = &hooks.load {
                ffi::common_set_load_hook(Some(load_hook_trampoline), user_data(h));
            }
            if let Some(h) = &hooks.projector {
                ffi::llama_server_set_mtmd_params_cb(Some(projector_trampoline), user_data(h));
            }
            if let Some(h) = &hooks.between_batches {
                ffi::llama_server_set_loop_cb(Some(loop_trampoline), user_data(h));
            }
            match hooks.reports.as_ref().map(|r| (r, CString::new(r.key.as_str()))) {
                // The server copies the key.
                Some((r, Ok(key))) => {
                    ffi::llama_server_set_props_cb(key.as_ptr(), Some(props_trampoline), user_data(&r.props));
                    ffi::llama_server_set_metrics_cb(Some(metrics_trampoline), user_data(&r.metrics));
                }
                Some((_, Err(_))) => tracing::warn!("the server's report key holds a NUL byte; no reports"),
                None => {}
            }
        }
        InstalledHooks(std::marker::PhantomData)
    }
}

impl Drop for InstalledHooks<'_> {
    fn drop(&mut self) {
        // SAFETY: removing a callback only clears the server's pointers.
        unsafe {
            ffi::common_set_load_hook(None, std::ptr::null_mut());
            ffi::llama_server_set_mtmd_params_cb(None, std::ptr::null_mut());
            ffi::llama_server_set_loop_cb(None, std::ptr::null_mut());
            ffi::llama_server_set_props_cb(std::ptr::null(), None, std::ptr::null_mut());
            ffi::llama_server_set_metrics_cb(None, std::ptr::null_mut());
        }
    }
}

/// Run llama.cpp's server (`llama_server(argc, argv)` from
/// `tools/server`) with `args` (without the program name, which is
/// `program`) and `hooks`, in this thread, until it exits; returns its exit
/// code.
pub fn run_llama_server(program: &str, args: &[String], hooks: &ServerHooks) -> i32 {
    let owned: Vec<CString> = std::iter::once(program)
        .chain(args.iter().map(String::as_str))
        // An argument with a NUL byte cannot come from a command line;
        // upstream's parser sees it cut there, as a C program would.
        .map(|a| CString::new(a.split('\0').next().unwrap_or_default()).unwrap_or_default())
        .collect();
    let mut argv: Vec<*mut c_char> = owned.iter().map(|a| a.as_ptr() as *mut c_char).collect();
    argv.push(std::ptr::null_mut());
    let installed = InstalledHooks::new(hooks);
    // SAFETY: argv holds argc NUL-terminated strings and a final NULL, as
    // main() gets them; `owned` outlives the call. Upstream's parser only
    // reads them.
    let code = unsafe { ffi::pipeshard_llama_server((argv.len() - 1) as i32, argv.as_mut_ptr()) };
    drop(installed);
    code
}

unsafe extern "C" fn projector_trampoline(
    path: *const c_char,
    params: *mut ffi::mtmd_context_params,
    user: *mut c_void,
) {
    let (false, Some(path), false) = (user.is_null(), path_of(path), params.is_null()) else {
        return;
    };
    // SAFETY: `user` is the hook run_llama_server installed; the server
    // passes its parameters for the duration of the call.
    let (hook, params) = (&*(user as *const ProjectorHook), &mut *params);
    let mut p = ProjectorParams {
        use_gpu: params.use_gpu,
        weights_on_host: params.weights_on_host,
        stream_slots: params.n_stream_slots.max(0) as u32,
        image_max_tokens: u32::try_from(params.image_max_tokens).ok().filter(|&n| n > 0),
        warmup: params.warmup,
        window_attn_max_tokens: params.window_attn_max_tokens.max(0) as u32,
    };
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook(&path, &mut p))).is_ok() {
        params.use_gpu = p.use_gpu;
        params.weights_on_host = p.weights_on_host;
        params.n_stream_slots = p.stream_slots.min(i32::MAX as u32) as i32;
        params.warmup = p.warmup;
        params.window_attn_max_tokens = p.window_attn_max_tokens.min(i32::MAX as u32) as i32;
    }
}

/// Whether the server frees the language model's compute buffers before it
/// encodes media, and the encoder's after (patch 0008 with patch 0004), so
/// their device memory peaks never coexist.
pub fn set_media_release_compute(on: bool) {
    // SAFETY: sets a flag the server reads on its own thread.
    unsafe { ffi::llama_server_set_media_release_compute(on) };
}

/// snprintf-style copy of `text` into `buf` of `size` bytes.
unsafe fn write_text(text: &str, buf: *mut c_char, size: usize) -> usize {
    let bytes = text.as_bytes();
    if !buf.is_null() && size > 0 {
        let n = bytes.len().min(size - 1);
        // SAFETY: the server's buffer holds `size` bytes.
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf as *mut u8, n);
        *buf.add(n) = 0;
    }
    bytes.len()
}

/// The text of the [`ReportText`] `user` points at, or `fallback` when it
/// panicked.
unsafe fn report_text(user: *mut c_void, fallback: &str, buf: *mut c_char, size: usize) -> usize {
    let text = match (user as *const ReportText).as_ref() {
        // SAFETY: `user` is a report hook run_llama_server installed.
        Some(f) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| fallback.into()),
        None => fallback.into(),
    };
    write_text(&text, buf, size)
}

unsafe extern "C" fn props_trampoline(buf: *mut c_char, size: usize, user: *mut c_void) -> usize {
    report_text(user, "null", buf, size)
}

unsafe extern "C" fn metrics_trampoline(buf: *mut c_char, size: usize, user: *mut c_void) -> usize {
    report_text(user, "", buf, size)
}

unsafe extern "C" fn loop_trampoline(ctx: *mut ffi::llama_context, user: *mut c_void) {
    if user.is_null() {
        return;
    }
    // SAFETY: `user` is the hook run_llama_server installed.
    let hook = &*(user as *const LoopHook);
    // SAFETY: the server passes its live main context on its loop's thread,
    // between two batches, and uses it for nothing else during the call.
    let Some(cr) = (unsafe { ContextRef::from_raw(ctx) }) else {
        return;
    };
    // A panic must not unwind into C++.
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook(cr))).is_err() {
        tracing::error!("the server loop hook panicked");
    }
}

/// Wake the server's loop so that the loop hook runs soon, even with no
/// request in flight (thread-safe; nothing while the loop is not running).
pub fn wake_server_loop() {
    // SAFETY: takes no arguments; the server locks its own state.
    unsafe { ffi::llama_server_wake_loop() };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_of(hook: &ReportText) -> String {
        let mut buf = [0 as c_char; 64];
        // SAFETY: the buffer holds 64 bytes; the hook outlives the call.
        let n = unsafe { props_trampoline(buf.as_mut_ptr(), buf.len(), user_data(hook)) };
        // SAFETY: write_text ended the text with a NUL.
        let text = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
        assert_eq!(n, text.len());
        text
    }

    /// Each callback reaches the hook its user_data points at: two sets of
    /// hooks in one process answer each for itself, and a panic is "null".
    #[test]
    fn a_report_callback_answers_from_its_own_hook() {
        let a: ReportText = Box::new(|| "{\"a\":1}".into());
        let b: ReportText = Box::new(|| "{\"b\":2}".into());
        let broken: ReportText = Box::new(|| panic!("a report failed"));
        assert_eq!(text_of(&a), "{\"a\":1}");
        assert_eq!(text_of(&b), "{\"b\":2}");
        assert_eq!(text_of(&a), "{\"a\":1}");
        assert_eq!(text_of(&broken), "null");
        // /metrics gets nothing from a hook that panicked.
        let mut buf = [1 as c_char; 8];
        // SAFETY: as in text_of.
        assert_eq!(
            unsafe { metrics_trampoline(buf.as_mut_ptr(), buf.len(), user_data(&broken)) },
            0
        );
        assert_eq!(buf[0], 0);
    }
}
