//! Vision-language input through llama.cpp's `libmtmd`: a multimodal
//! projector (`--mmproj`), decoded images, and evaluation of a prompt that
//! mixes text and images into a [`Context`].

use std::ffi::{CStr, CString};
use std::path::Path;
use std::ptr::NonNull;
use std::time::Instant;

use super::context::Context;
use super::error::{EngineError, Result};
use super::ffi;
use super::model::Model;

/// The text that stands for one image in a prompt (`<__media__>`).
pub fn media_marker() -> String {
    // SAFETY: returns a pointer to a static NUL-terminated string.
    unsafe { CStr::from_ptr(ffi::mtmd_default_marker()) }
        .to_string_lossy()
        .into_owned()
}

/// Something that lends the device around each image encode: the server's
/// text slots pause and free their compute memory between
/// [`EncodeGate::begin`] and [`EncodeGate::end`].
pub trait EncodeGate {
    /// Returns once the device is free for the encoder.
    fn begin(&self);
    /// The encoder is done with the device.
    fn end(&self);
}

/// Where and how the vision encoder runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VisionOptions {
    /// Run the encoder's ops on the GPU (`--mmproj-offload`).
    pub use_gpu: bool,
    /// Keep the encoder's weights in pinned host memory and stream them to
    /// the GPU for its ops (patch 0004); needs `use_gpu`.
    pub weights_on_host: bool,
    /// Device slots for the streamed weights.
    pub stream_slots: u32,
    /// Free the encoder's compute memory after each image, and the
    /// language context's before it, so the two peaks never coexist.
    pub separate_peaks: bool,
    /// CPU threads.
    pub threads: i32,
    /// Most tokens one image becomes (upstream's `--image-max-tokens`):
    /// larger images are scaled down to it. None: the projector's own.
    pub image_max_tokens: Option<u32>,
    /// Window attention (Qwen2.5-VL's encoder) in chunks of whole windows
    /// of at most this many patches, each with its own mask (patch 0021);
    /// 0: one mask of n_patches², as upstream.
    pub window_attn_max_tokens: u32,
}

impl VisionOptions {
    /// Upstream's behaviour: the whole encoder on the GPU (or on the CPU).
    pub fn upstream(use_gpu: bool, threads: i32) -> Self {
        VisionOptions {
            use_gpu,
            weights_on_host: false,
            stream_slots: 0,
            separate_peaks: false,
            threads,
            image_max_tokens: None,
            window_attn_max_tokens: 0,
        }
    }

    /// The streaming slots of [`VisionOptions::budgeted`].
    pub const BUDGETED_STREAM_SLOTS: u32 = 4;

    /// The window-attention chunk of [`VisionOptions::budgeted`]: the
    /// one mask of Qwen2.5-VL's encoder takes up to 8 bytes per pair of
    /// patches (2 GiB of the 2.12 GiB reserved for its largest image,
    /// 16,384 patches); in chunks of 2,048 patches the masks take 1/8 of
    /// that at most.
    pub const BUDGETED_WINDOW_ATTN_MAX_TOKENS: u32 = 2048;

    /// pipeshard's: encoder weights in pinned host memory, streamed to the
    /// GPU through patch 0003's slots overlapped with the encoder's compute,
    /// and the encoder's and the language model's compute peaks kept apart.
    ///
    /// On the H200 the streamed encoder's embeddings equal the full-GPU
    /// encoder's (max |diff| 0 at 480p and 1080p with 0, 1 and 4 slots),
    /// and 4 slots encode faster than synchronous copies (1440p: 2.40 s
    /// against 2.61 s); CHANGELOG.md, session 4.
    pub fn budgeted(threads: i32) -> Self {
        VisionOptions {
            use_gpu: true,
            weights_on_host: true,
            stream_slots: Self::BUDGETED_STREAM_SLOTS,
            separate_peaks: true,
            threads,
            image_max_tokens: None,
            window_attn_max_tokens: Self::BUDGETED_WINDOW_ATTN_MAX_TOKENS,
        }
    }
}

/// A multimodal projector bound to a language model.
pub struct VisionProjector<'m> {
    ptr: NonNull<ffi::mtmd_context>,
    model: &'m Model,
    opts: VisionOptions,
}

