//! Live re-planning on the CPU (`--vram-budget auto`): a scripted card
//! (the free-memory seam) drives the re-plan loop for R2's shape
//! (Qwen3-30B-A3B, Q4_0) with the GPU machine's profile fixture. The plan
//! follows every change of the card with the launch's cost model and
//! shape, the migrations are the ordered differences between plans,
//! demotions first, the per-op decisions in force switch with the plan,
//! the metrics follow, and oscillation costs no re-plan storm.
//!
//! Most migrations here are carried out by a recorder that stands in for
//! the engine; the last test moves real weights of the default model with
//! the engine (patch 0023; without a GPU both residences are host memory,
//! so a move still reallocates, copies and frees) in the middle of a greedy
//! generation, and the tokens stay those of a generation without it. The
//! server test on the GPU machine moves weights between VRAM and host.

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pipeshard::engine::{MigrationReport, Offload, OffloadQuery, OpKind, Residence};
use pipeshard::gguf::ModelInfo;
use pipeshard::launch::live::{
    hysteresis, moves, CardSample, Follower, Hooks, MigrationFailure, Move, ReplanBasis, TraceSource,
};
use pipeshard::plan::{self, Exec, Plan, PlanRequest, PolicySwitch};
use pipeshard::profile::MachineProfile;
use pipeshard::synth::{self, Quant};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const HEADROOM: u64 = 512 * MIB;

fn fixture() -> MachineProfile {
    MachineProfile::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpu-machine-profile.yaml"))
        .expect("the fixture profile")
}

fn r2() -> ModelInfo {
    synth::model_info("qwen3-30b-a3b", Quant::Q4_0).unwrap()
}

/// The launch plan at `budget` and the re-plan basis made from it.
fn launched(budget: u64, exact: bool) -> (Plan, ReplanBasis) {
    let (info, profile) = (r2(), fixture());
    let mut req = PlanRequest::new(budget, 4352);
    req.exact = exact;
    let plan = plan::make_plan(&info, &profile, &req).unwrap();
    let basis = ReplanBasis::new(info, profile, req, &plan);
    (plan, basis)
}

/// A card of 80 GiB of which others leave `allowance` (+ the headroom).
fn card(allowance: u64, own: Option<u64>) -> CardSample {
    CardSample {
        total: 80 * GIB,
        others: 80 * GIB - allowance - HEADROOM,
        own,
    }
}

/// Stands in for the engine's migration: records the moves and reports
/// their bytes.
#[derive(Default, Clone)]
struct Recorder(Arc<Mutex<Vec<Vec<Move>>>>);

impl Recorder {
    fn migrate(&self, moves: &[Move]) -> Result<MigrationReport, MigrationFailure> {
        self.0.lock().unwrap().push(moves.to_vec());
        let (freed, taken) = moves::device_bytes(moves);
        Ok(MigrationReport {
            moved: moves.len(),
            bytes_to_host: freed,
            bytes_to_device: taken,
            device_bytes_freed: freed,
            to_home: 0,
            elapsed: Duration::from_millis(5),
        })
    }
}

/// Feed `sample` every SAMPLE_EVERY from `*t` for `secs` seconds, applying
/// what is posted between "batches" as the server's loop does.
fn run(f: &Follower, rec: &Recorder, t: &mut Duration, secs: f64, sample: impl Fn(Duration) -> CardSample) {
    let end = *t + Duration::from_secs_f64(secs);
    while *t < end {
        f.step(*t, Some(sample(*t)));
        f.apply_pending(|m, _| rec.migrate(m));
        *t += hysteresis::SAMPLE_EVERY;
    }
}

fn resident(p: &Plan) -> HashSet<String> {
    p.tensors
        .iter()
        .filter(|t| t.resident)
        .map(|t| t.name.clone())
        .collect()
}

