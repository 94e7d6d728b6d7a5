//! The llama.cpp patch series (patches/series, patches/README.md):
//! `scripts/patches.py check` applies every stand-alone patch alone to the
//! pristine release (the sdist that the build fetched into vendor/, or
//! `PIPESHARD_LLAMA_SDIST`) and the whole list in order, and measures the seam.

use std::path::Path;
use std::process::Command;

#[test]
fn series_apply_in_order_and_upstream_fixes_apply_alone() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(root.join("scripts/patches.py"))
        .arg("check")
        .current_dir(root)
        .output()
        .expect("spawning python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "patches.py check failed:\n{stdout}{stderr}");
    assert!(
        stdout.contains("stand-alone patches apply alone to the pristine release"),
        "{stdout}"
    );
    assert!(stdout.contains("upstream functions edited"), "{stdout}");
}
