//! The vision encoder's device memory, measured before the language model
//! loads, and how the encoder runs: one decision for every command.

use std::path::Path;

use super::{LaunchError, PipeshardOptions};
use crate::engine;
use crate::plan::fmt_bytes;

/// The vision encoder's device memory, as the planner budgets it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VisionMemory {
    /// Held only while an image is encoded (compute buffers and streaming
    /// slots, released after each image), plus weights on the device.
    pub peak: u64,
    /// Held from the first image on: the encoder backend's own pools and
    /// library workspaces, which no reservation sees and nothing frees.
    pub resident: u64,
}

/// The device memory the vision encoder of `mmproj` needs for `image` with
/// `opts`, before the language model is loaded: llama.cpp's no-alloc
/// reservation of the encoder's graph, and the device memory measured while
/// the image is encoded once; what the measurement finds beyond the
/// reservation stays allocated afterwards.
pub fn vision_memory(
    model: &Path,
    mmproj: &Path,
    opts: engine::VisionOptions,
    image: &engine::PeakImage,
) -> Result<VisionMemory, LaunchError> {
    let gpu = engine::first_device(engine::DeviceKind::Gpu).map(|d| d.index);
    let sampler = engine::MemorySampler::start(gpu, Vec::new());
    let peak = engine::encoder_peak(model, mmproj, opts, image, gpu.is_some() && opts.use_gpu)?;
    let measured = sampler.stop().growth();
    let reserved = peak.reserved + peak.weights;
    tracing::info!(
        "vision encoder: {} reserved, {} measured while encoding",
        fmt_bytes(reserved),
        fmt_bytes(measured)
    );
    Ok(VisionMemory {
        peak: reserved,
        resident: measured.saturating_sub(reserved),
    })
}

/// The device memory of the vision encoder of `mmproj` run with `opts`,
/// when the plan must budget it: with `measure` (a budget, not a saved
/// plan) and pipeshard's encoder (weights on the host, peaks kept apart),
/// it is measured for `image`; None otherwise, where the encoder runs as
/// upstream's does and the plan leaves it alone.
pub fn vision_setup(
    model: &Path,
    mmproj: Option<&Path>,
    opts: engine::VisionOptions,
    measure: bool,
    image: &engine::PeakImage,
) -> Result<Option<VisionMemory>, LaunchError> {
    match mmproj {
        Some(mm) if opts.weights_on_host && opts.separate_peaks && measure => {
            Ok(Some(vision_memory(model, mm, opts, image)?))
        }
        _ => Ok(None),
    }
}

/// How the vision encoder runs. With a plan (a budget or a saved plan) on a
/// GPU, and the encoder allowed on the GPU, it is pipeshard's: weights in
/// host memory streamed through `--vision-stream-slots` slots, flash
/// attention, its peak kept apart from the language model's, window
/// attention in chunks of whole windows (not in the exact mode: attention
/// over fewer keys may round differently); otherwise it runs as upstream's
/// does (on the GPU unless `gpu` is false).
pub fn vision_options(options: &PipeshardOptions, gpu: bool, threads: i32) -> engine::VisionOptions {
    if options.is_set() && engine::has_gpu() && gpu {
        let budgeted = engine::VisionOptions::budgeted(threads);
        engine::VisionOptions {
            stream_slots: options.vision_stream_slots,
            window_attn_max_tokens: if options.exact {
                0
            } else {
                budgeted.window_attn_max_tokens
            },
            ..budgeted
        }
    } else {
        engine::VisionOptions::upstream(gpu, threads)
    }
}
