//! The llama.cpp patch series (patches/series, patches/README.md):
//! `scripts/patches.py check` applies every stand-alone patch alone to the
//! pristine release (the sdist that the build fetched into vendor/, or
//! `PIPESHARD_LLAMA_SDIST`) and the whole list in order, and measures the seam.

use std::path::Path;
use std::process::Command;

/// The most lines that the series may add to and remove from upstream's
/// ggml-backend.cpp in place (issue 43): the scheduler's hook table and its
/// calls; the streaming scheduler itself lives in files of its own.
const MAX_BACKEND_LINES: usize = 400;

fn patches_py(command: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(root.join("scripts/patches.py"))
        .arg(command)
        .current_dir(root)
        .output()
        .expect("spawning python3");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "patches.py {command} failed:\n{stdout}{stderr}");
    stdout
}

#[test]
fn series_apply_in_order_and_upstream_fixes_apply_alone() {
    let stdout = patches_py("check");
    assert!(
        stdout.contains("stand-alone patches apply alone to the pristine release"),
        "{stdout}"
    );
    assert!(stdout.contains("upstream functions edited"), "{stdout}");
}

#[test]
fn scheduler_edits_of_ggml_backend_stay_a_narrow_seam() {
    let stdout = patches_py("stats");
    let lines = stdout
        .lines()
        .find_map(|l| l.strip_prefix("ggml/src/ggml-backend.cpp: "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or_else(|| panic!("no ggml-backend.cpp figure in:\n{stdout}"));
    assert!(
        lines <= MAX_BACKEND_LINES,
        "the series edit {lines} lines of ggml-backend.cpp in place (at most {MAX_BACKEND_LINES})"
    );
}

#[test]
fn no_upstream_function_is_edited_by_two_series() {
    let stdout = patches_py("stats");
    let shared = stdout
        .lines()
        .find_map(|l| l.split_once(" upstream functions edited, "))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or_else(|| panic!("no count of shared functions in:\n{stdout}"));
    assert_eq!(
        shared, 0,
        "upstream functions edited by more than one series:\n{stdout}"
    );
}

#[test]
fn no_scheduler_switch_but_the_timing_log() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("patches");
    let mut switches = Vec::new();
    for series in std::fs::read_dir(&dir).expect("patches/") {
        let series = series.expect("patches/ entry").path();
        if !series.is_dir() {
            continue;
        }
        for patch in std::fs::read_dir(&series).expect("a series directory") {
            let patch = patch.expect("a series entry").path();
            let text = std::fs::read_to_string(&patch).expect("a patch");
            switches.extend(
                text.lines()
                    .filter(|l| l.starts_with('+') && l.contains("getenv(\"GGML_SCHED_"))
                    .filter(|l| !l.contains("getenv(\"GGML_SCHED_TIMING\")"))
                    .map(|l| format!("{}: {}", patch.display(), l.trim())),
            );
        }
    }
    assert!(
        switches.is_empty(),
        "GGML_SCHED_* switches besides the timing log:\n{}",
        switches.join("\n")
    );
}
