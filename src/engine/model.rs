//! Loading a GGUF model and querying its vocabulary, metadata and memory.

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use super::error::{EngineError, Result};
use super::ffi;
use super::placement::{tensor_buft_trampoline, TensorPlacement};
use super::BufferType;

/// A token id.
pub type Token = ffi::llama_token;

/// Where a model's weights should go, and how it is read from disk.
pub struct ModelParams<'a> {
    /// Layers to keep on the GPU, counted from the last; negative means all.
    pub n_gpu_layers: i32,
    /// Memory-map the file (llama.cpp's default) instead of reading it.
    pub use_mmap: bool,
    /// Load only the vocabulary, no weights.
    pub vocab_only: bool,
    /// Per-tensor buffer type overrides: the first regex that matches a
    /// tensor name decides its buffer type (upstream's `-ot`).
    pub tensor_overrides: Vec<(String, BufferType)>,
    /// Called with the load progress in `[0, 1]`; returning `false` cancels.
    pub progress: Option<Box<dyn FnMut(f32) -> bool + 'a>>,
    /// Chooses each weight's buffer type by name (patch 0002); asked before
    /// `tensor_overrides`.
    pub placement: Option<TensorPlacement>,
    /// Only load metadata and simulate allocations (to measure memory).
    pub no_alloc: bool,
    /// Let the CPU backend repack weights it computes into its faster
    /// interleaved layouts (llama.cpp's default; upstream's `--no-repack`
    /// turns it off). Weights in the GPU's pinned host buffers are never
    /// repacked.
    pub repack: bool,
    /// Allocate each weight that is not memory-mapped in a buffer of its own
    /// (patch 0023), so that [`super::migrate_weights`] can free the memory
    /// of any weight it moves away. Without it, llama.cpp keeps one buffer
    /// per buffer type, freed only when every weight in it has moved.
    pub movable_weights: bool,
    /// Give each feed-forward and MoE expert weight in plain host memory (a
    /// GPU's pinned buffers) a copy in the CPU's repacking buffer type (patch
    /// 0039), which the CPU's part of hybrid experts and of a dense row split
    /// computes with: faster CPU kernels for as much host memory again.
    pub cpu_weight_copies: bool,
    /// The devices the model's layers go to, by ggml's device index, in
    /// llama.cpp's layer order (`-dev`); empty: every device llama.cpp
    /// finds, as upstream chooses.
    pub devices: Vec<usize>,
    /// With `devices`: each device's share of the offloaded layers
    /// (`-ts`), split by layer (`-sm layer`); empty: by free memory.
    pub tensor_split: Vec<f32>,
}

impl Default for ModelParams<'_> {
    fn default() -> Self {
        ModelParams {
            n_gpu_layers: -1,
            use_mmap: true,
            vocab_only: false,
            tensor_overrides: Vec::new(),
            progress: None,
            placement: None,
            no_alloc: false,
            repack: true,
            movable_weights: false,
            cpu_weight_copies: false,
            devices: Vec::new(),
            tensor_split: Vec::new(),
        }
    }
}

/// `devices` as llama.cpp's null-terminated device list, and `split` as its
/// `tensor_split` array (one float for each of its most devices); an error
/// where a device index is not ggml's or there are more shares than slots.
pub(crate) fn layer_split_arrays(devices: &[usize], split: &[f32]) -> Result<(Vec<ffi::ggml_backend_dev_t>, Vec<f32>)> {
    // SAFETY: plain queries.
    let (n_devices, max) = unsafe { (ffi::ggml_backend_dev_count(), ffi::llama_max_devices()) };
    if let Some(&bad) = devices.iter().find(|&&d| d >= n_devices) {
        return Err(EngineError::InvalidArgument(format!(
            "device index {bad}: ggml has {n_devices} devices"
        )));
    }
    if devices.len() > max || split.len() > max {
        return Err(EngineError::InvalidArgument(format!(
            "{} devices for a layer split: llama.cpp takes at most {max}",
            devices.len().max(split.len())
        )));
    }
    // SAFETY: every index was checked against the device count.
    let mut list: Vec<ffi::ggml_backend_dev_t> = devices
        .iter()
        .map(|&d| unsafe { ffi::ggml_backend_dev_get(d) })
        .collect();
    list.push(std::ptr::null_mut());
    let mut shares = split.to_vec();
    shares.resize(max, 0.0);
    Ok((list, shares))
}

