//! Several devices through the binaries: budgets per device, plans across
//! devices from profiles, and a device behind upstream's `ggml-rpc-server`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn pipeshard(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pipeshard"))
        .args(args)
        .output()
        .expect("spawning pipeshard")
}

/// Exit code 1 (not a signal, not a panic's 101) with a message naming the problem.
fn assert_clean_failure(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "status {:?}, stderr:\n{stderr}", out.status);
    assert!(!stderr.contains("panicked"), "panicked:\n{stderr}");
    assert!(
        stderr.to_lowercase().contains(&needle.to_lowercase()),
        "expected {needle:?} in:\n{stderr}"
    );
}

fn model() -> String {
    common::default_model_path().to_string_lossy().into_owned()
}

#[test]
fn a_device_that_does_not_exist_fails_with_exit_code_1() {
    let m = model();
    let run = pipeshard(&["run", "-m", &m, "-n", "1", "-t", "2", "--vram-budget", "CUDA7=1GiB"]);
    assert_clean_failure(&run, "no device CUDA7");
    let run = pipeshard(&["run", "-m", &m, "-n", "1", "-t", "2", "--vram-budget", "CPU=1GiB"]);
    assert_clean_failure(&run, "the CPU takes no VRAM budget");
    // The server resolves them when the model loads, and exits.
    let port = common::server::free_port().to_string();
    let server = Command::new(env!("CARGO_BIN_EXE_pipeshard-server"))
        .args(["-m", &m, "--port", &port, "--vram-budget", "CUDA7=1GiB"])
        .output()
        .expect("spawning pipeshard-server");
    assert_eq!(server.status.code(), Some(1));
    let log = String::from_utf8_lossy(&server.stderr);
    assert!(log.contains("no device CUDA7") && !log.contains("panicked"), "{log}");
}

