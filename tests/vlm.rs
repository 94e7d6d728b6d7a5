//! Vision-language input end to end on a tiny synthetic VLM
//! (`tiny-qwen2.5-vl-7b` with its mmproj): `pipeshard run --mmproj --image`
//! and `pipeshard-server --mmproj` with an `image_url` data URI.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use common::server::{free_port, Server};
use serde_json::{json, Value};

const RUN: &str = env!("CARGO_BIN_EXE_pipeshard");
const SERVER: &str = env!("CARGO_BIN_EXE_pipeshard-server");

/// (language model, mmproj, PNG image, scratch dir), written once.
fn fixtures() -> &'static (PathBuf, PathBuf, PathBuf, PathBuf) {
    static F: OnceLock<(PathBuf, PathBuf, PathBuf, PathBuf)> = OnceLock::new();
    F.get_or_init(|| {
        let dir = common::scratch_dir("vlm");
        let model = dir.join("vl.gguf");
        let mmproj = dir.join("mmproj.gguf");
        let mut opts = pipeshard_devtools::synth::SynthOptions::new(
            "tiny-qwen2.5-vl-7b",
            pipeshard_devtools::synth::Quant::Q4_0,
            &model,
        );
        opts.mmproj_output = Some(mmproj.clone());
        opts.threads = 2;
        pipeshard_devtools::synth::synth(&opts, |_, _| {}).expect("synth tiny-qwen2.5-vl-7b");
        let png = dir.join("gradient.png");
        std::fs::write(&png, gradient_png(64, 48)).unwrap();
        (model, mmproj, png, dir)
    })
}

fn crc32(data: &[u8]) -> u32 {
    let mut c = 0xffff_ffffu32;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 { 0xedb8_8320 ^ (c >> 1) } else { c >> 1 };
        }
    }
    !c
}

fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for &x in data {
        a = (a + u32::from(x)) % 65521;
        b = (b + a) % 65521;
    }
    (b << 16) | a
}

/// A w×h RGB gradient as a PNG (zlib with stored blocks).
fn gradient_png(w: u32, h: u32) -> Vec<u8> {
    let mut raw = Vec::new();
    for y in 0..h {
        raw.push(0); // filter: none
        for x in 0..w {
            raw.extend_from_slice(&[(x * 255 / w) as u8, (y * 255 / h) as u8, 128]);
        }
    }
    let mut z = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = raw.chunks(65535).collect();
    for (i, blk) in blocks.iter().enumerate() {
        z.push(u8::from(i + 1 == blocks.len()));
        let n = blk.len() as u16;
        z.extend_from_slice(&n.to_le_bytes());
        z.extend_from_slice(&(!n).to_le_bytes());
        z.extend_from_slice(blk);
    }
    z.extend_from_slice(&adler32(&raw).to_be_bytes());
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut chunk = |ty: &[u8], data: &[u8]| {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let mut td = ty.to_vec();
        td.extend_from_slice(data);
        out.extend_from_slice(&td);
        out.extend_from_slice(&crc32(&td).to_be_bytes());
    };
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(b"IHDR", &ihdr);
    chunk(b"IDAT", &z);
    chunk(b"IEND", &[]);
    out
}

fn base64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n =
            (u32::from(c[0]) << 16) | (u32::from(*c.get(1).unwrap_or(&0)) << 8) | u32::from(*c.get(2).unwrap_or(&0));
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            out.push(if i <= c.len() {
                T[((n >> shift) & 63) as usize] as char
            } else {
                '='
            });
        }
    }
    out
}

fn run(model: &Path, mmproj: &Path, image: &Path) -> Output {
    Command::new(RUN)
        .args(["run", "-m"])
        .arg(model)
        .arg("--mmproj")
        .arg(mmproj)
        .arg("--image")
        .arg(image)
        .args([
            "-p",
            "What is in the picture?",
            "-n",
            "8",
            "-c",
            "1024",
            "-t",
            "2",
            "-ngl",
            "0",
        ])
        .output()
        .expect("running pipeshard")
}

#[test]
fn run_with_an_image_encodes_and_generates() {
    let (model, mmproj, png, _) = fixtures();
    let out = run(model, mmproj, png);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pipeshard run failed:\n{err}");
    assert!(err.contains("image:    encoded in"), "no encode time:\n{err}");
    let decode = err.lines().find(|l| l.starts_with("decode:")).expect("a decode line");
    let n: usize = decode.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap();
    assert!(n > 0, "no tokens generated: {decode}");
    // The prompt holds the image's positions, not only the text's.
    let prompt = err.lines().find(|l| l.starts_with("prompt:")).expect("a prompt line");
    let n_prompt: usize = prompt.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap();
    assert!(n_prompt > 20, "image tokens missing from the prompt: {prompt}");
}