/// A loaded model. Immutable and shareable between threads and contexts.
pub struct Model {
    ptr: NonNull<ffi::llama_model>,
    path: PathBuf,
}

// SAFETY: llama.cpp allows concurrent read-only use of a llama_model by many
// contexts; all methods here only read it.
unsafe impl Send for Model {}
unsafe impl Sync for Model {}

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: ptr came from llama_model_load_from_file and is freed once.
        unsafe { ffi::llama_model_free(self.ptr.as_ptr()) };
    }
}

unsafe extern "C" fn progress_trampoline(progress: f32, user: *mut c_void) -> bool {
    // SAFETY: user points at the boxed closure owned by `Model::load` for the
    // duration of the load call.
    let cb = &mut *(user as *mut Box<dyn FnMut(f32) -> bool>);
    cb(progress)
}

/// Everything llama.cpp trusts in a model file, checked in one place
/// before any llama.cpp call reads it, so that no caller can hand it a file
/// that would make it abort: every path that loads a model (`run`, `plan`,
/// `bench`, the server's target, draft and projector) calls this.
pub fn check_model_file(path: &Path) -> Result<()> {
    if !path.exists() {
        return Err(EngineError::ModelMissing {
            path: path.to_path_buf(),
        });
    }
    let invalid = |reason: String| EngineError::InvalidModel {
        path: path.to_path_buf(),
        reason,
    };
    let file = crate::gguf::GgufFile::open(path).map_err(|e| invalid(e.to_string()))?;
    crate::gguf::validate(&file).map_err(|e| invalid(e.to_string()))
}

