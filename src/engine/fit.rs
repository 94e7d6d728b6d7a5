//! Upstream's fit (`common_fit_params`, llama.cpp's `--fit`): the layers and
//! tensor buffer overrides that make a model's projected device memory leave
//! a margin free on each GPU. pipeshard's benchmark runs it as upstream's
//! in-budget baseline.

use std::ffi::{CStr, CString};
use std::path::Path;

use super::{ffi, BufferType, ContextParams, EngineError, Result};

/// What the fit chose.
#[derive(Debug, Clone)]
pub struct Fitted {
    /// Layers on the GPU (`-ngl`).
    pub n_gpu_layers: i32,
    /// Tensors the fit moved to another buffer type (e.g. experts or parts of
    /// one layer's FFN to system memory), in the order it chose them.
    pub tensor_overrides: Vec<(String, BufferType)>,
}

/// Fit `model` with a context made from `cp` so that each GPU keeps `margin`
/// bytes free, as `llama-server --fit on --fit-target MARGIN` does. The file
/// is checked as [`super::Model::load`] checks it before llama.cpp reads it.
pub fn fit_params(model: &Path, cp: &ContextParams, margin: u64) -> Result<Fitted> {
    super::model::check_model_file(model)?;
    super::init(None)?;
    let c_path = CString::new(model.to_string_lossy().as_bytes()).map_err(|_| EngineError::NulInText)?;
    // SAFETY: default params are plain data; the sizes are constants.
    let (mut mp, mut c, n_devices, n_overrides) = unsafe {
        (
            ffi::llama_model_default_params(),
            ffi::llama_context_default_params(),
            ffi::llama_max_devices(),
            ffi::llama_max_tensor_buft_overrides(),
        )
    };
    // No offload policy or split callback is set here, so nothing needs to
    // outlive the call.
    let _callbacks = cp.write_c(&mut c);
    let mut margins = vec![margin as usize; n_devices];
    let mut overrides = vec![
        ffi::llama_model_tensor_buft_override {
            pattern: std::ptr::null(),
            buft: std::ptr::null_mut(),
        };
        n_overrides + 1
    ];
    // SAFETY: every pointer is valid for the call; `margins` has an entry per
    // device and `overrides` the entries the fit may write; the fit keeps no
    // pointer to them (it returns patterns that live as long as the process).
    let status = unsafe {
        ffi::pipeshard_fit_params(
            c_path.as_ptr(),
            &mut mp,
            &mut c,
            margins.as_mut_ptr(),
            overrides.as_mut_ptr(),
        )
    };
    if status != 0 {
        return Err(EngineError::InvalidArgument(format!(
            "llama.cpp's fit found no placement of {} that leaves {} MiB free on the GPU",
            model.display(),
            margin >> 20
        )));
    }
    let mut tensor_overrides = Vec::new();
    for o in overrides.iter().take_while(|o| !o.pattern.is_null()) {
        // SAFETY: the fit writes NUL-terminated static patterns.
        let pattern = unsafe { CStr::from_ptr(o.pattern) }.to_string_lossy().into_owned();
        tensor_overrides.push((pattern, BufferType(o.buft)));
    }
    Ok(Fitted {
        n_gpu_layers: mp.n_gpu_layers,
        tensor_overrides,
    })
}