// SAFETY: an mtmd_context may move between threads; it is not shared (no
// Sync), and the model it points at is Sync.
unsafe impl Send for VisionProjector<'_> {}

impl Drop for VisionProjector<'_> {
    fn drop(&mut self) {
        // SAFETY: created by mtmd_init_from_file and freed once.
        unsafe { ffi::mtmd_free(self.ptr.as_ptr()) };
    }
}

/// Timings of one multimodal prompt evaluation.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct VisionEval {
    /// The position after the prompt, where generation continues.
    pub n_past: i32,
    /// Positions/tokens the prompt occupies in the KV cache.
    pub n_tokens: usize,
    /// Images evaluated.
    pub n_images: usize,
    /// Time spent encoding the images and decoding their embeddings (ms).
    pub encode_ms: f64,
    /// Time spent on the whole prompt, text included (ms).
    pub total_ms: f64,
}

impl<'m> VisionProjector<'m> {
    /// Load an mmproj GGUF for `model`. It fails (with llama.cpp's reason in
    /// the log) when the file is not a projector or does not match the model.
    pub fn load(model: &'m Model, mmproj: &Path, opts: VisionOptions) -> Result<Self> {
        let fail = |reason: &str| EngineError::ProjectorLoad {
            path: mmproj.to_path_buf(),
            reason: reason.to_string(),
        };
        if !mmproj.is_file() {
            return Err(fail("no such file"));
        }
        super::check_model_file(mmproj)?;
        let c_path = CString::new(mmproj.to_string_lossy().as_bytes()).map_err(|_| EngineError::NulInText)?;
        // SAFETY: default params are plain data.
        let mut p = unsafe { ffi::mtmd_context_params_default() };
        p.use_gpu = opts.use_gpu;
        p.n_threads = opts.threads.max(1);
        p.print_timings = false;
        p.warmup = false;
        if let Some(n) = opts.image_max_tokens {
            p.image_max_tokens = n.min(i32::MAX as u32) as i32;
        }
        p.window_attn_max_tokens = opts.window_attn_max_tokens.min(i32::MAX as u32) as i32;
        if opts.weights_on_host && opts.use_gpu {
            // Flash attention in the ViT at every resolution (the scheduler
            // runs it on the CPU where the GPU lacks it); AUTO would only
            // decide at the first encode, after the budget is set.
            p.flash_attn_type = ffi::LLAMA_FLASH_ATTN_TYPE_ENABLED;
            p.weights_on_host = true;
            p.n_stream_slots = opts.stream_slots as i32;
        }
        // SAFETY: c_path outlives the call; the model outlives the projector ('m).
        let raw = unsafe { ffi::mtmd_init_from_file(c_path.as_ptr(), model.as_ptr(), p) };
        let ptr = NonNull::new(raw).ok_or_else(|| {
            fail("llama.cpp rejected it (not a projector, or it does not match the model; see the log above)")
        })?;
        // SAFETY: valid context.
        if !unsafe { ffi::mtmd_support_vision(ptr.as_ptr()) } {
            // SAFETY: freed once here; `ptr` is not used afterwards.
            unsafe { ffi::mtmd_free(ptr.as_ptr()) };
            return Err(fail("the projector has no vision encoder"));
        }
        Ok(VisionProjector { ptr, model, opts })
    }

    /// Free the encoder's compute buffers and streaming slots until the
    /// next image (patch 0004).
    pub fn release_compute(&self) {
        // SAFETY: valid context, used by this thread only.
        unsafe { ffi::mtmd_release_compute(self.ptr.as_ptr()) };
    }

    /// Device bytes the encoder's compute needs for `image` (compute
    /// buffers and streaming slots, not weights): llama.cpp's no-alloc
    /// reservation of the real graph for that image after preprocessing.
    pub fn encode_device_bytes(&self, image: &Bitmap) -> Result<u64> {
        let chunks = self.tokenize(&media_marker(), std::slice::from_ref(image), false)?;
        Ok(chunks
            .iter()
            // SAFETY: valid chunks of a live list; the query allocates nothing.
            .map(|chunk| unsafe { ffi::mtmd_encode_chunk_device_size(self.ptr.as_ptr(), chunk) } as u64)
            .max()
            .unwrap_or(0))
    }