#[test]
fn the_plan_follows_the_card_down_and_back_up() {
    let (plan0, basis) = launched(8 * GIB, false);
    let switched = Arc::new(AtomicUsize::new(0));
    let s2 = Arc::clone(&switched);
    let hooks = Hooks {
        wake: Box::new(|| {}),
        switched: Box::new(move |_, _| {
            s2.fetch_add(1, Ordering::Relaxed);
        }),
    };
    let f = Follower::new(basis.clone(), plan0.clone(), 8 * GIB, Some(HEADROOM), hooks);
    let rec = Recorder::default();
    let mut t = Duration::ZERO;
    // Steady at the launch budget: nothing moves.
    run(&f, &rec, &mut t, 2.0, |_| card(8 * GIB, None));
    assert_eq!(f.stats().replans, 0);
    assert!(rec.0.lock().unwrap().is_empty());

    // Another program takes 2 GiB, then 2 GiB more, then frees them.
    let mut last = plan0.clone();
    for (allowance, secs) in [(6 * GIB, 5.0), (4 * GIB, 5.0), (8 * GIB, 10.0)] {
        let before = rec.0.lock().unwrap().len();
        run(&f, &rec, &mut t, secs, |_| card(allowance, None));
        let p = f.in_force();
        let s = f.stats();
        assert!(
            p.vram.total <= allowance,
            "plan {} over the allowance {allowance}",
            p.vram.total
        );
        assert_eq!(s.allowance, allowance);
        assert!(!s.unfit);
        // One migration per change, from the plan before to this one.
        let batches = rec.0.lock().unwrap();
        assert_eq!(batches.len(), before + 1, "{allowance}");
        let mv = batches.last().unwrap();
        let (old, new) = (resident(&last), resident(&p));
        let to_host: HashSet<String> = mv
            .iter()
            .filter(|m| m.to == Residence::Host)
            .map(|m| m.tensor.clone())
            .collect();
        let to_dev: HashSet<String> = mv
            .iter()
            .filter(|m| m.to == Residence::Device)
            .map(|m| m.tensor.clone())
            .collect();
        assert_eq!(to_host, old.difference(&new).cloned().collect());
        assert_eq!(to_dev, new.difference(&old).cloned().collect());
        // Demotions first.
        let first_up = mv.iter().position(|m| m.to == Residence::Device).unwrap_or(mv.len());
        assert!(mv[first_up..].iter().all(|m| m.to == Residence::Device));
        // The plan is the one a fresh launch makes with the same shape at
        // that budget, so it predicts what a fresh start would.
        let fresh = basis.plan(s.budget).unwrap().plan;
        assert_eq!(resident(&fresh), new);
        assert_eq!(p.ubatch, plan0.ubatch);
        assert_eq!(p.tiers, plan0.tiers);
        assert_eq!(p.kv_gpu_layers, plan0.kv_gpu_layers);
        assert_eq!(s.predicted_decode_tok_s, p.predicted.decode_tok_s);
        last = p;
    }
    let s = f.stats();
    assert_eq!(s.replans, 3);
    assert_eq!(switched.load(Ordering::Relaxed), 3);
    assert!((s.total_migration_s - 0.015).abs() < 1e-9);
    // Shrinking lowers the prediction, growing back restores it (within
    // what the slack leaves).
    assert!(last.predicted.decode_tok_s <= plan0.predicted.decode_tok_s * 1.0001);
    assert!(last.predicted.decode_tok_s >= plan0.predicted.decode_tok_s * 0.85);
    // The metrics say so.
    let m = pipeshard::server_hook::live_metrics(&s);
    assert!(m.contains("pipeshard_replans_total 3\n"), "{m}");
    assert!(
        m.contains(&format!("pipeshard_vram_allowance_bytes {}\n", 8 * GIB)),
        "{m}"
    );
    assert!(m.contains("pipeshard_plan_unfit 0\n"), "{m}");
    assert!(m.contains("pipeshard_migration_last_seconds 0.005000\n"), "{m}");
}

#[test]
fn promotions_go_by_value_per_byte_after_every_demotion() {
    let (plan0, basis) = launched(4 * GIB, false);
    let big = basis.plan(12 * GIB).unwrap().plan;
    let value = basis.value_per_byte(&plan0);
    let up = moves::diff(&plan0, &big, &value);
    assert!(!up.is_empty() && up.iter().all(|m| m.to == Residence::Device));
    let v: Vec<f64> = up.iter().map(|m| value[&m.tensor]).collect();
    assert!(v.windows(2).all(|w| w[0] >= w[1]), "{v:?}");
    let down = moves::diff(&big, &plan0, &value);
    assert!(down.iter().all(|m| m.to == Residence::Host));
    let v: Vec<f64> = down.iter().map(|m| value[&m.tensor]).collect();
    assert!(v.windows(2).all(|w| w[0] <= w[1]), "{v:?}");
}