#[test]
fn bad_images_and_flags_fail_cleanly() {
    let (model, mmproj, _, dir) = fixtures();
    let not_image = dir.join("not-an-image.png");
    std::fs::write(&not_image, b"this is plain text, not a PNG").unwrap();
    let out = run(model, mmproj, &not_image);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot read the image") && err.contains("not a supported image"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");

    let out = run(model, mmproj, &dir.join("missing.png"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("does not exist"), "{err}");

    // A language model is not a projector.
    let (_, _, png, _) = fixtures();
    let out = run(model, model, png);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("multimodal projector"), "{err}");

    // --image needs --mmproj.
    let out = Command::new(RUN)
        .args(["run", "-m"])
        .arg(model)
        .arg("--image")
        .arg(png)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--mmproj"));
}

fn serve(extra: &[&Path]) -> Server {
    serve_with_ctx(extra, 1024)
}

fn serve_with_ctx(extra: &[&Path], n_ctx: u32) -> Server {
    serve_with_args(extra, n_ctx, &[])
}

fn serve_with_args(extra: &[&Path], n_ctx: u32, args: &[&std::ffi::OsStr]) -> Server {
    let (model, _, _, dir) = fixtures();
    let port = free_port();
    let mut cmd = Command::new(SERVER);
    cmd.arg("-m").arg(model);
    if let Some(mm) = extra.first() {
        cmd.arg("--mmproj").arg(mm);
    }
    cmd.args(args);
    cmd.args([
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "-c",
        &n_ctx.to_string(),
        "-t",
        "2",
        "-ngl",
        "0",
    ]);
    let mut s = Server::start(cmd, port, dir.join(format!("server-{port}.log")));
    s.wait_healthy(|_| {});
    s
}

fn chat_with_image(s: &Server) -> (u16, Value) {
    let (_, _, png, _) = fixtures();
    let uri = format!("data:image/png;base64,{}", base64(&std::fs::read(png).unwrap()));
    let body = json!({
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Describe the image."},
            {"type": "image_url", "image_url": {"url": uri}},
        ]}],
        "max_tokens": 8, "temperature": 0,
    });
    let res = ureq::post(&format!("{}/v1/chat/completions", s.base))
        .timeout(Duration::from_secs(120))
        .set("Content-Type", "application/json")
        .send_string(&body.to_string());
    let (code, text) = match res {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(c, r)) => (c, r.into_string().unwrap_or_default()),
        Err(e) => panic!("request failed: {e}"),
    };
    let v = serde_json::from_str(&text).unwrap_or_else(|_| Value::String(text.clone()));
    (code, v)
}

#[test]
fn server_answers_image_requests_only_with_mmproj() {
    let (_, mmproj, _, _) = fixtures();
    let s = serve(&[mmproj]);
    let (code, v) = chat_with_image(&s);
    assert_eq!(code, 200, "{v}");
    let choices = v["choices"].as_array().expect("choices");
    assert!(!choices.is_empty(), "{v}");
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap_or(0) > 0, "{v}");
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap_or(0) > 20, "{v}");
    // A broken data URI is the client's fault.
    let bad = json!({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,bm90IGFuIGltYWdl"}}]}]});
    let res = ureq::post(&format!("{}/v1/chat/completions", s.base))
        .set("Content-Type", "application/json")
        .send_string(&bad.to_string());
    assert!(matches!(res, Err(ureq::Error::Status(400, _))), "{res:?}");
    drop(s);

    // Without a projector: the client's mistake, a 400 that names the
    // missing --mmproj (upstream answers 500; patch 0009).
    let s = serve(&[]);
    let (code, v) = chat_with_image(&s);
    assert_eq!(code, 400, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap_or_default().contains("mmproj"),
        "{v}"
    );
}

/// An image prompt longer than the slot's context is the client's request
/// that cannot be served, a 400 as llama-server answers, not a 500.
#[test]
fn image_prompt_over_the_context_is_a_400() {
    let (_, mmproj, png, _) = fixtures();
    let s = serve_with_ctx(&[mmproj], 256);
    let uri = format!("data:image/png;base64,{}", base64(&std::fs::read(png).unwrap()));
    let body = json!({
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Describe the image. ".repeat(100)},
            {"type": "image_url", "image_url": {"url": uri}},
        ]}],
        "max_tokens": 8,
    });
    let res = ureq::post(&format!("{}/v1/chat/completions", s.base))
        .timeout(Duration::from_secs(120))
        .set("Content-Type", "application/json")
        .send_string(&body.to_string());
    let Err(ureq::Error::Status(code, r)) = res else {
        panic!("expected a 400, got {res:?}");
    };
    let v: Value = serde_json::from_str(&r.into_string().unwrap()).unwrap();
    assert_eq!(code, 400, "{v}");
    assert_eq!(v["error"]["type"], "exceed_context_size_error", "{v}");
}