    /// The embeddings the encoder makes for `image` (tokens × the language
    /// model's input width), as the language model would receive them.
    pub fn image_embeddings(&self, image: &Bitmap) -> Result<Vec<f32>> {
        // SAFETY: valid model.
        let n_embd = unsafe { ffi::llama_model_n_embd_inp(self.model.as_ptr()) }.max(0) as usize;
        if n_embd == 0 {
            return Err(EngineError::VisionEval(
                "the language model's input width is unknown (a vocabulary-only load?)".into(),
            ));
        }
        let mut out = Vec::new();
        self.encode_image(image, |chunk| {
            // SAFETY: the last encode's output holds n_tokens × n_embd floats
            // until the next encode.
            unsafe {
                let n = ffi::mtmd_input_chunk_get_n_tokens(chunk) * n_embd;
                let p = ffi::mtmd_get_output_embd(self.ptr.as_ptr());
                if p.is_null() {
                    return Err(EngineError::VisionEval("the encoder produced no embeddings".into()));
                }
                out.extend_from_slice(std::slice::from_raw_parts(p, n));
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// Encode `image` once, keeping nothing (to measure what it takes).
    pub fn encode(&self, image: &Bitmap) -> Result<()> {
        self.encode_image(image, |_| Ok(()))
    }

    /// Encode each media chunk of `image`, calling `encoded` right after
    /// each, while its output is still there.
    fn encode_image(
        &self,
        image: &Bitmap,
        mut encoded: impl FnMut(*const ffi::mtmd_input_chunk) -> Result<()>,
    ) -> Result<()> {
        let chunks = self.tokenize(&media_marker(), std::slice::from_ref(image), false)?;
        for chunk in chunks.iter().filter(|&c| is_media(c)) {
            self.encode_chunk(chunk)?;
            encoded(chunk)?;
        }
        Ok(())
    }

    /// Encode one media chunk; with `separate_peaks`, free the encoder's
    /// compute memory right after.
    fn encode_chunk(&self, chunk: *const ffi::mtmd_input_chunk) -> Result<()> {
        // SAFETY: valid context and chunk, used by this thread only.
        let rc = unsafe { ffi::mtmd_encode_chunk(self.ptr.as_ptr(), chunk) };
        if self.opts.separate_peaks {
            self.release_compute();
        }
        if rc != 0 {
            return Err(EngineError::VisionEval(format!(
                "encoding the image failed with code {rc}"
            )));
        }
        Ok(())
    }

    fn tokenize(&self, text: &str, images: &[Bitmap], add_special: bool) -> Result<Chunks> {
        let c_text = CString::new(text).map_err(|_| EngineError::NulInText)?;
        let input = ffi::mtmd_input_text {
            text: c_text.as_ptr(),
            text_len: text.len(),
            add_special,
            parse_special: true,
        };
        let chunks = Chunks::new()?;
        let bitmaps: Vec<*const ffi::mtmd_bitmap> = images.iter().map(|b| b.ptr.as_ptr() as *const _).collect();
        // SAFETY: every pointer is valid for the call; mtmd copies what it keeps.
        let rc = unsafe {
            ffi::mtmd_tokenize(
                self.ptr.as_ptr(),
                chunks.0.as_ptr(),
                &input,
                bitmaps.as_ptr(),
                bitmaps.len(),
            )
        };
        match rc {
            0 => Ok(chunks),
            1 => Err(EngineError::VisionEval(format!(
                "the prompt has a different number of media markers than the {} image(s) given",
                images.len()
            ))),
            2 => Err(EngineError::VisionEval("image preprocessing failed".into())),
            c => Err(EngineError::VisionEval(format!("mtmd_tokenize returned {c}"))),
        }
    }

    /// The language model this projector feeds.
    pub fn model(&self) -> &'m Model {
        self.model
    }

    /// Whether the model uses M-RoPE (positions differ from token counts).
    pub fn uses_mrope(&self) -> bool {
        // SAFETY: valid context.
        unsafe { ffi::mtmd_decode_use_mrope(self.ptr.as_ptr()) }
    }

    /// Tokenize `text` (with one [`media_marker`] per image) and evaluate it
    /// into sequence 0 of `ctx` from position `n_past`, keeping the last
    /// logits so that generation can continue at the returned position.
    pub fn eval_prompt(
        &self,
        ctx: &mut Context<'_>,
        text: &str,
        images: &[Bitmap],
        n_past: i32,
        add_special: bool,
        gate: Option<&dyn EncodeGate>,
    ) -> Result<VisionEval> {
        let t0 = Instant::now();
        let chunks = self.tokenize(text, images, add_special)?;
        let n_chunks = chunks.iter().count();
        // SAFETY: valid chunk list.
        let (n_pos, n_tokens) = unsafe {
            (
                ffi::mtmd_helper_get_n_pos(chunks.0.as_ptr()),
                ffi::mtmd_helper_get_n_tokens(chunks.0.as_ptr()),
            )
        };
        let n_ctx = ctx.n_ctx();
        if n_past as usize + n_tokens.max(n_pos as usize) >= n_ctx as usize {
            return Err(EngineError::ContextOverflow {
                n_tokens: n_past as usize + n_tokens,
                n_ctx,
            });
        }
        let mut pos = n_past;
        let mut encode_ms = 0.0;
        let n_batch = ctx.n_batch() as i32;
        for (i, chunk) in chunks.iter().enumerate() {
            let mut new_pos = pos;
            if is_media(chunk) {
                encode_ms += self.eval_image(ctx, chunk, (pos, n_batch), &mut new_pos, i, gate)?;
                pos = new_pos;
                continue;
            }
            // SAFETY: both contexts are valid and used by this thread only;
            // new_pos is a valid out pointer.
            let rc = unsafe {
                ffi::mtmd_helper_eval_chunk_single(
                    self.ptr.as_ptr(),
                    ctx.as_ptr(),
                    chunk,
                    pos,
                    0,
                    n_batch,
                    i + 1 == n_chunks,
                    &mut new_pos,
                )
            };
            if rc != 0 {
                return Err(EngineError::VisionEval(format!(
                    "decoding text chunk {i} failed with code {rc}"
                )));
            }
            pos = new_pos;
        }
        Ok(VisionEval {
            n_past: pos,
            n_tokens,
            n_images: images.len(),
            encode_ms,
            total_ms: t0.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// Encode an image chunk and decode its embeddings into `ctx`. With
    /// `separate_peaks`, the language context holds no compute memory while
    /// the encoder runs, and the encoder frees its own before the
    /// embeddings are decoded: the two peaks never coexist. Returns the
    /// encode time in ms.
    fn eval_image(
        &self,
        ctx: &mut Context<'_>,
        chunk: *const ffi::mtmd_input_chunk,
        (pos, n_batch): (i32, i32),
        new_pos: &mut i32,
        index: usize,
        gate: Option<&dyn EncodeGate>,
    ) -> Result<f64> {
        let t = Instant::now();
        if let Some(g) = gate {
            g.begin();
        }
        if self.opts.separate_peaks {
            ctx.release_compute();
        }
        let encoded = self.encode_chunk(chunk);
        if let Some(g) = gate {
            g.end();
        }
        encoded.map_err(|e| EngineError::VisionEval(format!("image chunk {index}: {e}")))?;
        let encode_ms = t.elapsed().as_secs_f64() * 1e3;
        // SAFETY: the embeddings of the last encode live in the mtmd
        // context until the next encode; new_pos is a valid out pointer.
        let rc = unsafe {
            let embd = ffi::mtmd_get_output_embd(self.ptr.as_ptr());
            ffi::mtmd_helper_decode_image_chunk(
                self.ptr.as_ptr(),
                ctx.as_ptr(),
                chunk,
                embd,
                pos,
                0,
                n_batch,
                new_pos,
                None,
                std::ptr::null_mut(),
            )
        };
        if rc != 0 {
            return Err(EngineError::VisionEval(format!(
                "decoding the embeddings of image chunk {index} failed with code {rc}"
            )));
        }
        Ok(encode_ms)
    }

    pub(crate) fn as_ptr(&self) -> *mut ffi::mtmd_context {
        self.ptr.as_ptr()
    }
}

/// The image an encoder peak is measured for.
#[derive(Debug, Clone)]
pub enum PeakImage {
    /// This image file.
    File(std::path::PathBuf),
    /// The largest image the projector takes: huge blank ones of a few
    /// aspect ratios, which its preprocessing scales down to the
    /// projector's maximum (or to [`VisionOptions::image_max_tokens`]); the
    /// one that needs the most device memory.
    Largest,
}

/// What the vision encoder needs on the device for one image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncoderPeak {
    /// Compute buffers and streaming slots, from llama.cpp's no-alloc
    /// reservation of the encoder's graph for the image.
    pub reserved: u64,
    /// Its weights on the device (0 when they stay on the host).
    pub weights: u64,
}

/// The vision encoder of `mmproj` with `opts`, for `image`, before the
/// language model is loaded: the projector is loaded against a
/// vocabulary-only load of `model` and its graph for the image reserved
/// without allocating. With `encode`, the image is then also encoded once,
/// so that a caller sampling device memory sees what the reservation does
/// not (the backend's pools and library workspaces).
pub fn encoder_peak(
    model: &Path,
    mmproj: &Path,
    opts: VisionOptions,
    image: &PeakImage,
    encode: bool,
) -> Result<EncoderPeak> {
    let params = super::ModelParams {
        vocab_only: true,
        ..Default::default()
    };
    let vocab = Model::load(model, params)?;
    let proj = VisionProjector::load(&vocab, mmproj, opts)?;
    let (bitmap, reserved) = match image {
        PeakImage::File(path) => {
            let bitmap = Bitmap::from_file(&proj, path)?;
            let reserved = proj.encode_device_bytes(&bitmap)?;
            (bitmap, reserved)
        }
        // Preprocessing scales a large image down to the most tokens the
        // projector takes, keeping its aspect ratio and whole patches, so a
        // square image may round to fewer tokens than a wide one (under
        // 2,700 tokens: 51 x 51 = 2,601 against 69 x 39 = 2,691 for
        // 1080p). The largest reservation of a few shapes is the peak.
        PeakImage::Largest => {
            let mut best: Option<(Bitmap, u64)> = None;
            for (w, h) in [(4096, 4096), (4096, 2304), (2304, 4096), (4096, 3072), (3072, 4096)] {
                let bitmap = Bitmap::blank(w, h)?;
                let reserved = proj.encode_device_bytes(&bitmap)?;
                if best.as_ref().map_or(true, |(_, r)| reserved > *r) {
                    best = Some((bitmap, reserved));
                }
            }
            best.expect("at least one shape")
        }
    };
    if encode {
        proj.encode(&bitmap)?;
    }
    let weights = if opts.use_gpu && !opts.weights_on_host {
        crate::gguf::GgufFile::open(mmproj)
            .map(|f| f.tensors().iter().map(|t| t.nbytes).sum::<u64>())
            .unwrap_or(0)
    } else {
        0
    };
    Ok(EncoderPeak { reserved, weights })
}

/// An owned `mtmd_input_chunks` list.
struct Chunks(NonNull<ffi::mtmd_input_chunks>);

/// Whether a chunk holds an image (or audio) rather than text.
fn is_media(chunk: *const ffi::mtmd_input_chunk) -> bool {
    // SAFETY: callers pass chunks of a live list (`Chunks::iter`).
    unsafe { ffi::mtmd_input_chunk_get_type(chunk) != ffi::MTMD_INPUT_CHUNK_TYPE_TEXT }
}

impl Chunks {
    /// The chunks, in order; each lives as long as the list.
    fn iter(&self) -> impl Iterator<Item = *const ffi::mtmd_input_chunk> + '_ {
        // SAFETY: valid list.
        let n = unsafe { ffi::mtmd_input_chunks_size(self.0.as_ptr()) };
        // SAFETY: i < n.
        (0..n).map(move |i| unsafe { ffi::mtmd_input_chunks_get(self.0.as_ptr(), i) })
    }

    fn new() -> Result<Self> {
        // SAFETY: plain allocation.
        NonNull::new(unsafe { ffi::mtmd_input_chunks_init() })
            .map(Chunks)
            .ok_or_else(|| EngineError::VisionEval("cannot allocate input chunks".into()))
    }
}

impl Drop for Chunks {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`, freed once.
        unsafe { ffi::mtmd_input_chunks_free(self.0.as_ptr()) };
    }
}

/// A decoded image (RGB), ready for [`VisionProjector::eval_prompt`].
pub struct Bitmap {
    ptr: NonNull<ffi::mtmd_bitmap>,
}

// SAFETY: a bitmap is plain owned pixel data.
unsafe impl Send for Bitmap {}

impl Drop for Bitmap {
    fn drop(&mut self) {
        // SAFETY: created by an mtmd init function and freed once.
        unsafe { ffi::mtmd_bitmap_free(self.ptr.as_ptr()) };
    }
}

impl Bitmap {
    /// A black RGB image of `width × height` pixels.
    pub fn blank(width: u32, height: u32) -> Result<Bitmap> {
        Self::from_rgb(width, height, &vec![0u8; width as usize * height as usize * 3])
    }

    /// An RGB image of `width × height` pixels from its bytes, row by row.
    pub fn from_rgb(width: u32, height: u32, rgb: &[u8]) -> Result<Bitmap> {
        let what = format!("{width}x{height} RGB image");
        if rgb.len() != width as usize * height as usize * 3 {
            return Err(EngineError::Image {
                what,
                reason: format!("{} bytes, not 3 per pixel", rgb.len()),
            });
        }
        // SAFETY: rgb holds nx*ny*3 bytes (checked); mtmd copies them.
        let raw = unsafe { ffi::mtmd_bitmap_init(width, height, rgb.as_ptr()) };
        let ptr = NonNull::new(raw).ok_or_else(|| EngineError::Image {
            what,
            reason: "cannot allocate it".into(),
        })?;
        Ok(Bitmap { ptr })
    }

    /// Decode an image file (PNG, JPEG, BMP, GIF, ... as stb_image reads them).
    pub fn from_file(proj: &VisionProjector<'_>, path: &Path) -> Result<Bitmap> {
        let what = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| EngineError::Image {
            what: what.clone(),
            reason: e.to_string(),
        })?;
        Self::decode(proj, &bytes, what)
    }

    /// Decode an image held in memory (the bytes of an image file).
    pub fn from_bytes(proj: &VisionProjector<'_>, bytes: &[u8]) -> Result<Bitmap> {
        Self::decode(proj, bytes, format!("({} bytes)", bytes.len()))
    }

    fn decode(proj: &VisionProjector<'_>, bytes: &[u8], what: String) -> Result<Bitmap> {
        if bytes.is_empty() {
            return Err(EngineError::Image {
                what,
                reason: "the file is empty".into(),
            });
        }
        // SAFETY: plain data.
        let opt = unsafe { ffi::mtmd_helper_init_opt_default() };
        // SAFETY: bytes is valid for the call; the helper copies the pixels.
        let w =
            unsafe { ffi::mtmd_helper_bitmap_init_from_buf(proj.as_ptr(), bytes.as_ptr(), bytes.len(), false, opt) };
        if !w.video_ctx.is_null() {
            // SAFETY: returned by the helper; we do not take videos.
            unsafe { ffi::mtmd_helper_video_free(w.video_ctx) };
        }
        let ptr = NonNull::new(w.bitmap).ok_or_else(|| EngineError::Image {
            what: what.clone(),
            reason: "not a supported image format (PNG, JPEG, BMP, GIF, ...)".into(),
        })?;
        let bmp = Bitmap { ptr };
        // SAFETY: valid bitmap.
        if unsafe { ffi::mtmd_bitmap_is_audio(bmp.ptr.as_ptr()) } {
            return Err(EngineError::Image {
                what,
                reason: "this is audio, not an image".into(),
            });
        }
        Ok(bmp)
    }

    /// Width and height in pixels.
    pub fn size(&self) -> (u32, u32) {
        // SAFETY: valid bitmap.
        unsafe {
            (
                ffi::mtmd_bitmap_get_nx(self.ptr.as_ptr()),
                ffi::mtmd_bitmap_get_ny(self.ptr.as_ptr()),
            )
        }
    }
}
