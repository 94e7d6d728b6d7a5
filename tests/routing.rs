//! The benchmark routing model (issue 40): the calibrated generator's
//! statistics against the band of `moe-routing.md` at every MoE shape it is
//! used for; on a tiny MoE on the CPU, the experts llama.cpp computes with
//! are exactly those the callback chose (patch 0050), driving the selection
//! with the router's own choice gives the plain load's tokens, and `pipeshard
//! bench --routing` writes the point and the selected routing's statistics.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use pipeshard::bench::routing::{Calibration, Router, RoutingPoint};
use pipeshard::bench::routing_stats::{
    experts_for_mass, hot_list_coverage, lru_hit_rate, reuse, top_share, LayerTrace, Recorder, RoutingStats,
};
use pipeshard::engine::{Context, ContextParams, Model, ModelParams, MoeIds, MoeRouteQuery, Token};
use pipeshard_devtools::synth::Quant;

/// The request of the calibration band: a 4096-token prompt and the 64
/// tokens decoded after it.
const REQUEST: usize = 4096 + 64;
const LAYERS: u32 = 6;

/// One request of `tokens` tokens on sequence `seq` from position 0, in
/// ubatches of 512 and then one token at a time (as a prompt and its
/// decode), per layer.
fn request(router: &Router, seq: i32, n_expert: u32, k: u32, tokens: usize) -> Vec<Vec<i32>> {
    let mut layers = vec![Vec::new(); LAYERS as usize];
    let prompt = tokens.saturating_sub(64);
    let mut start = 0;
    while start < tokens {
        let n = if start < prompt { 512.min(prompt - start) } else { 1 };
        let pos: Vec<i32> = (start..start + n).map(|p| p as i32).collect();
        let seqs = vec![seq; n];
        for (layer, out) in layers.iter_mut().enumerate() {
            let q = MoeRouteQuery {
                layer: layer as u32,
                n_expert,
                n_used: k,
                pos: &pos,
                seq: &seqs,
            };
            let mut ids = vec![-1; n * k as usize];
            router.route(&q, &mut ids);
            out.extend_from_slice(&ids);
        }
        start += n;
    }
    layers
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A statistic's band at `n_expert` experts (the band at 128 scaled by
/// the fraction of experts), its achieved value, and whether it is in.
struct Fit {
    name: &'static str,
    lo: f64,
    hi: f64,
    got: f64,
}

fn fits(n_expert: u32, k: u32) -> Vec<Fit> {
    let router = Router::new(RoutingPoint::Calibrated, 7, Calibration::default());
    let a = request(&router, 0, n_expert, k, REQUEST);
    // The same sequence's next request: the popularity has drifted.
    let b = request(&router, 0, n_expert, k, REQUEST);
    let (e, ku) = (n_expert as usize, k as usize);
    let per_layer = |f: &dyn Fn(&[i32]) -> f64| median(a.iter().map(|ids| f(ids)).collect());
    let scale = f64::from(n_expert) / 128.0;
    let drift = median(
        a.iter()
            .zip(&b)
            .map(|(x, y)| (hot_list_coverage(x, y, e, 0.25) + hot_list_coverage(y, x, e, 0.25)) / 2.0)
            .collect(),
    );
    vec![
        Fit {
            name: "LRU hit, 12.5% of experts",
            lo: 0.60,
            hi: 0.72,
            got: per_layer(&|ids| lru_hit_rate(ids, ku, e / 8)),
        },
        Fit {
            name: "LRU hit, 25% of experts",
            lo: 0.75,
            hi: 0.85,
            got: per_layer(&|ids| lru_hit_rate(ids, ku, e / 4)),
        },
        Fit {
            name: "experts for 90% of the mass",
            lo: 55.0 * scale,
            hi: 70.0 * scale,
            got: per_layer(&|ids| experts_for_mass(ids, e, 0.9) as f64),
        },
        Fit {
            name: "top expert's share",
            lo: 0.03 / scale,
            hi: 0.07 / scale,
            got: per_layer(&|ids| top_share(ids, e)),
        },
        Fit {
            name: "hot list (25%) on the next request, x uniform",
            lo: 0.0,
            hi: 1.5,
            got: drift,
        },
        Fit {
            name: "previous-token reuse (reported)",
            lo: 0.0,
            hi: 1.0,
            got: per_layer(&|ids| reuse(ids, ku)),
        },
    ]
}

/// The fit, printed as a table (`--nocapture` shows it), for Qwen3-30B-A3B
/// and GLM-4.5-Air (128 experts, top-8), gpt-oss-120b (128, top-4) and
/// gpt-oss-20b (32, top-4).
#[test]
fn calibrated_generator_fits_the_band_at_every_shape() {
    let mut failed = Vec::new();
    for (shape, e, k) in [
        ("Qwen3-30B-A3B, GLM-4.5-Air", 128, 8),
        ("gpt-oss-120b", 128, 4),
        ("gpt-oss-20b", 32, 4),
    ] {
        println!("\n{shape}: {e} experts, top-{k}, one {REQUEST}-token request, medians over {LAYERS} layers");
        println!("| statistic | target | achieved |\n|---|---|---|");
        for f in fits(e, k) {
            let ok = (f.lo..=f.hi).contains(&f.got);
            println!(
                "| {} | {:.3}-{:.3} | {:.3}{} |",
                f.name,
                f.lo,
                f.hi,
                f.got,
                if ok { "" } else { " (out)" }
            );
            if !ok {
                failed.push(format!(
                    "{shape}: {} = {:.3}, not in {:.3}-{:.3}",
                    f.name, f.got, f.lo, f.hi
                ));
            }
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

/// `uniform` is the floor: each token's experts distinct, the previous
/// token's reused at k/E and an LRU of C experts hit at about C/E (less
/// the token's own experts chosen before).
#[test]
fn uniform_generator_has_no_locality() {
    let router = Router::new(RoutingPoint::Uniform, 7, Calibration::default());
    let (e, k) = (128usize, 8usize);
    for ids in request(&router, 3, e as u32, k as u32, REQUEST) {
        for t in ids.chunks_exact(k) {
            let mut d = t.to_vec();
            d.sort_unstable();
            d.dedup();
            assert_eq!(d.len(), k, "a token's experts are distinct: {t:?}");
            assert!(t.iter().all(|&x| (0..e as i32).contains(&x)));
        }
        let r = reuse(&ids, k);
        assert!((r - k as f64 / e as f64).abs() < 0.01, "reuse {r}");
        // The j-th expert of a token misses the j already chosen.
        let c = e / 4;
        let expected = (0..k).map(|j| (c - j) as f64 / (e - j) as f64).sum::<f64>() / k as f64;
        let h = lru_hit_rate(&ids, k, c);
        assert!((h - expected).abs() < 0.01, "LRU hit at 25%: {h}, expected {expected}");
    }
}

/// The generator is seeded (the same seed routes the same), each token's
/// experts are distinct, the decoded tokens continue the prompt's process,
/// and two sequences (server slots) have processes of their own.
#[test]
fn calibrated_generator_is_seeded_and_per_sequence() {
    let (e, k) = (128u32, 8u32);
    let one = Router::new(RoutingPoint::Calibrated, 1, Calibration::default());
    let same = Router::new(RoutingPoint::Calibrated, 1, Calibration::default());
    let a = request(&one, 0, e, k, 600);
    assert_eq!(a, request(&same, 0, e, k, 600), "same seed, same routing");
    let other = Router::new(RoutingPoint::Calibrated, 2, Calibration::default());
    assert_ne!(a, request(&other, 0, e, k, 600), "another seed routes otherwise");
    for t in a[0].chunks_exact(k as usize) {
        let mut d = t.to_vec();
        d.sort_unstable();
        d.dedup();
        assert_eq!(d.len(), k as usize, "{t:?}");
    }
    // The decoded tokens (one per call) keep the prompt's locality: their
    // reuse is that of the prompt's tokens, not a new request's start.
    let prompt_reuse = reuse(&a[0][..536 * k as usize], k as usize);
    let decode_reuse = reuse(&a[0][535 * k as usize..], k as usize);
    assert!(
        (decode_reuse - prompt_reuse).abs() < 0.15,
        "decode reuse {decode_reuse}, prompt {prompt_reuse}"
    );
    // Sequence 1's request on the same router is a process of its own.
    let s1 = request(&one, 1, e, k, 600);
    assert_ne!(a, s1);
    // A snapshot taken and put back routes the same tokens again.
    let snap = one.snapshot();
    let next = request(&one, 0, e, k, 64);
    one.restore(&snap);
    assert_eq!(next, request(&one, 0, e, k, 64));
}

fn ctx_params() -> ContextParams {
    ContextParams {
        n_ctx: 512,
        n_batch: 128,
        n_ubatch: 64,
        n_threads: Some(2),
        ..Default::default()
    }
}

type Selected = Arc<Mutex<BTreeMap<u32, Vec<i32>>>>;

/// Greedy tokens after `prompt`, with `cp`, and what every MoE layer
/// computed with (the observer's ids, sequence 0).
fn greedy(model: &Model, cp: ContextParams, prompt: &[Token], n: usize) -> (Vec<Token>, BTreeMap<u32, Vec<i32>>) {
    let mut ctx = Context::new(model, cp).expect("context");
    let seen: Selected = Arc::default();
    let s = Arc::clone(&seen);
    ctx.set_moe_observer(Some(Box::new(move |m: &MoeIds<'_>| {
        s.lock()
            .unwrap()
            .entry(m.batch.layer)
            .or_default()
            .extend_from_slice(m.ids);
    })));
    let out = decode_greedy(&mut ctx, prompt, n);
    let seen = seen.lock().unwrap().clone();
    (out, seen)
}

fn plain_greedy(model: &Model, prompt: &[Token], n: usize) -> Vec<Token> {
    let mut ctx = Context::new(model, ctx_params()).expect("context");
    decode_greedy(&mut ctx, prompt, n)
}

/// `n` greedy tokens after `prompt`: the prompt, then each token but the
/// last decoded.
fn decode_greedy(ctx: &mut Context<'_>, prompt: &[Token], n: usize) -> Vec<Token> {
    ctx.decode_tokens(prompt, 0, true).unwrap();
    let mut out = vec![ctx.greedy_token(-1).unwrap()];
    while out.len() < n {
        let pos = (prompt.len() + out.len() - 1) as i32;
        ctx.decode_tokens(&[*out.last().unwrap()], pos, true).unwrap();
        out.push(ctx.greedy_token(-1).unwrap());
    }
    out
}

fn tiny_moe(dir: &Path) -> Model {
    let path = common::synth_tiny_model(dir, "tiny-qwen3-30b-a3b", Quant::Q8_0);
    Model::load(&path, ModelParams::default()).expect("loading the tiny MoE")
}

fn prompt(model: &Model, n: usize) -> Vec<Token> {
    let v = model.n_vocab() as u64;
    (0..n as u64).map(|i| ((i * 7919 + 13) % (v - 1)) as Token).collect()
}

/// Without a routing policy the tokens are the plain load's, observed or
/// not; a policy that feeds back the router's own choices (as observed)
/// gives the same tokens again: the weights are taken from the router's
/// probabilities at the ids given, as for its own selection.
#[test]
fn routing_off_and_the_routers_own_choice_keep_the_tokens() {
    let dir = common::scratch_dir("routing-off");
    let model = tiny_moe(&dir);
    let p = prompt(&model, 100);
    let plain = plain_greedy(&model, &p, 16);
    let (observed, own) = greedy(&model, ctx_params(), &p, 16);
    assert_eq!(plain, observed, "the observer changes nothing");
    assert!(!own.is_empty(), "every MoE layer is observed");
    // Every layer routes the prompt and each decoded token; the last one
    // computes only the outputs (the prompt's last token, then each step).
    let k = 4usize;
    let last = *own.keys().last().unwrap();
    for (&layer, ids) in &own {
        let tokens = if layer == last { 1 + 15 } else { 100 + 15 };
        assert_eq!(ids.len(), tokens * k, "layer {layer}");
    }

    // Replay: each layer's next tokens get the router's own experts, in
    // the order it computed them.
    let cursor = Arc::new(Mutex::new(BTreeMap::<u32, usize>::new()));
    let own = Arc::new(own);
    let (c, o) = (Arc::clone(&cursor), Arc::clone(&own));
    let replay = ContextParams {
        moe_route: Some(Arc::new(move |q: &MoeRouteQuery<'_>, ids: &mut [i32]| {
            let mut c = c.lock().unwrap();
            let at = c.entry(q.layer).or_default();
            ids.copy_from_slice(&o[&q.layer][*at..*at + ids.len()]);
            *at += ids.len();
        })),
        ..ctx_params()
    };
    let (replayed, seen) = greedy(&model, replay, &p, 16);
    assert_eq!(replayed, plain, "the router's own choice, given back, decodes the same");
    assert_eq!(&seen, &*own);
    let _ = std::fs::remove_dir_all(&dir);
}

/// With the calibrated policy the experts every layer computes with are
/// exactly those the policy chose, and their statistics, measured from
/// what llama.cpp selected, are in the band the generator is fitted to.
#[test]
fn calibrated_routing_is_what_llama_cpp_computes_with() {
    let dir = common::scratch_dir("routing-calibrated");
    let model = tiny_moe(&dir);
    let p = prompt(&model, 200);
    let (_, synthetic) = greedy(&model, ctx_params(), &p, 32);

    let router = RoutingPoint::Calibrated.router(5).expect("a generator");
    let policy = router.policy();
    let chosen: Selected = Arc::default();
    let c = Arc::clone(&chosen);
    let cp = ContextParams {
        moe_route: Some(Arc::new(move |q: &MoeRouteQuery<'_>, ids: &mut [i32]| {
            policy(q, ids);
            c.lock().unwrap().entry(q.layer).or_default().extend_from_slice(ids);
        })),
        ..ctx_params()
    };
    let (tokens, selected) = greedy(&model, cp, &p, 32);
    assert_eq!(tokens.len(), 32);
    assert_eq!(
        selected,
        *chosen.lock().unwrap(),
        "llama.cpp computes with the policy's experts"
    );

    let trace = |m: &BTreeMap<u32, Vec<i32>>| -> Vec<LayerTrace> {
        m.values()
            .map(|ids| LayerTrace {
                n_expert: 16,
                n_used: 4,
                ids: ids.clone(),
            })
            .collect()
    };
    let cal = RoutingStats::of_layers(&trace(&selected)).unwrap();
    let syn = RoutingStats::of_layers(&trace(&synthetic)).unwrap();
    println!("synthetic: {syn:?}\ncalibrated: {cal:?}");
    assert_eq!(cal.tokens, 200 + 31);
    // At 16 experts, top-4, the fit is to the LRU of 25% of the experts
    // (12.5% holds less than a token's experts): its band, measured from
    // what llama.cpp selected.
    assert!(
        (0.75..=0.85).contains(&cal.lru_hit_25),
        "LRU hit at 25%: {} (the random router's {})",
        cal.lru_hit_25,
        syn.lru_hit_25
    );
    // The recorder the benchmark uses measures the same.
    let recorder = Recorder::default();
    let mut ctx = Context::new(
        &model,
        ContextParams {
            moe_route: Some(RoutingPoint::Uniform.router(5).unwrap().policy()),
            ..ctx_params()
        },
    )
    .unwrap();
    ctx.set_moe_observer(Some(recorder.observer()));
    ctx.decode_tokens(&p, 0, true).unwrap();
    let uni = recorder.stats().expect("recorded");
    assert_eq!(uni.tokens, 200);
    assert!(uni.reuse < 0.4, "uniform reuse {} (k/E = 0.25)", uni.reuse);
    let _ = std::fs::remove_dir_all(&dir);
}

fn pipeshard(args: &[&str], profile_dir: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pipeshard"))
        .args(args)
        .env("PIPESHARD_PROFILE_DIR", profile_dir)
        .env_remove("PIPESHARD_PROFILE")
        .env_remove("PIPESHARD_VRAM_BUDGET")
        .output()
        .expect("spawning pipeshard")
}

/// `pipeshard bench --routing calibrated` on a tiny MoE: bench.json names
/// the point, the flags name the option, and each row carries the
/// statistics of the routing llama.cpp selected; `results add` takes both
/// into the summary's row. A dense model refuses the option (exit 1).
#[test]
fn bench_json_carries_the_routing_point_and_its_statistics() {
    let dir = common::scratch_dir("routing-bench");
    let path = common::synth_tiny_model(&dir, "tiny-qwen3-30b-a3b", Quant::Q8_0);
    let out_dir = dir.join("out");
    let args = [
        "bench",
        "-m",
        path.to_str().unwrap(),
        "--policies",
        "attn-gpu",
        "-p",
        "96",
        "-n",
        "8",
        "-r",
        "1",
        "--ub",
        "32",
        "-t",
        "2",
        "--vram-budget",
        "1GiB",
        "--routing",
        "calibrated",
        "-o",
        out_dir.to_str().unwrap(),
    ];
    let out = pipeshard(&args, &dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "bench failed:\n{stderr}");
    let json = std::fs::read_to_string(out_dir.join("bench.json")).unwrap();
    let rows: serde_json::Value = serde_json::from_str(&json).unwrap();
    let row = &rows[0];
    assert!(row["error"].is_null(), "{row}");
    assert_eq!(row["run"]["routing"], "calibrated", "{row}");
    assert!(
        row["run"]["flags"].as_str().unwrap().contains("--routing calibrated"),
        "{row}"
    );
    let s: RoutingStats = serde_json::from_value(row["routing_stats"].clone()).expect("routing_stats");
    assert_eq!((s.n_expert, s.n_used, s.tokens), (16, 4, 96 + 8), "{s:?}");
    assert!(s.layers >= 1 && (0.0..1.0).contains(&s.reuse), "{s:?}");
    assert!(stderr.contains("routing selected"), "{stderr}");

    let summary = dir.join("summary.json");
    let add = pipeshard(
        &[
            "results",
            "add",
            "--summary",
            summary.to_str().unwrap(),
            "--call",
            "t",
            "--case",
            "tiny",
            "--system",
            "upstream-attn-gpu",
            "--entry",
            "run",
            "--from",
            "pipeshard-bench",
            out_dir.join("bench.json").to_str().unwrap(),
        ],
        &dir,
    );
    assert_eq!(add.status.code(), Some(0), "{}", String::from_utf8_lossy(&add.stderr));
    let summary: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert_eq!(summary[0]["routing"], "calibrated", "{summary}");
    assert_eq!(
        summary[0]["routing_stats"]["reuse"], row["routing_stats"]["reuse"],
        "{summary}"
    );

    let dense = common::synth_tiny_model(&dir, "tiny-llama3.1-8b", Quant::Q4_0);
    let mut dense_args = args.to_vec();
    dense_args[2] = dense.to_str().unwrap();
    let out = pipeshard(&dense_args, &dir);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--routing applies to MoE models"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The first generated token's log-probability from a `pipeshard-server` on
/// the tiny MoE under a budget, with `extra` options.
fn server_first_prob(model: &Path, dir: &Path, extra: &[&str]) -> f64 {
    let port = common::server::free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pipeshard-server"));
    cmd.args([
        "-m",
        model.to_str().unwrap(),
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
    ])
    .args(["-c", "512", "-np", "2", "-t", "2", "--vram-budget", "1GiB"])
    .args(extra)
    .env("PIPESHARD_PROFILE_DIR", dir);
    let log = dir.join(format!("server-{}.log", extra.len()));
    let mut server = common::server::Server::start(cmd, port, log);
    server.wait_healthy(|_| {});
    let body =
        serde_json::json!({"prompt": "Hello there", "n_predict": 2, "temperature": 0.0, "n_probs": 1}).to_string();
    let reply = ureq::post(&server.url("/completion"))
        .set("Content-Type", "application/json")
        .send_string(&body)
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&reply.into_string().unwrap()).unwrap();
    v["completion_probabilities"][0]["logprob"]
        .as_f64()
        .unwrap_or_else(|| panic!("no probabilities: {v}"))
}

/// `pipeshard-server --bench-routing uniform` drives the experts of the
/// model it serves (the first token's log-probability changes), also where
/// upstream places the model (no GPU here for a plan); a bad point is a bad
/// option (exit 1).
#[test]
fn server_bench_routing_drives_the_served_model() {
    let dir = common::scratch_dir("routing-server");
    let path = common::synth_tiny_model(&dir, "tiny-qwen3-30b-a3b", Quant::Q8_0);
    let own = server_first_prob(&path, &dir, &[]);
    let uniform = server_first_prob(&path, &dir, &["--bench-routing", "uniform"]);
    assert_ne!(own, uniform, "the served model's experts are the routing model's");

    let out = Command::new(env!("CARGO_BIN_EXE_pipeshard-server"))
        .args(["-m", path.to_str().unwrap(), "--bench-routing", "zipf"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--bench-routing"));
    let _ = std::fs::remove_dir_all(&dir);
}