#[test]
fn the_decisions_in_force_switch_with_the_plan() {
    let (plan0, basis) = launched(8 * GIB, true);
    let small = basis.plan(3 * GIB).unwrap().plan;
    let switch = PolicySwitch::new(&plan0);
    let mut cp = pipeshard::engine::ContextParams::default();
    switch.install(&mut cp);
    let offload = cp.offload.clone().unwrap();
    let demoted = plan0
        .tensors
        .iter()
        .zip(&small.tensors)
        .find(|(a, b)| a.resident && !b.resident)
        .map(|(a, _)| a.name.clone())
        .expect("a weight demoted at 3 GiB");
    let q = OffloadQuery {
        weight: &demoted,
        op: OpKind::MulMat,
        n_tokens: 1,
    };
    assert_eq!(offload(&q), Offload::Default, "resident: llama.cpp's own placement");
    switch.switch(&small);
    // Exact mode streams every host weight to the GPU.
    let t = small.tensors.iter().find(|t| t.name == demoted).unwrap();
    assert!(t.exec.iter().all(|(_, e)| *e == Exec::Stream));
    assert_eq!(offload(&q), Offload::Gpu);
    switch.switch(&plan0);
    assert_eq!(offload(&q), Offload::Default);
}

#[test]
fn oscillation_costs_no_storm() {
    let (plan0, basis) = launched(8 * GIB, false);
    let f = Follower::new(basis, plan0, 8 * GIB, Some(HEADROOM), Hooks::default());
    let rec = Recorder::default();
    let mut t = Duration::ZERO;
    // 2 GiB taken and freed every 400 ms for a minute.
    run(&f, &rec, &mut t, 60.0, |t| {
        card(
            if (t.as_millis() / 400) % 2 == 1 {
                6 * GIB
            } else {
                8 * GIB
            },
            None,
        )
    });
    assert_eq!(f.stats().replans, 1, "{:?}", f.stats());
    // 4 GiB every 6 s for two minutes: a flap, then the hold outlasts it.
    let before = f.stats().replans;
    run(&f, &rec, &mut t, 120.0, |t| {
        card(if (t.as_secs() / 6) % 2 == 1 { 4 * GIB } else { 8 * GIB }, None)
    });
    assert!(f.stats().replans - before <= 3, "{:?}", f.stats());
}

#[test]
fn below_the_smallest_plan_it_serves_on_and_says_so() {
    let (plan0, basis) = launched(8 * GIB, false);
    let f = Follower::new(basis.clone(), plan0, 8 * GIB, Some(HEADROOM), Hooks::default());
    let rec = Recorder::default();
    let mut t = Duration::ZERO;
    run(&f, &rec, &mut t, 3.0, |_| card(256 * MIB, None));
    let s = f.stats();
    assert!(s.unfit);
    let smallest = basis.plan(0).unwrap();
    assert!(!smallest.fits);
    assert_eq!(resident(&f.in_force()), resident(&smallest.plan));
    assert!(pipeshard::server_hook::live_metrics(&s).contains("pipeshard_plan_unfit 1\n"));
    // Room again: it grows back and the gauge clears.
    run(&f, &rec, &mut t, 10.0, |_| card(8 * GIB, None));
    assert!(!f.stats().unfit);
    assert!(f.in_force().vram.weights > 0);
}

#[test]
fn memory_beyond_the_plan_comes_off_the_next_budget() {
    // The process holds 600 MiB more than its plan says (CUDA's pools):
    // a shrink plans for the allowance less that excess.
    let (plan0, basis) = launched(8 * GIB, false);
    let excess = 600 * MIB;
    let f = Follower::new(basis, plan0.clone(), 8 * GIB, Some(HEADROOM), Hooks::default());
    let rec = Recorder::default();
    let mut t = Duration::ZERO;
    // What NVML reports follows the plan in force.
    run(&f, &rec, &mut t, 5.0, |_| {
        card(6 * GIB, Some(f.in_force().vram.total + excess))
    });
    let p = f.in_force();
    assert!(p.vram.total + excess <= 6 * GIB, "{} + {excess}", p.vram.total);
    assert_eq!(f.stats().replans, 1);
}