/// Compute bytes a context holds, over every buffer type.
fn compute_bytes(ctx: &pipeshard::engine::Context<'_>) -> u64 {
    ctx.memory_breakdown().iter().map(|m| m.compute).sum()
}

/// Greedy tokens for the image prompt with `opts`, and the language
/// context's compute bytes right before the image was evaluated (after a
/// release, when the peaks are kept apart) and right after.
fn greedy_with(opts: pipeshard::engine::VisionOptions) -> (Vec<i32>, u64, u64) {
    use pipeshard::engine::{self, Bitmap, Context, VisionProjector};
    use pipeshard::generate::{generate_from, EvaluatedPrompt};
    let (model_path, mmproj, png, _) = fixtures();
    engine::init(None).unwrap();
    let model = engine::Model::load(model_path, engine::ModelParams::default()).unwrap();
    let mut ctx = Context::new(&model, common::small_context_params()).unwrap();
    // Reserve the language model's compute buffers with a text decode first.
    let warm = model.tokenize("hello", true, false).unwrap();
    ctx.decode_tokens(&warm, 0, true).unwrap();
    ctx.clear();
    let before = compute_bytes(&ctx);
    let proj = VisionProjector::load(&model, mmproj, opts).unwrap();
    let image = Bitmap::from_file(&proj, png).unwrap();
    let text = format!("{}\nWhat is this?", engine::media_marker());
    let ev = proj
        .eval_prompt(&mut ctx, &text, std::slice::from_ref(&image), 0, true, None)
        .unwrap();
    let after = compute_bytes(&ctx);
    let prompt = EvaluatedPrompt {
        n_past: ev.n_past,
        n_tokens: ev.n_tokens,
        started: std::time::Instant::now(),
    };
    let greedy = engine::SamplingParams {
        temperature: 0.0,
        ..Default::default()
    };
    let out = generate_from(&mut ctx, prompt, 12, &greedy, &[], |_| true).unwrap();
    (out.tokens, before, after)
}

/// Keeping the encoder's and the language model's peaks apart (compute
/// released before and after each encode, weights on the host where there
/// is a GPU) changes no token, and the released compute is reserved again.
/// On a machine without a GPU, the encoder needs no device memory.
#[test]
fn separate_peaks_are_lossless_and_release_compute() {
    use pipeshard::engine::{self, Context, VisionOptions};
    let (upstream, before_up, after_up) = greedy_with(VisionOptions::upstream(false, 2));
    let (apart, before_apart, after_apart) = greedy_with(VisionOptions::budgeted(2));
    assert_eq!(upstream.len(), 12);
    assert_eq!(upstream, apart, "the same greedy tokens");
    assert!(before_up > 0 && after_up > 0 && before_apart > 0 && after_apart > 0);

    // A release frees the context's compute; the next decode reserves it again.
    let (model_path, mmproj, png, _) = fixtures();
    let model = engine::Model::load(model_path, engine::ModelParams::default()).unwrap();
    let mut ctx = Context::new(&model, common::small_context_params()).unwrap();
    let toks = model.tokenize("hello there", true, false).unwrap();
    ctx.decode_tokens(&toks, 0, true).unwrap();
    assert!(compute_bytes(&ctx) > 0);
    ctx.release_compute();
    assert_eq!(compute_bytes(&ctx), 0, "released");
    ctx.clear();
    ctx.decode_tokens(&toks, 0, true).unwrap();
    assert!(compute_bytes(&ctx) > 0, "reserved again");

    // The encoder's device peak for this image, before any model is loaded.
    let peak = engine::encoder_peak(
        model_path,
        mmproj,
        VisionOptions::budgeted(2),
        &engine::PeakImage::File(png.clone()),
        true,
    )
    .unwrap();
    if engine::has_gpu() {
        assert!(peak.reserved > 0);
    } else {
        assert_eq!(peak.reserved + peak.weights, 0, "no device, no device memory");
    }
}

