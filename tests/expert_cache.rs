//! The expert cache (patch 0040) in the cost model: R2's decode, as the
//! planner plans it, is never slower with more budget, at the calibrated
//! band's routing locality and at uniform routing; the decode tier is
//! planned only where its weights beat the cache they displace.

use std::path::Path;

use pipeshard::plan::{self, Locality, Plan, PlanRequest};
use pipeshard::profile::MachineProfile;
use pipeshard_devtools::synth::{self, Quant};

const GIB: u64 = 1 << 30;

/// The H200 host's profile (a frozen copy of the one measured there).
fn h200_profile() -> MachineProfile {
    MachineProfile::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/h200-machine-profile.yaml"))
        .expect("the H200 profile fixture")
}

/// The reference workload (4096-token prompt, 64 generated) at `budget`,
/// the cache priced at `locality`, with the compute buffers a dry run
/// measured on the H200 (R2 at ub 4096: 1138 MiB, 0.48 of the estimate;
/// call 2026-s25-d), where the decode tier's switch and the cache compete
/// as they did there.
fn request(budget: u64, locality: Option<Locality>) -> PlanRequest {
    let mut r = PlanRequest::new(budget, 4352);
    r.reserve = 433 << 20;
    r.cache_locality = locality;
    r.compute_scale = 0.48;
    r
}

/// R2's plan at `budget`, its decode speed as it will run (its decode
/// tier's weights resident where it has one, the cache in the room left),
/// and its predicted seconds for the workload (the switch into the tier
/// included, as the bench's decode time includes it).
fn r2_decode(budget: u64, locality: Option<Locality>) -> (Plan, f64, f64) {
    let info = synth::model_info("qwen3-30b-a3b", Quant::Q4_0).unwrap();
    let profile = h200_profile();
    let req = request(budget, locality);
    let p = plan::make_plan(&info, &profile, &req).unwrap();
    let mut cm = plan::CostModel::new(&info, &profile, req.streaming(), req.pinned, req.overheads, None);
    cm.cache_locality = locality;
    let d = plan::decode_phase(&info, &cm, &req, &p);
    assert_eq!(d.expert_cache, p.expert_cache);
    assert_eq!(d.hybrid_gpu_experts, p.hybrid_gpu_experts);
    let tok_s = d.decode_tok_s;
    let secs = plan::planned_seconds(&info, &cm, &p);
    (p, tok_s, secs)
}

/// Monotonic in the budget as the issue defines it on the GPU (decode at
/// least 0.95x the smaller budget's), and the planned seconds of the
/// workload (TTFT, then 64 tokens) never longer. (The prompt may take
/// longer where the decode gains more: uniform routing at 12 GiB plans ub
/// 2048, TTFT 0.327 s against 0.299 s at 10 GiB, for 78 tok/s against 67.)
#[test]
fn r2_decode_with_the_expert_cache_never_slows_with_more_budget() {
    let uniform = Locality::uniform(128, 8);
    for (point, locality) in [("calibrated", Locality::default()), ("uniform", uniform)] {
        let mut last: Option<(u64, f64, f64)> = None;
        for gib in [4, 5, 6, 7, 8, 10, 12] {
            let (p, tok_s, secs) = r2_decode(gib * GIB, Some(locality));
            // The plan's own figure is the decode priced with its cache
            // (and, without a cache, the output projection's row split).
            let own = p
                .decode_tier
                .as_ref()
                .map_or(p.predicted.decode_tok_s, |t| t.predicted_decode_tok_s);
            match p.expert_cache {
                Some(c) => {
                    assert!(
                        (tok_s - own).abs() <= 1e-9 * own,
                        "{point} {gib} GiB: {tok_s} against {own}"
                    );
                    assert!(c.positions >= p.hybrid_gpu_experts, "{point} {gib} GiB: {c:?}");
                }
                None => assert!(tok_s <= own * (1.0 + 1e-9), "{point} {gib} GiB: {tok_s} against {own}"),
            }
            // Decode as the bench times it: from the prompt's end, the
            // switch into the decode tier included.
            let ttft = p.predicted.ttft_s;
            let gen = p.workload.gen_tokens as f64;
            let tok_s = gen / (secs - ttft);
            eprintln!(
                "{point} {gib} GiB: {tok_s:.1} tok/s ({own:.1} once decoding), TTFT {ttft:.3} s, ub {}, tier {}, cache {:?}, k {}",
                p.ubatch,
                p.decode_tier.is_some(),
                p.expert_cache.map(|c| (c.positions, c.weights, (c.hits * 100.0).round())),
                p.hybrid_gpu_experts
            );
            if let Some((before, s, t)) = last {
                let at = |gib: u64, s: f64, t: f64| format!("{s:.2} tok/s, TTFT {t:.3} s at {gib} GiB");
                let (now, then) = (at(gib, tok_s, ttft), at(before, s, t));
                assert!(tok_s >= 0.95 * s, "{point}: {now}; {then}");
                assert!(secs <= t + gen / s + 1e-9, "{point}: {now}; {then}");
            }
            last = Some((gib, tok_s, ttft));
        }
    }
}
