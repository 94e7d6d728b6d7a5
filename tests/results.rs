//! `pipeshard results add` and `render` on the committed samples in
//! tests/fixtures/results/ (see its README: the llama-bench outputs are
//! constructed, the pipeshard bench outputs measured on a CPU).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pipeshard::results::{quant_from_description, render, Bytes, Row, Summary};

const GIB: u64 = 1 << 30;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/results")
        .join(name)
}

fn llama_bench_files() -> Vec<PathBuf> {
    (1..=3)
        .map(|i| fixture(&format!("llama-bench-r1-fit-{i}.json")))
        .collect()
}

fn pipeshard_bench_files() -> Vec<PathBuf> {
    (1..=3)
        .map(|i| fixture(&format!("pipeshard-bench-cpu-{i}/bench.json")))
        .collect()
}

fn results(args: &[&str], files: &[PathBuf]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pipeshard"))
        .arg("results")
        .args(args)
        .args(files)
        .output()
        .expect("spawning pipeshard")
}

fn ok(out: &Output) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "pipeshard results failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Fails with exit status 1 and a message containing `needle`, no panic.
fn fails_with(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(needle), "expected {needle:?} in:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `peaks`: one `--peak-bytes` value each (a value may list several, comma-separated).
fn add_fit(summary: &Path, budget: &str, peaks: &[&str]) -> Output {
    let s = summary.to_str().unwrap();
    let mut args = vec![
        "add",
        "--summary",
        s,
        "--call",
        "test-a",
        "--case",
        "R1",
        "--system",
        "upstream-fit",
        "--from",
        "llama-bench",
        "--budget",
        budget,
        "--command",
        "llama-bench -m r1.gguf -ngl 99 -fa 1 -t 16 -p 4096,0 -n 0,64 -d 0,4096 -r 1 -fitt 141108 -fitc 4160 -o json",
        "--raw",
        "bench/results/raw/test-a/",
    ];
    for p in peaks {
        args.extend(["--peak-bytes", p]);
    }
    results(&args, &llama_bench_files())
}

/// Three llama-bench outputs make one row of their medians; the same key
/// replaces the row, another budget appends one.
#[test]
fn add_llama_bench_rows_medians_and_replaces() {
    let dir = common::scratch_dir("results-add-llama");
    let summary = dir.join("summary.json");
    ok(&add_fit(&summary, "2GiB", &["2225078272", "2224000000,2100000000"]));
    let rows = Summary::load(&summary).unwrap().rows;
    assert_eq!(rows.len(), 1, "{rows:#?}");
    let r = &rows[0];
    assert_eq!(
        (r.call.as_str(), r.case.as_str(), r.system.as_str()),
        ("test-a", "R1", "upstream-fit")
    );
    assert_eq!(r.entry, "bench");
    assert_eq!(r.model, "r1", "the file is not here: its stem");
    assert_eq!(r.quant, "Q4_0");
    assert_eq!(
        (r.threads, r.prompt_tokens, r.gen_tokens, r.depth),
        (16, 4096, 64, 4096)
    );
    assert_eq!(r.ubatch, Some(512));
    assert_eq!(r.reps, 3);
    assert_eq!(r.samples_per_rep, 1);
    // The samples' tg figures are 12.71, 12.52 and 12.60 tok/s; pp 1.912,
    // 1.874 and 1.955 s.
    let d = r.decode_tok_s.unwrap();
    assert!((d - 12.60).abs() < 0.005, "decode median {d}");
    let t = r.ttft_s.unwrap();
    assert!((t - 1.912).abs() < 1e-6, "TTFT median {t}");
    assert_eq!(r.decode_after_prompt_tok_s, None);
    assert_eq!(r.budget_bytes, Some(Bytes::One(2 * GIB)));
    assert_eq!(r.peak_process_bytes, Some(Bytes::One(2225078272)));
    assert!(r.over_budget, "2122 MiB is over 2 GiB");
    assert!(
        r.setting.contains("fitt 141108 MiB") && r.setting.contains("ub 512"),
        "{}",
        r.setting
    );
    assert!(r.host.contains("NVIDIA H200"), "{}", r.host);
    assert!(r.command.starts_with("llama-bench -m r1.gguf"), "{}", r.command);
    assert!(!r.commit.is_empty());
    assert_eq!(r.raw.as_deref(), Some("bench/results/raw/test-a/"));

    // The same key: replaced, not appended (a peak within the budget now).
    ok(&add_fit(&summary, "2GiB", &["2000000000"]));
    let rows = Summary::load(&summary).unwrap().rows;
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert!(!rows[0].over_budget);
    // Another budget: another row, after the first.
    ok(&add_fit(&summary, "4GiB", &[]));
    let rows = Summary::load(&summary).unwrap().rows;
    assert_eq!(rows.len(), 2, "{rows:#?}");
    assert_eq!(rows[1].budget_bytes, Some(Bytes::One(4 * GIB)));
    assert_eq!(rows[1].peak_process_bytes, None, "llama-bench measures no peak");
    assert!(!rows[1].over_budget);
    let _ = std::fs::remove_dir_all(&dir);
}

/// pipeshard bench's outputs of a CPU run (the default model): the `ngl`
/// policy's row, its tg figure as the decode; the failed pipeshard policy
/// is refused with the row's error.
#[test]
fn add_pipeshard_bench_rows() {
    let dir = common::scratch_dir("results-add-pipeshard");
    let summary = dir.join("summary.json");
    let s = summary.to_str().unwrap();
    let base = [
        "add",
        "--summary",
        s,
        "--call",
        "test-cpu",
        "--case",
        "smollm2",
        "--from",
        "pipeshard-bench",
    ];
    let files = pipeshard_bench_files();
    let inputs: Vec<serde_json::Value> = files
        .iter()
        .map(|f| serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap())
        .collect();
    let ngl: Vec<&serde_json::Value> = inputs
        .iter()
        .map(|rows| rows.as_array().unwrap().iter().find(|r| r["policy"] == "ngl").unwrap())
        .collect();

    ok(&results(&[&base[..], &["--system", "upstream-ngl"]].concat(), &files));
    let rows = Summary::load(&summary).unwrap().rows;
    assert_eq!(rows.len(), 1, "{rows:#?}");
    let r = &rows[0];
    let run = &ngl[0]["run"];
    assert_eq!(r.model, run["model"].as_str().unwrap());
    assert_eq!(r.quant, "Q4_1");
    assert_eq!(r.reps, 3);
    assert_eq!(r.samples_per_rep, ngl[0]["repetitions"].as_u64().unwrap() as u32);
    assert_eq!(r.threads as i64, run["threads"].as_i64().unwrap());
    assert_eq!(r.flags, run["flags"].as_str().unwrap());
    assert_eq!(r.commit, run["commit"].as_str().unwrap());
    assert_eq!(r.command, run["command"].as_str().unwrap());
    let mut tg: Vec<f64> = ngl.iter().map(|r| r["tg_tok_s"].as_f64().unwrap()).collect();
    tg.sort_by(f64::total_cmp);
    assert_eq!(r.decode_tok_s, Some(tg[1]), "the median of the three tg figures");
    let mut after: Vec<f64> = ngl.iter().map(|r| r["decode_tok_s"].as_f64().unwrap()).collect();
    after.sort_by(f64::total_cmp);
    assert_eq!(r.decode_after_prompt_tok_s, Some(after[1]));
    // A CPU run measures no device memory: no peak, not a peak of 0.
    assert!(ngl.iter().all(|r| r["peak_source"].is_null()));
    assert_eq!(r.peak_process_bytes, None);
    assert!(!r.over_budget);
    assert_eq!(r.budget_bytes, Some(Bytes::One(ngl[0]["budget"].as_u64().unwrap())));

    let out = results(&[&base[..], &["--system", "pipeshard"]].concat(), &files);
    fails_with(&out, "the Pipeshard row failed");
    let out = results(&[&base[..], &["--system", "upstream-ncmoe-4"]].concat(), &files);
    fails_with(&out, "has no pipeshard bench policy");
    // Nothing was written by the failed adds.
    assert_eq!(Summary::load(&summary).unwrap().rows.len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Bad input fails with status 1 and a message, and leaves the summary alone.
#[test]
fn add_refuses_bad_input() {
    let dir = common::scratch_dir("results-add-bad");
    let summary = dir.join("summary.json");
    let s = summary.to_str().unwrap();
    let base = [
        "add",
        "--summary",
        s,
        "--call",
        "c",
        "--case",
        "R1",
        "--system",
        "upstream-fit",
        "--from",
        "llama-bench",
    ];
    // llama-bench's JSON holds no command line.
    fails_with(&results(&base, &llama_bench_files()), "pass --command");
    let with_command = [&base[..], &["--command", "llama-bench ..."]].concat();
    // Two tg tests in one file.
    let text = std::fs::read_to_string(&llama_bench_files()[0]).unwrap();
    let mut tests: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    tests.push(tests[1].clone());
    let two = dir.join("two-tg.json");
    std::fs::write(&two, serde_json::to_string(&tests).unwrap()).unwrap();
    fails_with(&results(&with_command, &[two]), "several tg tests");
    // Not JSON; a file that is not there.
    let junk = dir.join("junk.json");
    std::fs::write(&junk, "| model | t/s |").unwrap();
    fails_with(&results(&with_command, &[junk]), "llama-bench's JSON output");
    fails_with(&results(&with_command, &[dir.join("missing.json")]), "missing.json");
    // Repetitions of different workloads.
    let mut other: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    other[1]["n_depth"] = 8192.into();
    let deeper = dir.join("deeper.json");
    std::fs::write(&deeper, serde_json::to_string(&other).unwrap()).unwrap();
    fails_with(
        &results(&with_command, &[llama_bench_files()[0].clone(), deeper]),
        "the depth",
    );
    // A summary that is not one.
    std::fs::write(&summary, "{\"rows\": 1}").unwrap();
    fails_with(&results(&with_command, &llama_bench_files()), "not a results summary");
    assert_eq!(std::fs::read_to_string(&summary).unwrap(), "{\"rows\": 1}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// SUMMARY.md: a table per call and case, pipeshard's ratio to upstream's
/// best in-budget row of the same call only, and the chart.
#[test]
fn render_tables_ratios_and_chart() {
    let dir = common::scratch_dir("results-render");
    let summary = fixture("summary.json");
    let rows = Summary::load(&summary).unwrap().rows;
    let out = dir.join("SUMMARY.md");
    ok(&results(
        &[
            "render",
            "--summary",
            summary.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ],
        &[],
    ));
    let md = std::fs::read_to_string(&out).unwrap();
    assert_eq!(md, render::markdown(&rows), "the command writes the library's markdown");
    // One section per call and case, in the summary's order.
    let headings: Vec<&str> = md.lines().filter(|l| l.starts_with("## ")).collect();
    assert_eq!(
        headings,
        [
            "## R1, call 2026-s25-d",
            "## R2, call 2026-s25-d",
            "## R1, call 2026-s25-f",
            "## Decode tok/s (higher is better)"
        ]
    );
    let line = |call: &str, case: &str, system: &str| -> String {
        let start = md.find(&format!("## {case}, call {call}")).unwrap();
        md[start..]
            .lines()
            .find(|l| l.starts_with(&format!("| {system} |")))
            .unwrap_or_else(|| panic!("no {system} row for {call} {case}:\n{md}"))
            .to_string()
    };
    // 34.55 / 12.65 and 34.55 / 281.15 within call d; 31.25 / 10.46 and
    // 31.25 / 276.56 within call f (never across calls).
    let d = line("2026-s25-d", "R1", "pipeshard");
    assert!(d.contains("2.73x upstream-fit") && d.contains("12% of full GPU"), "{d}");
    let f = line("2026-s25-f", "R1", "pipeshard");
    assert!(f.contains("2.99x upstream-fit") && f.contains("11% of full GPU"), "{f}");
    let r2 = line("2026-s25-d", "R2", "pipeshard");
    assert!(r2.contains("2.66x upstream-fit"), "{r2}");
    // A routing point stands beside upstream's rows, which keep the
    // model's own router: 89.48 / 44.74.
    let mut routed = rows.clone();
    let mut calibrated = rows
        .iter()
        .find(|r| r.call == "2026-s25-d" && r.case == "R2" && r.system == "pipeshard")
        .unwrap()
        .clone();
    calibrated.routing = Some("calibrated".into());
    calibrated.decode_tok_s = Some(89.48);
    routed.push(calibrated);
    let routed_md = render::markdown(&routed);
    let row = routed_md.lines().find(|l| l.contains("(calibrated)")).unwrap();
    assert!(row.contains("2.00x upstream-fit"), "{row}");
    // Upstream's fit went over the budget.
    assert!(line("2026-s25-d", "R1", "upstream-fit").contains("**over**"));
    assert!(!line("2026-s25-d", "R1", "pipeshard").contains("**over**"));
    // Every row with a decode figure has a bar.
    let chart = &md[md.find("## Decode tok/s").unwrap()..];
    let bars = chart
        .lines()
        .filter(|l| l.contains('#') && !l.starts_with("##"))
        .count();
    assert_eq!(
        bars,
        rows.iter().filter(|r| r.decode_tok_s.is_some()).count(),
        "{chart}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// llama.cpp's names of file types in the summary's spelling.
#[test]
fn quant_names() {
    for (desc, quant) in [
        ("llama 8B Q4_0", Some("Q4_0")),
        ("llama 8B Q4_K - Medium", Some("Q4_K_M")),
        ("qwen3moe 30B.A3B Q4_K - Small", Some("Q4_K_S")),
        ("llama 8B Q3_K - Large", Some("Q3_K_L")),
        ("llama 8B Q2_K - Medium", Some("Q2_K")),
        ("gpt-oss 20B MXFP4 MoE", Some("MXFP4")),
        ("llama 8B IQ3_S mix - 3.66 bpw", Some("IQ3_M")),
        ("llama 8B IQ2_XXS - 2.0625 bpw", Some("IQ2_XXS")),
        ("llama 135M all F32", Some("F32")),
        ("llama 135M Q8_0 (guessed)", Some("Q8_0")),
        ("llama 135M", None),
    ] {
        assert_eq!(quant_from_description(desc).as_deref(), quant, "{desc}");
    }
}

/// The committed summary parses as rows, and every row's raw log is in
/// the tree.
#[test]
fn committed_summary_is_well_formed() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rows: Vec<Row> = Summary::load(&root.join("bench/results/summary.json")).unwrap().rows;
    assert!(!rows.is_empty());
    for r in &rows {
        let raw = r.raw.as_deref().unwrap_or_else(|| panic!("no raw log for {r:?}"));
        assert!(root.join(raw).exists(), "{raw} is not in the tree");
        assert!(r.reps >= 1 && r.samples_per_rep >= 1, "{r:?}");
        let over = match (&r.peak_process_bytes, &r.budget_bytes) {
            (Some(p), Some(b)) => p.exceeds(b),
            _ => false,
        };
        assert_eq!(r.over_budget, over, "{r:?}");
    }
}
