//! `pipeshard bench` on a tiny synthetic model on the CPU: the four reports
//! are written and well-formed; over-budget rows never count as the best
//! upstream policy; the pipeshard policy fails per row without a GPU profile.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use pipeshard::bench::{write_reports, BenchRow, Policy, PolicyResult, Sample};
use pipeshard_devtools::synth::Quant;
use serde_json::Value;

const GIB: u64 = 1 << 30;

fn pipeshard(args: &[&str], profile_dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pipeshard"))
        .args(args)
        // Never read or write the user's profiles from a test.
        .env("PIPESHARD_PROFILE_DIR", profile_dir)
        .env_remove("PIPESHARD_PROFILE")
        .env_remove("PIPESHARD_VRAM_BUDGET")
        .output()
        .expect("spawning pipeshard")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Splits one CSV line, honouring double quotes.
fn csv_fields(line: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(String::new()),
            _ => out.last_mut().unwrap().push(c),
        }
    }
    assert!(!quoted, "unbalanced quotes in CSV line {line:?}");
    out
}

/// Table rows of the markdown report (not the header or the separator).
fn md_rows(md: &str) -> Vec<&str> {
    md.lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| budget |"))
        .collect()
}

fn policy_json(p: Policy) -> String {
    serde_json::to_value(p).unwrap().as_str().unwrap().to_string()
}

/// The reports in `dir` are consistent with each other; returns the JSON rows.
fn check_reports(dir: &Path) -> Vec<Value> {
    for f in ["bench.md", "bench.csv", "bench.json", "bench.svg"] {
        assert!(dir.join(f).is_file(), "{f} missing in {}", dir.display());
    }
    let json: Value = serde_json::from_str(&read(&dir.join("bench.json"))).expect("bench.json parses");
    let rows = json.as_array().expect("bench.json is an array").clone();
    assert!(!rows.is_empty());

    let csv = read(&dir.join("bench.csv"));
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines.len(),
        rows.len() + 1,
        "CSV: a header and one line per row:\n{csv}"
    );
    let header = csv_fields(lines[0]);
    assert_eq!(header[0], "policy");
    assert!(header.iter().any(|h| h == "ttft_s") && header.iter().any(|h| h == "decode_tok_s"));
    for l in &lines[1..] {
        assert_eq!(
            csv_fields(l).len(),
            header.len(),
            "CSV line has a different number of columns than the header: {l:?}"
        );
    }

    let md = read(&dir.join("bench.md"));
    assert!(md.starts_with("# "), "markdown has no title:\n{md}");
    assert!(md.contains("|---|"), "markdown has no table:\n{md}");
    assert_eq!(
        md_rows(&md).len(),
        rows.len(),
        "one markdown table row per result:\n{md}"
    );

    let svg = read(&dir.join("bench.svg"));
    assert!(
        svg.trim_start().starts_with("<svg"),
        "SVG start: {:?}",
        &svg[..svg.len().min(80)]
    );
    assert!(svg.trim_end().ends_with("</svg>"), "SVG end");
    assert_eq!(svg.matches("<svg").count(), 1);
    assert_eq!(svg.matches("</svg>").count(), 1);
    rows
}