#[test]
fn malformed_per_device_budgets_fail_with_exit_code_1() {
    let m = model();
    for (budget, needle) in [
        ("CUDA0=1GiB,2GiB", "mixes sizes"),
        ("CUDA0=lots", "not a size"),
        ("CUDA0=1GiB,cuda0=2GiB", "twice"),
        ("CUDA0=0", "0 bytes"),
    ] {
        let out = pipeshard(&["run", "-m", &m, "-n", "1", "--vram-budget", budget]);
        assert_clean_failure(&out, needle);
    }
    let out = pipeshard(&[
        "run",
        "-m",
        &m,
        "-n",
        "1",
        "--vram-budget",
        "4GiB",
        "--vram-headroom",
        "CUDA0=",
    ]);
    assert_clean_failure(&out, "--vram-headroom");
    // bench's list is a sweep of sizes: pairs are not a sweep.
    let dir = common::scratch_dir("devices-bench");
    let out = pipeshard(&[
        "bench",
        "-m",
        &m,
        "-n",
        "1",
        "-r",
        "1",
        "--vram-budget",
        "CUDA0=1GiB,CUDA1=1GiB",
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert_clean_failure(&out, "not a list of budgets");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Upstream's RPC server, installed beside the backend modules by build.rs.
fn rpc_server_binary() -> PathBuf {
    Path::new(env!("PIPESHARD_BUILD_LIB_DIR")).join("ggml-rpc-server")
}

/// `ggml-rpc-server` on 127.0.0.1 at a free port, killed when dropped.
struct RpcServer {
    child: Child,
    endpoint: String,
}

impl RpcServer {
    fn start() -> RpcServer {
        let port = common::server::free_port();
        let child = Command::new(rpc_server_binary())
            .args(["-H", "127.0.0.1", "-p", &port.to_string(), "-t", "2"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning ggml-rpc-server");
        let endpoint = format!("127.0.0.1:{port}");
        let start = Instant::now();
        while std::net::TcpStream::connect(&endpoint).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "ggml-rpc-server did not listen"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        RpcServer { child, endpoint }
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn greedy_run(m: &str, extra: &[&str]) -> (String, String) {
    let mut args = vec![
        "run",
        "-m",
        m,
        "-p",
        "The capital of France is",
        "-n",
        "24",
        "-t",
        "2",
        "--temp",
        "0",
    ];
    args.extend(extra);
    let out = pipeshard(&args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
}

#[test]
fn a_device_behind_rpc_server_gives_the_local_greedy_tokens() {
    let m = model();
    let server = RpcServer::start();
    let (local, _) = greedy_run(&m, &[]);
    let (remote, log) = greedy_run(&m, &["--rpc", &server.endpoint]);
    // The weights went to the remote device, not the local CPU.
    assert!(log.contains(&format!("RPC0[{}]", server.endpoint)), "{log}");
    assert!(!local.trim().is_empty());
    assert_eq!(remote, local);
}

#[test]
fn an_rpc_server_that_does_not_answer_fails_with_exit_code_1() {
    let port = common::server::free_port();
    let out = pipeshard(&["run", "-m", &model(), "-n", "1", "--rpc", &format!("127.0.0.1:{port}")]);
    assert_clean_failure(&out, "no connection");
}

fn two_gpu_profile() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/two-gpu-devices.yaml")
        .to_string_lossy()
        .into_owned()
}

/// `pipeshard plan` of llama3.1-8b Q4_0 for `budget` on the two-GPU
/// profile, with `extra` arguments.
fn plan_two_gpus(budget: &str, extra: &[&str]) -> Output {
    let profile = two_gpu_profile();
    let mut args = vec![
        "plan",
        "--arch",
        "llama3.1-8b",
        "-c",
        "4096",
        "--vram-budget",
        budget,
        "--profile",
        &profile,
    ];
    args.extend_from_slice(extra);
    pipeshard(&args)
}

/// `pipeshard plan --format json` of llama3.1-8b Q4_0 for `budget`.
fn plan_json(budget: &str) -> serde_json::Value {
    let out = plan_two_gpus(budget, &["--format", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("the plan as JSON")
}

/// Each part's (device, first layer, layers, VRAM total, budget).
fn parts(plan: &serde_json::Value) -> Vec<(String, u64, u64, u64, u64)> {
    plan["parts"]
        .as_array()
        .expect("parts")
        .iter()
        .map(|p| {
            let v = &p["plan"]["vram"];
            (
                p["device"].as_str().unwrap().to_string(),
                p["first_layer"].as_u64().unwrap(),
                p["plan"]["n_layer"].as_u64().unwrap(),
                v["total"].as_u64().unwrap(),
                v["budget"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_plan_across_two_devices_splits_the_layers_in_order_within_each_budget() {
    let plan = plan_json("CUDA0=2GiB,CUDA1=3GiB");
    let p = parts(&plan);
    assert_eq!(p.iter().map(|x| x.0.as_str()).collect::<Vec<_>>(), ["CUDA0", "CUDA1"]);
    // Contiguous, in pipeline order, every layer once.
    assert_eq!(p[0].1, 0);
    assert_eq!(p[1].1, p[0].2);
    assert_eq!(p[0].2 + p[1].2, plan["n_layer"].as_u64().unwrap());
    for (device, _, _, total, budget) in &p {
        assert!(total <= budget, "{device}: {total} over {budget}");
    }
    // Only the first layers may be CPU layers in llama.cpp's layer split:
    // the second device keeps all of its layers' KV.
    let second = &plan["parts"][1]["plan"];
    assert_eq!(second["kv_gpu_layers"], second["n_layer"]);
    assert_eq!(p[0].4, 2 << 30);
    assert_eq!(p[1].4, 3 << 30);
    // The budgets move the split: the larger budget holds more layers.
    let swapped = parts(&plan_json("CUDA0=3GiB,CUDA1=2GiB"));
    assert!(swapped[0].2 > p[0].2, "{swapped:?} vs {p:?}");
    // A second device adds memory: the pair decodes faster than CUDA0 alone.
    let alone = plan_json("CUDA0=2GiB");
    let decode = |v: &serde_json::Value| v["predicted"]["decode_tok_s"].as_f64().unwrap();
    assert!(
        decode(&plan) > decode(&alone),
        "{} vs {}",
        decode(&plan),
        decode(&alone)
    );
}

#[test]
fn a_plan_across_devices_shows_the_split_and_refuses_unknown_devices() {
    let plan = |budget: &str| plan_two_gpus(budget, &[]);
    let out = plan("CUDA0=2GiB,CUDA1=2GiB");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(table.contains("across 2 devices"), "{table}");
    assert!(table.contains("-sm layer -dev CUDA0,CUDA1 -ngl "), "{table}");
    assert!(
        table.contains("CUDA0 (layers 0-") && table.contains("CUDA1 (layers "),
        "{table}"
    );
    assert_clean_failure(&plan("CUDA0=2GiB,CUDA2=2GiB"), "no device CUDA2");
}

/// A devices profile in `dir` that names `devices`, each with the
/// order-of-magnitude GPU profile of the fixtures.
fn devices_profile(dir: &Path, devices: &[&str]) -> String {
    let gpu = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpu-machine-profile.yaml");
    let mut text = String::from("devices:\n");
    for d in devices {
        text.push_str(&format!("  - name: {d}\n    profile: {}\n", gpu.display()));
    }
    std::fs::create_dir_all(dir).expect("a directory for the devices profile");
    let path = dir.join("devices.yaml");
    std::fs::write(&path, text).expect("writing the devices profile");
    path.to_string_lossy().into_owned()
}

/// Two `ggml-rpc-server`s, and a devices profile naming them RPC0 and RPC1
/// in the scratch directory `name` (the directory and the profile's path).
fn two_rpc_devices(name: &str) -> ([RpcServer; 2], PathBuf, String) {
    let servers = [RpcServer::start(), RpcServer::start()];
    let dir = common::scratch_dir(name);
    let profile = devices_profile(&dir, &["RPC0", "RPC1"]);
    (servers, dir, profile)
}

/// Each `loaded:` line of a run across devices: (device, first layer, last
/// layer, weights resident as planned).
fn loaded_parts(log: &str) -> Vec<(String, u32, u32, u32)> {
    log.lines()
        .filter_map(|l| l.strip_prefix("loaded:"))
        .map(|l| {
            let (device, rest) = l.trim().split_once(" (layers ").expect("a device and its layers");
            let (layers, rest) = rest.split_once("): ").expect("the layers' end");
            let (first, last) = layers.split_once('-').expect("first-last");
            let weights = rest.split_whitespace().next().expect("a weight count");
            (
                device.to_string(),
                first.parse().unwrap(),
                last.parse().unwrap(),
                weights.parse().unwrap(),
            )
        })
        .collect()
}

/// Weight bytes (MiB, as `memory:` prints them) on the buffer type whose
/// name holds `endpoint`.
fn model_mib_at(log: &str, endpoint: &str) -> f64 {
    let line = log
        .lines()
        .find(|l| l.starts_with("memory:") && l.contains(endpoint))
        .unwrap_or_else(|| panic!("no memory line for {endpoint}:\n{log}"));
    let after = line.split_once(" model ").expect("model bytes").1;
    after.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn a_plan_across_two_rpc_devices_runs_with_the_local_greedy_tokens() {
    let m = model();
    let ([a, b], dir, profile) = two_rpc_devices("devices-across");
    let rpc = format!("{},{}", a.endpoint, b.endpoint);
    let (local, _) = greedy_run(&m, &[]);
    // Every weight resident, split between the two; then the first
    // device's layers all streamed from host memory, the second's resident.
    // The second device holds SmolLM2's tied output too (28.7 MiB, planned
    // since it is planned at all): at 530 MiB it left room for fewer
    // layers, the first device kept 9 layers' KV cache in host memory, and
    // llama.cpp turned flash attention off for the whole run, which rounds
    // differently from the local run.
    for budget in ["RPC0=600MiB,RPC1=560MiB", "RPC0=500MiB,RPC1=550MiB"] {
        let args = ["--rpc", &rpc, "--vram-budget", budget, "--profile", &profile];
        let (split, log) = greedy_run(&m, &args);
        assert!(log.contains("across 2 devices"), "{budget}: {log}");
        assert_eq!(split, local, "{budget}: {log}");
        let parts = loaded_parts(&log);
        let names: Vec<&str> = parts.iter().map(|p| p.0.as_str()).collect();
        assert_eq!(names, ["RPC0", "RPC1"], "{log}");
        // Contiguous, in order, every layer of SmolLM2's 30 once.
        assert_eq!((parts[0].1, parts[1].1, parts[1].2), (0, parts[0].2 + 1, 29), "{log}");
        // The second device's weights are on its server.
        assert!(parts[1].3 > 0 && model_mib_at(&log, &b.endpoint) > 0.0, "{log}");
    }
    // With every weight resident, the first device's are on its server too;
    // and llama.cpp runs one scheduler copy (its pipeline parallelism, on
    // for a plain split across these devices, reserves compute per copy).
    let args = [
        "run",
        "-m",
        &m,
        "-p",
        "The capital of France is",
        "-n",
        "4",
        "-t",
        "2",
        "--rpc",
        &rpc,
    ];
    let log = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_pipeshard"))
            .args(args)
            .args(extra)
            .env("PIPESHARD_LOG", "info,llama.cpp=debug")
            .output()
            .expect("spawning pipeshard");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(log(&[]).contains("pipeline parallelism enabled"));
    let split = log(&["--vram-budget", "RPC0=600MiB,RPC1=530MiB", "--profile", &profile]);
    assert!(!split.contains("pipeline parallelism enabled"), "{split}");
    assert!(
        loaded_parts(&split)[0].3 > 0 && model_mib_at(&split, &a.endpoint) > 0.0,
        "{split}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_run_across_devices_refuses_what_it_cannot_place_with_exit_code_1() {
    let m = model();
    let server = RpcServer::start();
    let dir = common::scratch_dir("devices-across-bad");
    let profile = devices_profile(&dir, &["RPC0"]);
    let run_on = |budget: &str, rpc: &str, profile: &str| {
        pipeshard(&[
            "run",
            "-m",
            &m,
            "-n",
            "1",
            "-t",
            "2",
            "--rpc",
            rpc,
            "--vram-budget",
            budget,
            "--profile",
            profile,
        ])
    };
    let run = |budget: &str, rpc: &str| run_on(budget, rpc, &profile);
    // A second device that is not there.
    assert_clean_failure(&run("RPC0=600MiB,RPC1=600MiB", &server.endpoint), "no device RPC1");
    // A device the profile does not describe.
    let second = RpcServer::start();
    let two = format!("{},{}", server.endpoint, second.endpoint);
    assert_clean_failure(
        &run("RPC0=600MiB,RPC1=600MiB", &two),
        "the devices profile has no device RPC1",
    );
    // A budget too small for the layers the device is given.
    let both = devices_profile(&dir.join("both"), &["RPC0", "RPC1"]);
    let out = run_on("RPC0=10MiB,RPC1=600MiB", &two, &both);
    assert_clean_failure(&out, "RPC0 (layers 0-");
    // A server that went away.
    let port = common::server::free_port();
    let down = format!("{},127.0.0.1:{port}", server.endpoint);
    assert_clean_failure(&run("RPC0=600MiB,RPC1=600MiB", &down), "no connection");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_server_runs_a_plan_across_two_rpc_devices_and_reports_each() {
    let m = model();
    let ([a, b], dir, profile) = two_rpc_devices("devices-server");
    let (local, _) = greedy_run(&m, &[]);
    let port = common::server::free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pipeshard-server"));
    cmd.args([
        "-m",
        &m,
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "-c",
        "4096",
        "-np",
        "1",
        "-t",
        "2",
    ])
    .args(["--rpc", &format!("{},{}", a.endpoint, b.endpoint)])
    .args([
        "--vram-budget",
        "RPC0=700MiB,RPC1=700MiB",
        "--profile",
        &profile,
        "--metrics",
    ]);
    let mut server = common::server::Server::start(cmd, port, dir.join("server.log"));
    server.wait_healthy(|_| {});
    let body = serde_json::json!({"prompt": "The capital of France is", "n_predict": 24, "temperature": 0});
    let answer = ureq::post(&server.url("/completion"))
        .set("Content-Type", "application/json")
        .send_string(&body.to_string())
        .expect("a completion")
        .into_string()
        .unwrap();
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["content"].as_str().unwrap(), local.trim_end_matches('\n'));
    let metrics = ureq::get(&server.url("/metrics"))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    let layers = |device: &str| -> u64 {
        let key = format!("pipeshard_device_layers{{device=\"{device}\"}} ");
        let line = metrics.lines().find(|l| l.starts_with(&key));
        line.and_then(|l| l[key.len()..].parse().ok())
            .unwrap_or_else(|| panic!("no {key} in:\n{metrics}"))
    };
    assert!(layers("RPC0") > 0 && layers("RPC1") > 0, "{metrics}");
    assert_eq!(layers("RPC0") + layers("RPC1"), 30);
    assert!(
        metrics.contains("pipeshard_device_vram_budget_bytes{device=\"RPC1\"} 734003200"),
        "{metrics}"
    );
    let props = ureq::get(&server.url("/props")).call().unwrap().into_string().unwrap();
    let props: serde_json::Value = serde_json::from_str(&props).unwrap();
    assert_eq!(props["pipeshard"]["plan"]["devices"][1]["device"], "RPC1", "{props}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
