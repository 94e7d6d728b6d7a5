//! `pipeshard profile --mode tiny` on this machine, and what `plan` does with
//! a profile that has no GPU measurements.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pipeshard::gguf::GgmlType;
use pipeshard::profile::{self, Device, MachineProfile, MatmulSample, ProfileMode};
use pipeshard_devtools::synth::Quant;

/// What a finished command left.
struct Finished {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

/// Runs the binary with a hard time limit (killing it when over), with
/// output going to files so that a chatty child cannot block on a full pipe.
fn pipeshard_with_limit(args: &[&str], scratch: &Path, limit: Duration) -> Finished {
    pipeshard_with_env(args, scratch, limit, &[])
}

/// [`pipeshard_with_limit`] with the variables `env` set (None: removed)
/// after its own.
fn pipeshard_with_env(args: &[&str], scratch: &Path, limit: Duration, env: &[(&str, Option<&Path>)]) -> Finished {
    let out_path = scratch.join("stdout.txt");
    let err_path = scratch.join("stderr.txt");
    let t0 = Instant::now();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pipeshard"));
    cmd.args(args)
        .env("PIPESHARD_PROFILE_DIR", scratch.join("profiles"))
        .env_remove("PIPESHARD_PROFILE")
        .env_remove("PIPESHARD_VRAM_BUDGET");
    for (name, value) in env {
        match value {
            Some(v) => cmd.env(name, v),
            None => cmd.env_remove(name),
        };
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("spawning pipeshard");
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "pipeshard {args:?} ran longer than {limit:?}; stderr:\n{}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Finished {
        code: status.code(),
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
        elapsed: t0.elapsed(),
    }
}

fn dense_cpu_sample<'a>(p: &'a MachineProfile, ty: &str, tokens: i64) -> &'a MatmulSample {
    let found: Vec<&MatmulSample> = p
        .matmul
        .iter()
        .filter(|s| s.device == Device::Cpu && s.ty == ty && s.tokens == tokens && s.experts.is_none() && !s.link_busy)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected one CPU {ty} sample at {tokens} tokens, got {found:?}"
    );
    found[0]
}

/// Checks a tiny profile measured on this machine.
fn check_profile(p: &MachineProfile) {
    pipeshard::engine::init(None).unwrap();
    let gpu = pipeshard::engine::has_gpu();
    assert_eq!(p.mode, ProfileMode::Tiny);
    assert_eq!(p.key.cpu, profile::cpu_model(), "the key names this CPU");
    assert!(!p.key.cpu.is_empty());
    assert_eq!(p.key.threads, 2);
    // No GPU: no link, no GPU name, no GPU memory, no GPU samples.
    assert_eq!(p.link.is_some(), gpu, "link {:?} with GPU present = {gpu}", p.link);
    assert_eq!(p.key.gpu.is_some(), gpu, "{:?}", p.key.gpu);
    assert_eq!(p.has_gpu(), gpu);
    if !gpu {
        assert!(p.link.is_none());
        assert!(p.gpu_memory.is_none());
        assert!(
            p.matmul.iter().all(|s| s.device == Device::Cpu),
            "GPU samples without a GPU"
        );
        assert!(p.attention.iter().all(|s| s.device == Device::Cpu));
    }
    assert!(
        p.cpu_mem_bw.is_finite() && p.cpu_mem_bw > 1e8,
        "memory bandwidth {} B/s",
        p.cpu_mem_bw
    );
    assert!(p.measured_in_s > 0.0 && p.measured_in_s < 60.0, "{}", p.measured_in_s);

    for ty in ["q4_0", "f16"] {
        let one = dense_cpu_sample(p, ty, 1);
        let sixteen = dense_cpu_sample(p, ty, 16);
        for s in [one, sixteen] {
            assert!(s.seconds.is_finite() && s.seconds > 0.0, "{s:?}");
            assert!(s.k > 0 && s.n > 0, "{s:?}");
        }
        assert_eq!((one.k, one.n), (sixteen.k, sixteen.n));
        // No timing comparison here: CI machines are shared and noisy, and
        // speed claims belong to benchmarks, not tests.
    }
    for s in p.matmul.iter().filter(|s| s.device == Device::Cpu) {
        assert!(s.seconds.is_finite() && s.seconds > 0.0, "{s:?}");
    }
    // The expert and attention figures the cost model reads are there too.
    assert!(
        p.matmul.iter().any(|s| s.device == Device::Cpu && s.experts.is_some()),
        "no CPU expert samples"
    );
    assert!(
        p.attention
            .iter()
            .any(|a| a.device == Device::Cpu && a.seconds > 0.0 && a.seconds.is_finite()),
        "no CPU attention samples"
    );

    // The cost model can use it for the CPU, and knows nothing of a GPU.
    let t1 = p.matmul_seconds(Device::Cpu, GgmlType::Q4_0, 4096, 4096, 1, false);
    let t16 = p.matmul_seconds(Device::Cpu, GgmlType::Q4_0, 4096, 4096, 16, false);
    // Not a timing claim: the profile is made monotone in tokens, so a
    // noisy 1-token sample can never predict more than 16 tokens.
    assert!(t1.is_finite() && t1 > 0.0 && t16 >= t1, "{t1} {t16}");
    if !gpu {
        assert!(p
            .matmul_seconds(Device::Gpu, GgmlType::Q4_0, 4096, 4096, 1, false)
            .is_infinite());
    }
}