impl Model {
    /// Load a model. The file is validated as GGUF first, and its
    /// hyper-parameters against llama.cpp's limits and its tensors
    /// ([`crate::gguf::validate`]), so that corrupt, truncated or inconsistent
    /// files fail with a clear error instead of reaching llama.cpp.
    pub fn load(path: &Path, mut params: ModelParams<'_>) -> Result<Model> {
        check_model_file(path)?;
        super::init(None)?;

        let c_path = CString::new(path.to_string_lossy().as_bytes()).map_err(|_| EngineError::NulInText)?;
        let patterns: Vec<CString> = params
            .tensor_overrides
            .iter()
            .map(|(p, _)| CString::new(p.as_str()).map_err(|_| EngineError::NulInText))
            .collect::<Result<_>>()?;
        let mut overrides: Vec<ffi::llama_model_tensor_buft_override> = patterns
            .iter()
            .zip(&params.tensor_overrides)
            .map(|(p, (_, buft))| ffi::llama_model_tensor_buft_override {
                pattern: p.as_ptr(),
                buft: buft.0,
            })
            .collect();
        overrides.push(ffi::llama_model_tensor_buft_override {
            pattern: std::ptr::null(),
            buft: std::ptr::null_mut(),
        });

        // SAFETY: default params are plain data.
        let mut mp = unsafe { ffi::llama_model_default_params() };
        mp.n_gpu_layers = params.n_gpu_layers;
        mp.load_mode = if params.use_mmap && !params.no_alloc {
            ffi::LLAMA_LOAD_MODE_MMAP
        } else {
            ffi::LLAMA_LOAD_MODE_NONE
        };
        mp.vocab_only = params.vocab_only;
        mp.no_alloc = params.no_alloc;
        mp.use_extra_bufts = params.repack;
        mp.movable_weights = params.movable_weights;
        mp.cpu_weight_copies = params.cpu_weight_copies;
        let (device_list, shares) = layer_split_arrays(&params.devices, &params.tensor_split)?;
        if !params.devices.is_empty() {
            mp.devices = device_list.as_ptr() as *mut ffi::ggml_backend_dev_t;
            mp.split_mode = ffi::LLAMA_SPLIT_MODE_LAYER;
            if !params.tensor_split.is_empty() {
                mp.tensor_split = shares.as_ptr();
            }
        }
        let placement = params.placement.take();
        if let Some(pl) = &placement {
            mp.tensor_buft_cb = Some(tensor_buft_trampoline);
            mp.tensor_buft_cb_user_data = pl as *const TensorPlacement as *mut c_void;
        }
        if !params.tensor_overrides.is_empty() {
            mp.tensor_buft_overrides = overrides.as_ptr();
        }
        let mut cb: Option<Box<dyn FnMut(f32) -> bool + '_>> = params.progress.take();
        let cancelled = std::cell::Cell::new(false);
        let mut wrapped: Box<dyn FnMut(f32) -> bool + '_> = Box::new(|p: f32| {
            let go_on = cb.as_mut().map_or(true, |f| f(p));
            if !go_on {
                cancelled.set(true);
            }
            go_on
        });
        mp.progress_callback = Some(progress_trampoline);
        mp.progress_callback_user_data = &mut wrapped as *mut Box<dyn FnMut(f32) -> bool + '_> as *mut c_void;

        // SAFETY: c_path, overrides (and the patterns they point into),
        // device_list, shares and `wrapped` all outlive this call;
        // llama.cpp copies the devices and keeps no other pointer.
        let raw = unsafe { ffi::llama_model_load_from_file(c_path.as_ptr(), mp) };
        drop(wrapped);
        drop(placement);
        match NonNull::new(raw) {
            Some(ptr) => {
                let model = Model {
                    ptr,
                    path: path.to_path_buf(),
                };
                Ok(model)
            }
            None if cancelled.get() => Err(EngineError::LoadCancelled),
            None => Err(EngineError::ModelLoad {
                path: path.to_path_buf(),
            }),
        }
    }

    pub(crate) fn as_ptr(&self) -> *mut ffi::llama_model {
        self.ptr.as_ptr()
    }

    fn vocab(&self) -> *const ffi::llama_vocab {
        // SAFETY: the model is valid; the vocab lives as long as the model.
        unsafe { ffi::llama_model_get_vocab(self.ptr.as_ptr()) }
    }

    /// The file this model was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A short description, e.g. "llama 135M Q4_1".
    pub fn description(&self) -> String {
        let mut buf = vec![0u8; 256];
        // SAFETY: buf is writable for its length.
        let n = unsafe { ffi::llama_model_desc(self.ptr.as_ptr(), buf.as_mut_ptr() as *mut c_char, buf.len()) };
        buf.truncate(n.max(0) as usize);
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// Total bytes of all weight tensors.
    pub fn size_bytes(&self) -> u64 {
        // SAFETY: plain query.
        unsafe { ffi::llama_model_size(self.ptr.as_ptr()) }
    }

    /// Number of parameters.
    pub fn n_params(&self) -> u64 {
        // SAFETY: plain query.
        unsafe { ffi::llama_model_n_params(self.ptr.as_ptr()) }
    }

    /// Number of transformer blocks.
    pub fn n_layer(&self) -> i32 {
        // SAFETY: plain query.
        unsafe { ffi::llama_model_n_layer(self.ptr.as_ptr()) }
    }

    /// Embedding width.
    pub fn n_embd(&self) -> i32 {
        // SAFETY: plain query.
        unsafe { ffi::llama_model_n_embd(self.ptr.as_ptr()) }
    }

    /// Context length the model was trained with.
    pub fn n_ctx_train(&self) -> i32 {
        // SAFETY: plain query.
        unsafe { ffi::llama_model_n_ctx_train(self.ptr.as_ptr()) }
    }

    /// Vocabulary size.
    pub fn n_vocab(&self) -> i32 {
        // SAFETY: plain query on a valid vocab.
        unsafe { ffi::llama_vocab_n_tokens(self.vocab()) }
    }

    /// A metadata value as a string, if the key exists.
    pub fn meta(&self, key: &str) -> Option<String> {
        let key = CString::new(key).ok()?;
        let mut buf = vec![0u8; 512];
        loop {
            // SAFETY: buf is writable for its length; key is NUL-terminated.
            let n = unsafe {
                ffi::llama_model_meta_val_str(
                    self.ptr.as_ptr(),
                    key.as_ptr(),
                    buf.as_mut_ptr() as *mut c_char,
                    buf.len(),
                )
            };
            if n < 0 {
                return None;
            }
            let n = n as usize;
            if n < buf.len() {
                buf.truncate(n);
                return Some(String::from_utf8_lossy(&buf).into_owned());
            }
            buf.resize(n + 1, 0);
        }
    }

    /// Beginning-of-sequence token, if the vocabulary has one.
    pub fn token_bos(&self) -> Option<Token> {
        // SAFETY: plain query.
        let t = unsafe { ffi::llama_vocab_bos(self.vocab()) };
        (t >= 0).then_some(t)
    }

    /// End-of-sequence token, if the vocabulary has one.
    pub fn token_eos(&self) -> Option<Token> {
        // SAFETY: plain query.
        let t = unsafe { ffi::llama_vocab_eos(self.vocab()) };
        (t >= 0).then_some(t)
    }

    /// End-of-turn token, if the vocabulary has one.
    pub fn token_eot(&self) -> Option<Token> {
        // SAFETY: plain query.
        let t = unsafe { ffi::llama_vocab_eot(self.vocab()) };
        (t >= 0).then_some(t)
    }

    /// Whether the token ends generation (EOS, EOT, ...).
    pub fn is_eog(&self, token: Token) -> bool {
        // SAFETY: plain query; out-of-range ids are rejected first.
        token >= 0 && token < self.n_vocab() && unsafe { ffi::llama_vocab_is_eog(self.vocab(), token) }
    }

    /// Whether the tokenizer adds a BOS token by default.
    pub fn add_bos(&self) -> bool {
        // SAFETY: plain query.
        unsafe { ffi::llama_vocab_get_add_bos(self.vocab()) }
    }

    /// Tokenize text. `add_special` adds BOS/EOS as the model wants;
    /// `parse_special` turns special-token text (e.g. `<|im_start|>`) into tokens.
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<Token>> {
        let len: i32 = text
            .len()
            .try_into()
            .map_err(|_| EngineError::Tokenize { len: text.len() })?;
        let mut toks: Vec<Token> = vec![0; text.len() + 2];
        for _ in 0..2 {
            // SAFETY: text is valid for len bytes; toks is writable for its length.
            let n = unsafe {
                ffi::llama_tokenize(
                    self.vocab(),
                    text.as_ptr() as *const c_char,
                    len,
                    toks.as_mut_ptr(),
                    toks.len() as i32,
                    add_special,
                    parse_special,
                )
            };
            if n == i32::MIN {
                break;
            }
            if n >= 0 {
                toks.truncate(n as usize);
                return Ok(toks);
            }
            toks.resize((-n) as usize, 0);
        }
        Err(EngineError::Tokenize { len: text.len() })
    }

    fn check_token(&self, token: Token) -> Result<()> {
        let n_vocab = self.n_vocab();
        if token < 0 || token >= n_vocab {
            return Err(EngineError::TokenOutOfRange { token, n_vocab });
        }
        Ok(())
    }

    /// The bytes of one token (may be part of a UTF-8 character).
    pub fn token_to_bytes(&self, token: Token, special: bool) -> Result<Vec<u8>> {
        self.check_token(token)?;
        let mut buf = vec![0u8; 64];
        loop {
            // SAFETY: buf is writable for its length; token is in range.
            let n = unsafe {
                ffi::llama_token_to_piece(
                    self.vocab(),
                    token,
                    buf.as_mut_ptr() as *mut c_char,
                    buf.len() as i32,
                    0,
                    special,
                )
            };
            if n >= 0 {
                buf.truncate(n as usize);
                return Ok(buf);
            }
            buf.resize((-n) as usize, 0);
        }
    }

    /// Turn tokens back into text.
    pub fn detokenize(&self, tokens: &[Token], remove_special: bool, unparse_special: bool) -> Result<String> {
        for &t in tokens {
            self.check_token(t)?;
        }
        let mut buf = vec![0u8; tokens.len() * 8 + 16];
        loop {
            // SAFETY: tokens and buf are valid for their lengths.
            let n = unsafe {
                ffi::llama_detokenize(
                    self.vocab(),
                    tokens.as_ptr(),
                    tokens.len() as i32,
                    buf.as_mut_ptr() as *mut c_char,
                    buf.len() as i32,
                    remove_special,
                    unparse_special,
                )
            };
            if n >= 0 {
                buf.truncate(n as usize);
                return Ok(String::from_utf8_lossy(&buf).into_owned());
            }
            buf.resize((-n) as usize, 0);
        }
    }

    /// The model's own chat template (the default one when `name` is None).
    /// Render `messages` with the model's own chat template through
    /// llama.cpp's `common` (what its server renders with: Jinja, with
    /// upstream's fixes for known templates), ending with the assistant's
    /// turn when `add_assistant` is set.
    pub fn apply_common_chat_template(&self, messages: &[ChatMessage], add_assistant: bool) -> Result<String> {
        let owned: Vec<(CString, CString)> = messages
            .iter()
            .map(|m| Ok((CString::new(m.role.as_str())?, CString::new(m.content.as_str())?)))
            .collect::<std::result::Result<_, std::ffi::NulError>>()
            .map_err(|_| EngineError::NulInText)?;
        let roles: Vec<*const c_char> = owned.iter().map(|(r, _)| r.as_ptr()).collect();
        let contents: Vec<*const c_char> = owned.iter().map(|(_, c)| c.as_ptr()).collect();
        let mut error: *mut c_char = std::ptr::null_mut();
        // SAFETY: the model is valid; roles and contents hold n NUL-terminated
        // strings that outlive the call; error receives a string or NULL.
        let prompt = unsafe {
            ffi::pipeshard_chat_apply(
                self.ptr.as_ptr(),
                roles.as_ptr(),
                contents.as_ptr(),
                owned.len(),
                add_assistant,
                &mut error,
            )
        };
        let take = |p: *mut c_char| {
            // SAFETY: p came from the shim's strdup and is freed once, here.
            unsafe {
                let s = CStr::from_ptr(p).to_string_lossy().into_owned();
                ffi::pipeshard_string_free(p);
                s
            }
        };
        if prompt.is_null() {
            let why = if error.is_null() { String::new() } else { take(error) };
            tracing::warn!("common's chat template: {why}");
            return Err(EngineError::ChatTemplate);
        }
        Ok(take(prompt))
    }

    pub fn chat_template(&self, name: Option<&str>) -> Option<String> {
        let name = name.and_then(|n| CString::new(n).ok());
        // SAFETY: name is NULL or NUL-terminated; the returned string lives as long as the model.
        let p = unsafe {
            ffi::llama_model_chat_template(
                self.ptr.as_ptr(),
                name.as_ref().map_or(std::ptr::null(), |n| n.as_ptr()),
            )
        };
        if p.is_null() {
            None
        } else {
            // SAFETY: non-null, NUL-terminated.
            Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        }
    }

    /// Bytes the named weight tensor takes on `buft`, padding included.
    pub fn tensor_alloc_size(&self, name: &str, buft: BufferType) -> Option<u64> {
        let name = CString::new(name).ok()?;
        // SAFETY: name is NUL-terminated and buft is a valid buffer type.
        let n = unsafe { ffi::llama_model_tensor_alloc_size(self.ptr.as_ptr(), name.as_ptr(), buft.0) };
        (n >= 0).then_some(n as u64)
    }
}

