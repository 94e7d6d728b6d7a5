//! Image input for `/v1/chat/completions` (with `--mmproj`). Vision requests
//! are served one at a time by their own worker thread, which owns a
//! one-sequence context of the slot size and the multimodal projector;
//! text requests keep going through the continuous-batching
//! [`scheduler`](super::scheduler), which pauses and frees its compute
//! memory only while an image is encoded ([`DeviceGate`]). (Batching images
//! into the slot scheduler is left for later.)

use std::path::Path;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::engine::{Bitmap, Context, ContextParams, EngineError, Model, VisionOptions, VisionProjector};
use crate::generate::{generate_from, EvaluatedPrompt, StopReason};

use super::device_gate::DeviceGate;
use super::error::ApiError;
use super::task::{Event, Final, GenParams, StopType};
use super::worker::WorkerThread;

/// One vision request: a rendered prompt with one media marker per image.
struct VisionJob {
    prompt: String,
    images: Vec<Vec<u8>>,
    params: GenParams,
    events: UnboundedSender<Event>,
}

/// The handle requests use to reach the vision worker.
#[derive(Clone)]
pub struct VisionHandle {
    worker: Arc<WorkerThread<VisionJob>>,
    /// Context of the vision worker, in tokens.
    pub n_ctx: u32,
    /// Where `image_url` may read local files (`--media-dir`).
    pub media_dir: Option<std::path::PathBuf>,
}

impl VisionHandle {
    /// Load the projector and start the worker; fails when the projector
    /// cannot be loaded for this model. `media_dir` is where `image_url`
    /// may read local files (`--media-dir`).
    pub fn spawn(
        model: Arc<Model>,
        mmproj: &Path,
        media_dir: Option<std::path::PathBuf>,
        opts: VisionOptions,
        params: ContextParams,
        gate: Arc<DeviceGate>,
    ) -> Result<Self, EngineError> {
        let mmproj = mmproj.to_path_buf();
        let (worker, n_ctx) = WorkerThread::start(
            "the vision worker",
            "pipeshard-vision",
            move |startup, rx: Receiver<VisionJob>| {
                let setup = VisionProjector::load(&model, &mmproj, opts)
                    .and_then(|p| Context::new(&model, params).map(|c| (p, c)));
                let Some((proj, mut ctx)) = startup.check(setup) else {
                    return;
                };
                startup.ready(ctx.n_ctx());
                while let Ok(job) = rx.recv() {
                    if job.events.is_closed() {
                        continue;
                    }
                    if let Err(e) = run_job(&proj, &mut ctx, &job, &gate) {
                        tracing::warn!("vision request failed: {e}");
                        let _ = job.events.send(Event::Error(match e {
                            EngineError::ContextOverflow { n_tokens, n_ctx } => {
                                ApiError::context_exceeded(n_tokens, n_ctx)
                            }
                            e => ApiError::internal(e.to_string()),
                        }));
                    }
                }
            },
        )?;
        Ok(VisionHandle {
            worker: Arc::new(worker),
            n_ctx,
            media_dir,
        })
    }

    /// Queue a request; events come back on the receiver (dropping it
    /// cancels the request).
    pub fn submit(
        &self,
        prompt: String,
        images: Vec<Vec<u8>>,
        params: GenParams,
    ) -> Result<UnboundedReceiver<Event>, ApiError> {
        let (events, rx) = unbounded_channel();
        self.worker
            .send(VisionJob {
                prompt,
                images,
                params,
                events,
            })
            .map_err(|_| ApiError::internal("the vision worker has stopped"))?;
        Ok(rx)
    }
}

fn run_job(
    proj: &VisionProjector<'_>,
    ctx: &mut Context<'_>,
    job: &VisionJob,
    gate: &DeviceGate,
) -> Result<(), EngineError> {
    let model = proj.model();
    let bitmaps = job
        .images
        .iter()
        .map(|b| Bitmap::from_bytes(proj, b))
        .collect::<Result<Vec<_>, _>>()?;
    ctx.clear();
    let started = Instant::now();
    let ev = proj.eval_prompt(ctx, &job.prompt, &bitmaps, 0, model.add_bos(), Some(gate))?;
    tracing::info!(
        "vision prompt: {} image(s) encoded in {:.1} ms, {} positions in {:.1} ms",
        ev.n_images,
        ev.encode_ms,
        ev.n_past,
        ev.total_ms
    );
    let n_predict = if job.params.n_predict < 0 {
        usize::MAX
    } else {
        job.params.n_predict as usize
    };
    let events = &job.events;
    let out = generate_from(
        ctx,
        EvaluatedPrompt {
            n_past: ev.n_past,
            n_tokens: ev.n_tokens,
            started,
        },
        n_predict,
        &job.params.sampling,
        &job.params.stop,
        |piece| {
            events
                .send(Event::Chunk {
                    text: piece.to_string(),
                    tokens: Vec::new(),
                    probs: Vec::new(),
                })
                .is_ok()
        },
    )?;
    let s = &out.stats;
    let stop_type = match s.stop {
        StopReason::Eos | StopReason::Cancelled => StopType::Eos,
        StopReason::StopString => StopType::Word,
        StopReason::Length | StopReason::ContextFull => StopType::Limit,
    };
    let _ = events.send(Event::Done(Final {
        id_slot: 0,
        stop_type,
        stopping_word: String::new(),
        n_prompt: s.prompt_tokens,
        n_cached: 0,
        n_predicted: s.generated_tokens,
        prompt_ms: s.ttft_ms,
        predicted_ms: s.decode_ms,
    }));
    Ok(())
}