/// `profile --mode tiny` finishes within a minute and writes a readable,
/// sane profile; `plan` with it refuses cleanly where it is CPU-only, and
/// plans where the machine has a GPU.
#[test]
fn tiny_profile_then_plan() {
    let dir = common::scratch_dir("profile-tiny");
    let yaml = dir.join("p.yaml");
    let out = pipeshard_with_limit(
        &["profile", "--mode", "tiny", "-t", "2", "-o", yaml.to_str().unwrap()],
        &dir,
        Duration::from_secs(120),
    );
    assert_eq!(out.code, Some(0), "profile failed:\n{}", out.stderr);
    assert!(
        out.elapsed < Duration::from_secs(60),
        "profile --mode tiny took {:?}",
        out.elapsed
    );
    assert!(out.stderr.contains("profile written to"), "{}", out.stderr);
    assert!(
        !dir.join("profiles").exists(),
        "profile -o also wrote into the profile directory"
    );

    let p = MachineProfile::load(&yaml).unwrap_or_else(|e| panic!("reading it back: {e}"));
    check_profile(&p);
    // Saving and loading again gives the same profile.
    let copy = dir.join("copy.yaml");
    p.save(&copy).unwrap();
    assert_eq!(MachineProfile::load(&copy).unwrap(), p);
    // The key's file name is stable and distinguishes CPU-only machines.
    if p.key.gpu.is_none() {
        assert!(p.key.file_name().contains("cpu-only"), "{}", p.key.file_name());
    }
    assert!(p.key.file_name().ends_with("__t2.yaml"), "{}", p.key.file_name());

    let model = common::synth_tiny_model(&dir, "tiny-llama3.1-8b", Quant::Q4_0);
    let plan = pipeshard_with_limit(
        &[
            "plan",
            "-m",
            model.to_str().unwrap(),
            "--vram-budget",
            "1GiB",
            "--profile",
            yaml.to_str().unwrap(),
            "-t",
            "2",
        ],
        &dir,
        Duration::from_secs(60),
    );
    if p.has_gpu() {
        // A GPU machine's profile plans the model.
        assert_eq!(
            plan.code,
            Some(0),
            "plan with this GPU machine's profile:\n{}",
            plan.stderr
        );
        assert!(!plan.stdout.trim().is_empty(), "no plan printed");
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    assert_eq!(plan.code, Some(1), "plan with a CPU-only profile:\n{}", plan.stderr);
    assert!(plan.stderr.contains("error:"), "{}", plan.stderr);
    assert!(!plan.stderr.contains("panicked"), "{}", plan.stderr);
    assert!(
        plan.stderr.contains("no GPU measurements"),
        "the message does not say the profile lacks GPU figures:\n{}",
        plan.stderr
    );
    assert!(plan.stdout.trim().is_empty(), "a plan was printed:\n{}", plan.stdout);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without `-o`, a profile goes to the user's data directory
/// (`$XDG_DATA_HOME/pipeshard/profiles`), or where `PIPESHARD_PROFILE_DIR`
/// says; never into the source tree the binary was built from.
#[test]
fn profiles_go_to_the_users_data_directory() {
    let dir = common::scratch_dir("profile-data-dir");
    let data = dir.join("data");
    let repo_profiles = Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles");
    let listing = |d: &Path| -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(d)
            .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        v.sort();
        v
    };
    let repo_before = listing(&repo_profiles);
    let args = ["profile", "--mode", "tiny", "-t", "2"];
    let limit = Duration::from_secs(120);
    let out = pipeshard_with_env(
        &args,
        &dir,
        limit,
        &[
            ("PIPESHARD_PROFILE_DIR", None),
            ("XDG_DATA_HOME", Some(&data)),
            ("HOME", Some(&dir)),
        ],
    );
    assert_eq!(out.code, Some(0), "profile failed:\n{}", out.stderr);
    let written = listing(&data.join("pipeshard/profiles"));
    assert_eq!(written.len(), 1, "{written:?}\n{}", out.stderr);
    assert!(out.stderr.contains(&written[0].display().to_string()), "{}", out.stderr);
    assert!(MachineProfile::load(&written[0]).is_ok());
    // The variable overrides the data directory.
    let over = dir.join("override");
    let out = pipeshard_with_env(
        &args,
        &dir,
        limit,
        &[("PIPESHARD_PROFILE_DIR", Some(&over)), ("XDG_DATA_HOME", Some(&data))],
    );
    assert_eq!(out.code, Some(0), "profile failed:\n{}", out.stderr);
    assert_eq!(listing(&over).len(), 1, "{}", out.stderr);
    assert_eq!(listing(&data.join("pipeshard/profiles")), written);
    assert_eq!(
        listing(&repo_profiles),
        repo_before,
        "a profile was written into the source tree"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The same refusal through the library, with a hand-made CPU-only profile.
#[test]
fn planner_refuses_a_cpu_only_profile() {
    let dir = common::scratch_dir("profile-plan-lib");
    let model = common::synth_tiny_model(&dir, "tiny-qwen3-8b", Quant::Q4_0);
    let (_, info) = pipeshard::gguf::inspect(&model).unwrap();
    let p = common::cpu_only_profile();
    assert!(!p.has_gpu());
    let req = pipeshard::plan::PlanRequest::new(1 << 30, 4096);
    let err = pipeshard::plan::make_plan(&info, &p, &req).unwrap_err();
    assert!(
        matches!(err, pipeshard::plan::PlanError::NoGpuProfile),
        "unexpected error: {err}"
    );
    assert!(err.to_string().contains("no GPU measurements"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn profile_rejects_an_unknown_mode() {
    let dir = common::scratch_dir("profile-bad-mode");
    let out = pipeshard_with_limit(
        &["profile", "--mode", "huge", "-o", dir.join("p.yaml").to_str().unwrap()],
        &dir,
        Duration::from_secs(30),
    );
    // A bad option exits 1 in every tool, as llama-server does.
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("huge"), "{}", out.stderr);
    assert!(out.stderr.contains("tiny"), "valid modes not listed:\n{}", out.stderr);
    assert!(!dir.join("p.yaml").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_models_expert_types_are_measured_once() {
    // A tiny profile of this machine (CPU only here) has Q4_0 expert
    // samples; a Q4_K_M and an MXFP4 MoE model need their own types'.
    let mut p = profile::measure(ProfileMode::Tiny, 2, |_, _| {}).unwrap();
    let q4 = |p: &MachineProfile, ty: &str| {
        p.matmul
            .iter()
            .filter(|s| s.device == Device::Cpu && s.experts.is_some() && s.ty == ty)
            .count()
    };
    assert!(q4(&p, "q4_0") > 0);
    for (quant, types) in [
        // The tiny experts' rows of 128 take upstream's fallbacks for
        // Q4_K and Q6_K (Q5_0, Q8_0).
        (Quant::Q4_K_M, &[GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K][..]),
        (Quant::MXFP4, &[GgmlType::MXFP4][..]),
    ] {
        let info = pipeshard_devtools::synth::model_info("tiny-qwen3-30b-a3b", quant).unwrap();
        let used = profile::TypesUsed::of(&info);
        assert_eq!(used.experts, types, "{quant}");
        let missing = profile::Missing::of(&p, &used);
        let want: Vec<(Device, GgmlType)> = types.iter().map(|&t| (Device::Cpu, t)).collect();
        assert_eq!(missing.experts, want, "{quant}");
        assert!(missing.beside_copies.is_empty(), "no GPU, no copies to run beside");
        let mut steps = Vec::new();
        profile::measure_missing(&mut p, &missing, 2, |done, total| steps.push((done, total))).unwrap();
        let total = profile::missing_steps(&p, &missing);
        assert_eq!(
            steps.last(),
            Some(&(total, total)),
            "{quant}: the progress reaches its total"
        );
        for t in types {
            assert!(q4(&p, t.name()) > 0, "{quant}: no {t} expert samples");
            let s = p.expert_seconds(Device::Cpu, *t, 512, 256, (16, 4), 1);
            assert!(s.is_finite() && s > 0.0, "{quant}: {t} {s}");
        }
        assert!(profile::Missing::of(&p, &used).is_empty(), "{quant}: measured twice");
    }
}