/// One message of a chat.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// Render a chat with llama.cpp's template engine (`llama_chat_apply_template`),
/// exactly as upstream does for built-in templates.
pub fn apply_chat_template(template: &str, messages: &[ChatMessage], add_assistant: bool) -> Result<String> {
    let tmpl = CString::new(template).map_err(|_| EngineError::NulInText)?;
    let owned: Vec<(CString, CString)> = messages
        .iter()
        .map(|m| Ok((CString::new(m.role.as_str())?, CString::new(m.content.as_str())?)))
        .collect::<std::result::Result<_, std::ffi::NulError>>()
        .map_err(|_| EngineError::NulInText)?;
    let msgs: Vec<ffi::llama_chat_message> = owned
        .iter()
        .map(|(r, c)| ffi::llama_chat_message {
            role: r.as_ptr(),
            content: c.as_ptr(),
        })
        .collect();
    let mut cap: usize = messages.iter().map(|m| m.content.len() + m.role.len()).sum::<usize>() * 2 + 256;
    loop {
        let mut buf = vec![0u8; cap];
        // SAFETY: all pointers are valid for the call; buf is writable for cap bytes.
        let n = unsafe {
            ffi::llama_chat_apply_template(
                tmpl.as_ptr(),
                msgs.as_ptr(),
                msgs.len(),
                add_assistant,
                buf.as_mut_ptr() as *mut c_char,
                cap.min(i32::MAX as usize) as i32,
            )
        };
        if n < 0 {
            return Err(EngineError::ChatTemplate);
        }
        let n = n as usize;
        if n <= cap {
            buf.truncate(n);
            return Ok(String::from_utf8_lossy(&buf).into_owned());
        }
        cap = n + 1;
    }
}