#[test]
fn the_sampling_thread_follows_a_trace_and_wakes_the_loop() {
    let (plan0, basis) = launched(8 * GIB, false);
    let woken = Arc::new(AtomicUsize::new(0));
    let w = Arc::clone(&woken);
    let hooks = Hooks {
        wake: Box::new(move || {
            w.fetch_add(1, Ordering::Relaxed);
        }),
        ..Hooks::default()
    };
    let trace = TraceSource::parse(&format!(
        "0 80GiB {}\n0.3 80GiB {}\n",
        80 * GIB - 8 * GIB - HEADROOM,
        80 * GIB - 6 * GIB - HEADROOM
    ))
    .unwrap();
    let dir = std::env::temp_dir().join(format!("pipeshard-replan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let record = dir.join("card.trace");
    let f = Follower::new(basis, plan0, 8 * GIB, Some(HEADROOM), hooks);
    f.record_to(&record).unwrap();
    f.spawn(Box::new(trace)).unwrap();
    let start = std::time::Instant::now();
    while f.pending().is_none() && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let posted = start.elapsed();
    f.stop();
    let p = f.pending().expect("a re-plan posted");
    // 300 ms until the change, then two samples 50 ms apart (and planning).
    assert!(posted < Duration::from_secs(2), "{posted:?}");
    assert!(woken.load(Ordering::Relaxed) >= 1);
    assert!(p.moves.iter().all(|m| m.to == Residence::Host));
    assert!(p.replanned.plan.vram.total <= 6 * GIB);
    // The recording replays as a trace.
    let replay = TraceSource::load(&record).unwrap();
    assert!(replay.rows().len() >= 6);
    assert_eq!(
        replay.rows().last().unwrap().sample.others,
        80 * GIB - 6 * GIB - HEADROOM
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tokens_stay_identical_across_a_live_demotion_in_exact_mode() {
    use pipeshard::engine::{self, Context, ContextParams, Model, ModelParams, SamplingParams};
    use pipeshard::generate::{generate, generate_between, GenerateRequest};
    use pipeshard::launch::live;

    let path = common::default_model_path();
    engine::init(None).unwrap();
    let (_, info) = pipeshard::gguf::inspect(&path).unwrap();
    let profile = fixture();
    let n_ctx = 512;
    let mut req = PlanRequest::new(0, n_ctx);
    req.exact = true;
    let minimum = match plan::make_plan(&info, &profile, &req) {
        Err(plan::PlanError::BudgetTooSmall { minimum, .. }) => minimum,
        other => panic!("{other:?}"),
    };
    // Launched with room for every weight; then the card leaves a little
    // less than the plan uses: the model is small enough (66 MB of
    // weights) that the re-plan, 256 MiB under the allowance, is the
    // smallest plan, every weight on the host.
    req.budget = minimum + 600 * MIB;
    let plan0 = plan::make_plan(&info, &profile, &req).unwrap();
    assert!(plan0.exact);
    let basis = ReplanBasis::new(info, profile, req, &plan0);
    let f = Follower::new(
        basis,
        plan0.clone(),
        plan0.vram.budget,
        Some(HEADROOM),
        Hooks::default(),
    );

    let model = Model::load(
        &path,
        ModelParams {
            n_gpu_layers: 0,
            use_mmap: false,
            movable_weights: true,
            ..Default::default()
        },
    )
    .unwrap();
    let cp = ContextParams {
        n_ctx: n_ctx as u32,
        ..Default::default()
    };
    let prompt = model.tokenize("The three primary colours are", true, false).unwrap();
    let gen = GenerateRequest::new(prompt, 24, SamplingParams::greedy());
    let reference = {
        let mut ctx = Context::new(&model, cp.clone()).unwrap();
        generate(&mut ctx, &gen, |_| true).unwrap().tokens
    };

    let mut ctx = Context::new(&model, cp).unwrap();
    let mut step = 0;
    let mut t = Duration::ZERO;
    let mut applied = Vec::new();
    let out = generate_between(&mut ctx, &gen, |_| true, &mut |ctx| {
        step += 1;
        // The card shrinks after 8 tokens: the next two samples decide, and
        // the move happens before the next decode.
        if step >= 8 {
            f.step(t, Some(card(plan0.vram.total - 16 * MIB, None)));
            t += hysteresis::SAMPLE_EVERY;
        }
        if let Some(r) = f.apply_pending(|moves, slots| live::migrate(ctx.context_ref(), moves, slots)) {
            applied.push((step, r));
        }
    })
    .unwrap();
    assert_eq!(applied.len(), 1, "{applied:?}");
    let (at, result) = &applied[0];
    let m = result.as_ref().expect("the engine moved the weights");
    assert!(*at < 24 && m.moved > 0 && m.bytes_to_host > 0, "{m:?}");
    assert_eq!(f.stats().replans, 1);
    assert!(f.stats().unfit);
    let demoted: Vec<String> = plan0
        .tensors
        .iter()
        .filter(|t| t.resident && !f.in_force().tensors.iter().any(|n| n.name == t.name && n.resident))
        .map(|t| t.name.clone())
        .collect();
    assert_eq!(demoted.len(), m.moved);
    assert_eq!(out.tokens, reference, "the tokens changed across the migration");
}

#[test]
fn a_failed_migration_keeps_the_plan_where_the_weights_are() {
    let (plan0, basis) = launched(8 * GIB, false);
    let f = Follower::new(basis, plan0.clone(), 8 * GIB, Some(HEADROOM), Hooks::default());
    let shrink = |f: &Follower, t: &mut Duration| {
        for _ in 0..2 {
            f.step(*t, Some(card(6 * GIB, None)));
            *t += hysteresis::SAMPLE_EVERY;
        }
        assert!(f.pending().is_some());
    };
    let mut t = Duration::ZERO;
    // Nothing moved: the plan before stays in force.
    shrink(&f, &mut t);
    let r = f.apply_pending(|_, _| {
        Err(MigrationFailure {
            message: "out of memory".into(),
            all_moved: false,
        })
    });
    assert!(r.unwrap().is_err());
    assert_eq!(resident(&f.in_force()), resident(&plan0));
    assert_eq!((f.stats().failures, f.stats().replans), (1, 0));
    // The loop tries again once SHRINK_RETRY has passed.
    t += hysteresis::SHRINK_RETRY;
    shrink(&f, &mut t);
    // Every weight moved but the compute buffers could not be reserved:
    // the new plan is where the weights are.
    let next = f.pending().unwrap().replanned.plan;
    f.apply_pending(|_, _| {
        Err(MigrationFailure {
            message: "compute".into(),
            all_moved: true,
        })
    });
    assert_eq!(resident(&f.in_force()), resident(&next));
    assert_eq!(f.stats().failures, 2);
}

#[test]
fn below_the_smallest_plan_with_the_launchs_slots_the_slots_shrink() {
    let (plan0, basis) = launched(8 * GIB, false);
    assert_eq!(plan0.stream_slots, 4);
    let minimum = |slots: u32| {
        let mut r = basis.request.clone();
        r.stream_slots = slots;
        r.budget = 0;
        match plan::make_plan(&basis.info, &basis.profile, &r) {
            Err(plan::PlanError::BudgetTooSmall { minimum, .. }) => minimum,
            other => panic!("{other:?}"),
        }
    };
    let (m4, m3, m2) = (minimum(4), minimum(3), minimum(2));
    assert!(m2 < m3 && m3 < m4, "{m2} {m3} {m4}");
    // The most slots that fit.
    let r = basis.plan((m3 + m4) / 2).unwrap();
    assert!(r.fits);
    assert_eq!(r.plan.stream_slots, 3);
    let r = basis.plan((m2 + m3) / 2).unwrap();
    assert!(r.fits);
    assert_eq!(r.plan.stream_slots, 2);
    // Below two slots' smallest plan: the smallest plan, with two slots.
    let r = basis.plan(m2 - 1).unwrap();
    assert!(!r.fits);
    assert_eq!((r.plan.stream_slots, r.plan.vram.total), (2, m2));
    // Through the loop: the migration changes the slots first, and growing
    // back restores the launch's.
    let f = Follower::new(basis, plan0, 8 * GIB, Some(HEADROOM), Hooks::default());
    let slots_seen = Mutex::new(Vec::new());
    let mut t = Duration::ZERO;
    for (allowance, secs) in [((m2 + m3) / 2 + hysteresis::SLACK, 1.0), (8 * GIB, 5.0)] {
        let end = t + Duration::from_secs_f64(secs);
        while t < end {
            f.step(t, Some(card(allowance, None)));
            f.apply_pending(|m, s| {
                slots_seen.lock().unwrap().push(s.map(|s| s.n));
                Recorder::default().migrate(m)
            });
            t += hysteresis::SAMPLE_EVERY;
        }
    }
    assert_eq!(*slots_seen.lock().unwrap(), vec![Some(2), Some(4)]);
    assert!(!f.stats().unfit);
    assert_eq!(f.in_force().stream_slots, 4);
}