/// Upstream's slot loop encodes images in the slots' own context, between
/// text slots' batches: text and image requests at the same time all
/// finish, and the text answer is the one it gives alone.
#[test]
fn text_and_image_requests_share_the_device() {
    let (_, mmproj, _, _) = fixtures();
    let s = serve(&[mmproj]);
    let complete = |base: &str| -> String {
        let body = json!({"prompt": "The sea is", "max_tokens": 48, "temperature": 0});
        let r = ureq::post(&format!("{base}/v1/completions"))
            .timeout(Duration::from_secs(120))
            .set("Content-Type", "application/json")
            .send_string(&body.to_string())
            .expect("text completion");
        let v: Value = serde_json::from_str(&r.into_string().unwrap()).unwrap();
        v["choices"][0]["text"].as_str().expect("text").to_string()
    };
    let alone = complete(&s.base);
    std::thread::scope(|scope| {
        let images: Vec<_> = (0..3).map(|_| scope.spawn(|| chat_with_image(&s))).collect();
        let text = scope.spawn(|| complete(&s.base));
        for h in images {
            let (code, v) = h.join().unwrap();
            assert_eq!(code, 200, "{v}");
        }
        assert_eq!(
            text.join().unwrap(),
            alone,
            "the same greedy text while images are encoded"
        );
    });
    // And alone.
    let (code, v) = chat_with_image(&s);
    assert_eq!(code, 200, "{v}");
}