/// `pipeshard bench` with two upstream policies at two budgets on the CPU.
#[test]
fn bench_cli_writes_well_formed_reports() {
    let dir = common::scratch_dir("bench-cli");
    let model = common::synth_tiny_model(&dir, "tiny-llama3.1-8b", Quant::Q4_0);
    let out_dir = dir.join("out");
    let out = pipeshard(
        &[
            "bench",
            "-m",
            model.to_str().unwrap(),
            "--policies",
            "ngl,attn-gpu",
            "-p",
            "64",
            "-n",
            "8",
            "-r",
            "2",
            "--ub",
            "64",
            "-t",
            "2",
            "--vram-budget",
            "1GiB,2GiB",
            "-o",
            out_dir.to_str().unwrap(),
        ],
        &dir,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "bench failed:\n{stderr}");
    assert!(stderr.contains("reports written"), "{stderr}");

    let rows = check_reports(&out_dir);
    let policies = [Policy::Ngl, Policy::AttnGpu];
    let budgets = [GIB, 2 * GIB];
    assert_eq!(rows.len(), policies.len() * budgets.len(), "{rows:#?}");
    for b in budgets {
        for p in policies {
            let n = rows
                .iter()
                .filter(|r| r["budget"].as_u64() == Some(b) && r["policy"].as_str() == Some(&policy_json(p)))
                .count();
            assert_eq!(n, 1, "expected one row for {p:?} at {b}: {rows:#?}");
        }
    }
    for r in &rows {
        assert!(r["error"].is_null(), "row failed: {r}");
        for key in [
            "ttft_s",
            "ttft_min_s",
            "ttft_max_s",
            "decode_tok_s",
            "decode_min",
            "decode_max",
        ] {
            let v = r[key]
                .as_f64()
                .unwrap_or_else(|| panic!("{key} is not a number in {r}"));
            assert!(v.is_finite() && v > 0.0, "{key} = {v} in {r}");
        }
        let f = |k: &str| r[k].as_f64().unwrap();
        assert!(f("ttft_min_s") <= f("ttft_s") && f("ttft_s") <= f("ttft_max_s"), "{r}");
        assert!(
            f("decode_min") <= f("decode_tok_s") && f("decode_tok_s") <= f("decode_max"),
            "{r}"
        );
        assert!(r["peak_rss"].as_u64().unwrap() > 0, "{r}");
        // Over budget exactly when the measured peak exceeds the budget.
        let over = r["peak_vram"].as_u64().unwrap() > r["budget"].as_u64().unwrap();
        assert_eq!(r["over_budget"].as_bool(), Some(over), "{r}");
        assert!(!r["setting"].as_str().unwrap().is_empty(), "{r}");
        // Upstream rows have no prediction.
        assert!(r["predicted_ttft_s"].is_null(), "{r}");
    }
    // The markdown names every policy and budget.
    let md = read(&out_dir.join("bench.md"));
    for row in md_rows(&md) {
        assert!(row.contains("Ngl") || row.contains("AttnGpu"), "{row}");
        assert!(row.contains("1.00 GiB") || row.contains("2.00 GiB"), "{row}");
    }
    // Every successful row has a bar in each of the two panels.
    let svg = read(&out_dir.join("bench.svg"));
    assert!(svg.matches("<rect").count() >= 2 * rows.len(), "{svg}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// bench.json holds what a row of the results summary needs: the tg figure
/// at the depth (median of the repetitions), the quantization, the ubatch
/// and the invocation's model, workload, flags, command, commit and host.
#[test]
fn bench_json_holds_what_a_summary_row_needs() {
    let dir = common::scratch_dir("bench-row-fields");
    let model = common::synth_tiny_model(&dir, "tiny-llama3.1-8b", Quant::Q4_0);
    let out_dir = dir.join("out");
    let model_arg = model.to_str().unwrap();
    let out_arg = out_dir.to_str().unwrap();
    let out = pipeshard(
        &[
            "bench",
            "-m",
            model_arg,
            "--policies",
            "ngl",
            "-p",
            "48",
            "-n",
            "6",
            "-r",
            "3",
            "--ub",
            "16",
            "-t",
            "2",
            "--tg",
            "--vram-budget",
            "1GiB",
            "-o",
            out_arg,
        ],
        &dir,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "bench failed:\n{stderr}");
    let rows = check_reports(&out_dir);
    assert_eq!(rows.len(), 1, "{rows:#?}");
    let r = &rows[0];
    let tg = r["tg_tok_s"].as_f64().unwrap_or_else(|| panic!("no tg_tok_s in {r}"));
    assert!(tg.is_finite() && tg > 0.0, "{r}");
    assert_eq!(r["repetitions"].as_u64(), Some(3), "{r}");
    assert_eq!(r["quant"].as_str(), Some("Q4_0"), "{r}");
    assert_eq!(r["ubatch"].as_u64(), Some(16), "{r}");
    let run = &r["run"];
    assert_eq!(run["model"].as_str(), Some("tiny-llama3.1-8b"), "{r}");
    assert!(run["routing"].is_null(), "{r}");
    assert_eq!(run["threads"].as_i64(), Some(2), "{r}");
    assert_eq!(run["prompt_tokens"].as_u64(), Some(48), "{r}");
    assert_eq!(run["gen_tokens"].as_u64(), Some(6), "{r}");
    assert_eq!(run["depth"].as_u64(), Some(48), "{r}");
    let flags = run["flags"].as_str().unwrap();
    assert!(flags.contains("--tg") && flags.contains("-r 3"), "{flags}");
    assert!(!flags.contains(model_arg) && !flags.contains(out_arg), "{flags}");
    assert!(!flags.contains("-m ") && !flags.contains("-o "), "{flags}");
    let command = run["command"].as_str().unwrap();
    assert!(command.contains(model_arg) && command.contains(" bench "), "{command}");
    let commit = run["commit"].as_str().unwrap();
    assert!(
        commit == "unknown" || (commit.len() == 12 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "{commit}"
    );
    assert!(!run["host"].as_str().unwrap().is_empty(), "{r}");
    assert!(stderr.contains("(median of 3)"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--tg` on a model with a recurrent state (qwen35moe's Gated-DeltaNet
/// layers), which llama.cpp cannot cut back to the depth: each repetition
/// after the first starts from the depth's state, put back, rather than
/// failing ("the context cannot remove the generated cells").
#[test]
fn tg_repetitions_go_back_to_the_depth_of_a_recurrent_model() {
    let dir = common::scratch_dir("bench-tg-recurrent");
    let model = common::synth_tiny_model(&dir, "tiny-qwen3.6-35b-a3b", Quant::Q4_0);
    let out_dir = dir.join("out");
    let args = [
        "bench",
        "-m",
        model.to_str().unwrap(),
        "--policies",
        "ngl",
        "-p",
        "48",
        "-n",
        "6",
        "-r",
        "2",
        "--ub",
        "16",
        "-t",
        "2",
        "--tg",
        "--vram-budget",
        "1GiB",
        "-o",
        out_dir.to_str().unwrap(),
    ];
    let out = pipeshard(&args, &dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "bench failed:\n{stderr}");
    assert!(stderr.contains("(median of 2)"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// On a CPU-only machine the pipeshard policy fails per row (no GPU
/// profile), the upstream policy still runs, and bench exits normally.
#[test]
fn bench_cli_pipeshard_without_gpu_fails_per_row() {
    let dir = common::scratch_dir("bench-cli-nogpu");
    let model = common::synth_tiny_model(&dir, "tiny-qwen3-8b", Quant::Q4_0);
    let profile = dir.join("cpu.yaml");
    common::cpu_only_profile().save(&profile).unwrap();
    let out_dir = dir.join("out");
    let out = pipeshard(
        &[
            "bench",
            "-m",
            model.to_str().unwrap(),
            "--policies",
            "pipeshard,ngl",
            "-p",
            "32",
            "-n",
            "4",
            "-r",
            "1",
            "--ub",
            "32",
            "-t",
            "2",
            "--vram-budget",
            "1GiB",
            "--profile",
            profile.to_str().unwrap(),
            "-o",
            out_dir.to_str().unwrap(),
        ],
        &dir,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "bench should report the failed row, not fail:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("failed"), "{stderr}");

    let rows = check_reports(&out_dir);
    assert_eq!(rows.len(), 2, "{rows:#?}");
    let ps = rows
        .iter()
        .find(|r| r["policy"] == "pipeshard")
        .expect("a pipeshard row");
    let err = ps["error"].as_str().unwrap_or_else(|| panic!("no error in {ps}"));
    assert!(err.contains("no GPU measurements"), "{err}");
    assert_eq!(ps["budget"].as_u64(), Some(GIB));
    // A failed row carries no figures (NaN is written as null).
    assert!(!ps["ttft_s"].as_f64().is_some_and(|v| v.is_finite()), "{ps}");
    let ngl = rows.iter().find(|r| r["policy"] == "ngl").expect("an ngl row");
    assert!(ngl["error"].is_null(), "{ngl}");
    assert!(ngl["ttft_s"].as_f64().unwrap() > 0.0, "{ngl}");

    let md = read(&out_dir.join("bench.md"));
    let ps_row = md_rows(&md)
        .into_iter()
        .find(|l| l.contains("Pipeshard"))
        .expect("a pipeshard row in the markdown");
    assert!(ps_row.contains("failed:"), "{ps_row}");
    assert!(!ps_row.contains("TTFT "), "a failed row has no ratio: {ps_row}");
    let csv = read(&out_dir.join("bench.csv"));
    assert!(
        csv.lines()
            .any(|l| l.starts_with("Pipeshard,") && l.contains("no GPU measurements")),
        "{csv}"
    );
    // The profile given on the command line was used: nothing was measured or saved.
    assert!(
        std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .all(|e| e.file_name() != "profiles" && !e.file_name().to_string_lossy().ends_with("__t2.yaml")),
        "bench wrote a profile"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn result(policy: Policy, budget: u64, ttfts: &[f64], decodes: &[f64], peak_vram: u64, over: bool) -> PolicyResult {
    PolicyResult {
        policy,
        budget,
        setting: format!("{policy:?} setting"),
        ubatch: 512,
        quant: Some("Q4_0".into()),
        load_s: 0.1,
        samples: ttfts
            .iter()
            .zip(decodes)
            .map(|(&ttft_s, &decode_tok_s)| Sample {
                ttft_s,
                decode_tok_s,
                tg_tok_s: None,
            })
            .collect(),
        peak_vram,
        peak_source: None,
        llama_device_bytes: peak_vram / 2,
        memory_steps: Vec::new(),
        peak_rss: 100 << 20,
        over_budget: over,
        predicted: None,
        routing_stats: None,
    }
}

#[test]
fn rows_summarise_medians_and_spread() {
    let r = result(Policy::Ngl, GIB, &[3.0, 1.0, 2.0], &[10.0, 30.0, 20.0], GIB / 2, false);
    let row = BenchRow::from_result(&r);
    assert_eq!(row.policy, Policy::Ngl);
    assert_eq!(row.budget, GIB);
    assert_eq!(row.setting, "Ngl setting");
    assert_eq!((row.ttft_s, row.ttft_min_s, row.ttft_max_s), (2.0, 1.0, 3.0));
    assert_eq!((row.decode_tok_s, row.decode_min, row.decode_max), (20.0, 10.0, 30.0));
    assert_eq!(row.peak_vram, GIB / 2);
    assert!(!row.over_budget);
    assert!(row.error.is_none());
    // Even counts take the mean of the middle two.
    let even = BenchRow::from_result(&result(Policy::Ngl, GIB, &[1.0, 4.0], &[2.0, 8.0], 0, false));
    assert_eq!(even.ttft_s, 2.5);
    assert_eq!(even.decode_tok_s, 5.0);

    let failed = BenchRow::failed(Policy::Pipeshard, GIB, "no GPU".into());
    assert_eq!(failed.error.as_deref(), Some("no GPU"));
    assert!(failed.ttft_s.is_nan() && !failed.over_budget);
}

/// The over-budget flag set by `run_policy` carries into the row and the
/// markdown. `BenchRow::from_result` copies `over_budget`; it does not
/// re-derive it from `peak_vram > budget`.
#[test]
fn over_budget_results_are_marked() {
    let dir = common::scratch_dir("bench-over-budget-mark");
    let over = result(Policy::Fit, GIB, &[0.5], &[20.0], GIB + (1 << 20), true);
    let row = BenchRow::from_result(&over);
    assert!(row.over_budget);
    assert!(row.peak_vram > row.budget);
    let within = BenchRow::from_result(&result(Policy::Ngl, GIB, &[0.5], &[20.0], GIB - 1, false));
    assert!(!within.over_budget);

    write_reports(&dir, "t", "cmd", "machine", &[row, within]).unwrap();
    let md = read(&dir.join("bench.md"));
    let rows = md_rows(&md);
    assert_eq!(rows.len(), 2, "{md}");
    assert!(rows[0].contains("**over budget**"), "{}", rows[0]);
    assert!(!rows[1].contains("over budget"), "{}", rows[1]);
    let json: Value = serde_json::from_str(&read(&dir.join("bench.json"))).unwrap();
    assert_eq!(json[0]["over_budget"], true);
    assert_eq!(json[1]["over_budget"], false);
    let csv = read(&dir.join("bench.csv"));
    let header = csv_fields(csv.lines().next().unwrap());
    let col = header.iter().position(|h| h == "over_budget").unwrap();
    let lines: Vec<Vec<String>> = csv.lines().skip(1).map(csv_fields).collect();
    assert_eq!(lines[0][col], "true");
    assert_eq!(lines[1][col], "false");
    // Successful rows round-trip through bench.json.
    let back: Vec<BenchRow> = serde_json::from_str(&read(&dir.join("bench.json"))).unwrap();
    assert_eq!(back.len(), 2);
    assert!(back[0].over_budget && !back[1].over_budget);
    let _ = std::fs::remove_dir_all(&dir);
}

/// "vs best upstream" compares against the best upstream row within the
/// budget, never against a faster one that went over it.
#[test]
fn over_budget_upstream_never_counts_as_best() {
    let dir = common::scratch_dir("bench-best-upstream");
    let rows = vec![
        // pipeshard: TTFT 0.5 s, 20 tok/s.
        BenchRow::from_result(&result(
            Policy::Pipeshard,
            GIB,
            &[0.5, 0.5],
            &[20.0, 20.0],
            GIB / 2,
            false,
        )),
        // Faster than everything, but over budget: must be ignored.
        BenchRow::from_result(&result(Policy::Fit, GIB, &[0.125, 0.125], &[80.0, 80.0], 2 * GIB, true)),
        // Within budget: the reference. TTFT 1.0 s, 10 tok/s.
        BenchRow::from_result(&result(Policy::Ngl, GIB, &[1.0, 1.0], &[10.0, 10.0], GIB / 2, false)),
        // Slower upstream within budget: not the best.
        BenchRow::from_result(&result(Policy::AttnGpu, GIB, &[4.0, 4.0], &[5.0, 5.0], GIB / 4, false)),
        // A failed upstream row at the same budget is ignored too.
        BenchRow::failed(Policy::Fit, GIB, "no placement fits".into()),
        // Another budget where the only upstream row is over budget: no reference.
        BenchRow::from_result(&result(Policy::Pipeshard, 2 * GIB, &[0.5], &[20.0], GIB, false)),
        BenchRow::from_result(&result(Policy::Ngl, 2 * GIB, &[0.25], &[40.0], 3 * GIB, true)),
    ];
    write_reports(&dir, "best upstream", "cmd", "machine", &rows).unwrap();
    let md = read(&dir.join("bench.md"));
    let table = md_rows(&md);
    assert_eq!(table.len(), rows.len(), "{md}");
    let ps_1g = table[0];
    assert!(ps_1g.contains("Pipeshard"), "{ps_1g}");
    // 1.0 / 0.5 and 20 / 10, against the in-budget ngl row.
    assert!(ps_1g.contains("TTFT 2.00x, decode 2.00x"), "wrong reference:\n{ps_1g}");
    // Against the over-budget fit row it would read 0.25x.
    assert!(!ps_1g.contains("0.25x"), "{ps_1g}");
    // Only pipeshard rows get a ratio.
    for r in &table[1..5] {
        assert!(!r.contains("TTFT "), "{r}");
    }
    let ps_2g = table[5];
    assert!(ps_2g.contains("Pipeshard"), "{ps_2g}");
    assert!(
        ps_2g.contains("TTFT -, decode -"),
        "over-budget row used as reference:\n{ps_2g}"
    );
    assert!(table[6].contains("**over budget**"), "{}", table[6]);
    assert!(table[4].contains("failed: no placement fits"), "{}", table[4]);

    // The other reports agree on the number of rows.
    let csv = read(&dir.join("bench.csv"));
    assert_eq!(csv.lines().count(), rows.len() + 1);
    let json: Value = serde_json::from_str(&read(&dir.join("bench.json"))).unwrap();
    assert_eq!(json.as_array().unwrap().len(), rows.len());
    // Over-budget and failed rows get no bar; the others get one per panel.
    let svg = read(&dir.join("bench.svg"));
    let bars = svg.matches("</rect>").count();
    assert_eq!(bars, 2 * 4, "{svg}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The greedy trace behind `pipeshard lossless`, on the CPU: the same
/// placement reproduces itself exactly, and changing only where host-weight
/// ops may run (on a CPU-only machine: nowhere else) changes nothing.
#[test]
fn greedy_traces_of_one_placement_are_identical() {
    use pipeshard::bench::lossless::{compare, greedy_trace};
    use pipeshard::engine::{Context, ContextParams, Offload, OffloadPolicy};
    let model = common::load_default_model();
    let params = common::small_context_params();
    let prompt = model.tokenize("Once upon a time", true, false).unwrap();
    let a = greedy_trace(&mut Context::new(&model, params.clone()).unwrap(), &prompt, 12).unwrap();
    assert_eq!((a.tokens.len(), a.logits.len()), (12, 12));
    assert_eq!(a.logits[0].len(), model.n_vocab() as usize);
    let cpu: OffloadPolicy = std::sync::Arc::new(|_| Offload::Cpu);
    let b = greedy_trace(
        &mut Context::new(
            &model,
            ContextParams {
                offload: Some(cpu),
                stream_slots: 2,
                ..params
            },
        )
        .unwrap(),
        &prompt,
        12,
    )
    .unwrap();
    let c = compare(&a, &b);
    assert!(c.identical_tokens(), "{c:?}");
    assert_eq!(c.max_abs_logit_diff, 0.0);
    // Overflowing the context is an error, not a crash.
    let mut small = Context::new(
        &model,
        ContextParams {
            n_ctx: 256,
            n_batch: 64,
            n_ubatch: 64,
            n_threads: Some(2),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(greedy_trace(&mut small, &prompt, 1000).is_err());
}