/// Whether `bytes` start like an image file stb_image can read.
pub fn looks_like_image(bytes: &[u8]) -> bool {
    bytes.starts_with(b"\x89PNG\r\n\x1a\n")
        || bytes.starts_with(&[0xff, 0xd8, 0xff])
        || bytes.starts_with(b"GIF8")
        || bytes.starts_with(b"BM")
        || (bytes.len() > 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP")
}

/// Decode standard base64 (padding optional, whitespace ignored).
pub fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        } as u32)
    };
    let clean: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    let body = clean
        .strip_suffix(b"==")
        .or_else(|| clean.strip_suffix(b"="))
        .unwrap_or(&clean);
    let mut out = Vec::with_capacity(body.len() * 3 / 4);
    for chunk in body.chunks(4) {
        if chunk.len() == 1 {
            return None;
        }
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= val(c)? << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Some(out)
}

/// The bytes of an `image_url` part: a `data:` URI, or a `file://` URL or
/// local path inside `media_dir` (local files are refused without one, so
/// that clients cannot make the server read arbitrary files). Remote URLs
/// are refused.
pub fn image_bytes(url: &str, media_dir: Option<&std::path::Path>) -> Result<Vec<u8>, ApiError> {
    let bytes = if let Some(rest) = url.strip_prefix("data:") {
        let (meta, data) = rest
            .split_once(',')
            .ok_or_else(|| ApiError::bad_request("malformed data URI in image_url"))?;
        if !meta.ends_with(";base64") {
            return Err(ApiError::bad_request("image data URIs must be base64-encoded"));
        }
        base64_decode(data).ok_or_else(|| ApiError::bad_request("invalid base64 in the image data URI"))?
    } else if url.starts_with("http://") || url.starts_with("https://") {
        return Err(ApiError::bad_request(
            "remote image URLs are not supported; send the image as a data URI",
        ));
    } else {
        let Some(dir) = media_dir else {
            return Err(ApiError::bad_request(
                "local image files are only served from the directory given with --media-dir; send a data URI",
            ));
        };
        let path = url.strip_prefix("file://").unwrap_or(url);
        let path = dir.join(path);
        let inside = match (path.canonicalize(), dir.canonicalize()) {
            (Ok(p), Ok(d)) => p.starts_with(&d).then_some(p),
            _ => None,
        };
        let path = inside.ok_or_else(|| ApiError::bad_request(format!("no image {url} under --media-dir")))?;
        std::fs::read(&path).map_err(|e| ApiError::bad_request(format!("cannot read the image {url}: {e}")))?
    };
    if !looks_like_image(&bytes) {
        return Err(ApiError::bad_request(
            "image_url does not hold a supported image (PNG, JPEG, GIF, BMP, WebP)",
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips() {
        assert_eq!(base64_decode("Zm9vYmFy").unwrap(), b"foobar");
        assert_eq!(base64_decode("Zm8=").unwrap(), b"fo");
        assert_eq!(base64_decode("Zg==").unwrap(), b"f");
        assert_eq!(base64_decode("").unwrap(), b"");
        assert!(base64_decode("Z").is_none());
        assert!(base64_decode("Zm9v!mFy").is_none());
    }

    #[test]
    fn image_urls() {
        assert!(image_bytes("https://example.com/a.png", None).is_err());
        assert!(image_bytes("/etc/passwd", None).is_err());
        assert!(image_bytes("../../etc/passwd", Some(std::path::Path::new("/tmp"))).is_err());
        assert!(image_bytes("data:image/png;base64,Zm9v", None).is_err());
        assert!(image_bytes("data:image/png;base64,iVBORw0KGgo=", None).is_ok());
    }
}