/// (status, body) of a chat request with one image URL, answered within 30 s.
fn chat_with_url(s: &Server, url: &str) -> (u16, Value) {
    let body = json!({
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Describe the image."},
            {"type": "image_url", "image_url": {"url": url}},
        ]}],
        "max_tokens": 4, "temperature": 0,
    });
    let res = ureq::post(&format!("{}/v1/chat/completions", s.base))
        .timeout(Duration::from_secs(30))
        .set("Content-Type", "application/json")
        .send_string(&body.to_string());
    let (code, text) = match res {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(c, r)) => (c, r.into_string().unwrap_or_default()),
        Err(e) => panic!("{url}: no answer: {e}"),
    };
    (code, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

/// A kernel figure of the server process from /proc, in KiB.
fn proc_status_kib(s: &Server, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", s.child.id())).unwrap();
    let line = status.lines().find(|l| l.starts_with(key)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A PNG whose header and chunk CRCs are valid but whose image data is not
/// a zlib stream.
fn corrupt_png() -> Vec<u8> {
    let mut png = gradient_png(64, 48);
    // The IDAT payload starts after the signature (8), IHDR (25) and the
    // IDAT length and type (8); overwrite it and fix the chunk's CRC.
    let len = u32::from_be_bytes(png[33..37].try_into().unwrap()) as usize;
    for (i, b) in png[41..41 + len].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(37) ^ 0x5a;
    }
    let crc = crc32(&png[37..41 + len]);
    png[41 + len..45 + len].copy_from_slice(&crc.to_be_bytes());
    png
}

/// Local media under `--media-path` that is not a readable image of a sane
/// size is refused at once: a FIFO (which used to block the request thread
/// for good), a device, a 2 GiB file (read whole before), and a file whose
/// PNG header is valid but whose data is not. `/health` answers throughout
/// and the server's peak memory does not move.
#[test]
fn hostile_local_media_is_refused_without_blocking() {
    let (_, mmproj, png, dir) = fixtures();
    let media = dir.join("media");
    let _ = std::fs::remove_dir_all(&media);
    std::fs::create_dir_all(&media).unwrap();
    std::fs::copy(png, media.join("ok.png")).unwrap();
    let st = Command::new("mkfifo").arg(media.join("fifo.png")).status().unwrap();
    assert!(st.success());
    std::os::unix::fs::symlink("/dev/zero", media.join("zero.png")).unwrap();
    let big = std::fs::File::create(media.join("big.png")).unwrap();
    big.set_len(2 << 30).unwrap(); // sparse: 2 GiB of zeros, no disk
    drop(big);
    std::fs::write(media.join("corrupt.png"), corrupt_png()).unwrap();

    let s = serve_with_args(&[mmproj], 1024, &["--media-path".as_ref(), media.as_os_str()]);
    let peak_before = proc_status_kib(&s, "VmHWM:");

    let (code, v) = chat_with_url(&s, "file://ok.png");
    assert_eq!(code, 200, "{v}");

    std::thread::scope(|scope| {
        let hostile = scope.spawn(|| {
            for _ in 0..3 {
                for (url, want) in [
                    ("file://fifo.png", "not a regular file"),
                    ("file://zero.png", "not a regular file"),
                    ("file://big.png", "larger than the limit"),
                ] {
                    let (code, v) = chat_with_url(&s, url);
                    assert_eq!(code, 400, "{url}: {v}");
                    let msg = v["error"]["message"].as_str().unwrap_or_default();
                    assert!(msg.contains(want), "{url}: {v}");
                }
            }
        });
        while !hostile.is_finished() {
            let r = ureq::get(&format!("{}/health", s.base))
                .timeout(Duration::from_secs(2))
                .call();
            assert!(matches!(&r, Ok(r) if r.status() == 200), "{r:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        hostile.join().unwrap();
    });
    let grown_mib = proc_status_kib(&s, "VmHWM:").saturating_sub(peak_before) / 1024;
    assert!(grown_mib < 512, "peak RSS grew by {grown_mib} MiB");

    // A valid header over undecodable data, from a file or inline.
    let (code, v) = chat_with_url(&s, "file://corrupt.png");
    assert_eq!(code, 400, "{v}");
    let uri = format!("data:image/png;base64,{}", base64(&corrupt_png()));
    let (code, v) = chat_with_url(&s, &uri);
    assert_eq!(code, 400, "{v}");

    // Still serving images.
    let (code, v) = chat_with_image(&s);
    assert_eq!(code, 200, "{v}");
}

/// Window attention in chunks of whole windows, each with its own mask
/// (patch 0021, which spares the encoder an n_patches² mask), attends to
/// the same keys as the one mask. One chunk holding every window gives
/// upstream's embeddings bit for bit; chunks of one or a few windows sum
/// over fewer (masked-out) keys, in another order: the embeddings agree to
/// rounding (2.7e-4 against values up to 0.58 on this random-weight model).
#[test]
fn window_attention_in_chunks_gives_the_same_embeddings() {
    use pipeshard::engine::{self, VisionOptions};
    let (model_path, mmproj, _, _) = fixtures();
    let vocab = engine::Model::load(model_path, engine::ModelParams::default()).unwrap();
    let embed = |window_attn_max_tokens: u32| {
        let opts = VisionOptions {
            window_attn_max_tokens,
            ..VisionOptions::upstream(false, 2)
        };
        let proj = engine::VisionProjector::load(&vocab, mmproj, opts).unwrap();
        // Several windows a side, and partial ones at the right and bottom edges.
        let (w, h) = (300u32, 200u32);
        let rgb: Vec<u8> = (0..w * h * 3).map(|i| ((i * 7919) % 251) as u8).collect();
        let img = engine::Bitmap::from_rgb(w, h, &rgb).unwrap();
        proj.image_embeddings(&img).unwrap()
    };
    let one_mask = embed(0);
    assert!(!one_mask.is_empty() && one_mask.iter().all(|v| v.is_finite()));
    let max_abs = one_mask.iter().map(|a| a.abs()).fold(0f32, f32::max);
    for chunk in [1_000_000, 100, 1] {
        let chunked = embed(chunk);
        assert_eq!(chunked.len(), one_mask.len(), "chunks of {chunk}");
        let max_diff = one_mask
            .iter()
            .zip(&chunked)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let bound = if chunk == 1_000_000 { 0.0 } else { 1e-3 * max_abs };
        assert!(
            max_diff <= bound,
            "chunks of {chunk}: max |diff| {max_diff} against values up to {max_abs}"
        );
    }
}

/// Upstream's `--image-max-tokens` bounds the tokens one image becomes, and
/// so the encoder's peak the server reserves for the largest image it
/// takes (the projector hook passes it into pipeshard's vision options).
#[test]
fn image_max_tokens_bounds_the_largest_image() {
    use pipeshard::engine::{self, VisionOptions};
    let (model_path, mmproj, _, _) = fixtures();
    let vocab = engine::Model::load(model_path, engine::ModelParams::default()).unwrap();
    let n_embd = vocab.n_embd() as usize;
    let tokens = |max: Option<u32>| {
        let opts = VisionOptions {
            image_max_tokens: max,
            ..VisionOptions::upstream(false, 2)
        };
        let proj = engine::VisionProjector::load(&vocab, mmproj, opts).unwrap();
        let img = engine::Bitmap::blank(1024, 1024).unwrap();
        proj.image_embeddings(&img).unwrap().len() / n_embd
    };
    let free = tokens(None);
    let capped = tokens(Some(16));
    assert!(
        capped <= 16 && capped < free,
        "{capped} of at most 16, {free} without a cap"
    );
}
