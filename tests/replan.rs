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
    hysteresis, moves, CardSample, Follower, Hooks, LiveEngine, MigrationFailure, Move, ReplanBasis, Slots, Staged,
    TraceSource,
};
use pipeshard::plan::{self, Exec, Plan, PlanRequest, PolicySwitch};
use pipeshard::profile::MachineProfile;
use pipeshard_devtools::synth::{self, Quant};

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

/// A follower on the plan launched at 8 GiB, with the default headroom
/// and hooks; and that plan.
fn follower_at_8gib() -> (Follower, Plan) {
    let (plan0, basis) = launched(8 * GIB, false);
    let f = Follower::new(basis, plan0.clone(), 8 * GIB, Some(HEADROOM), Hooks::default());
    (f, plan0)
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
            side_copy: Duration::ZERO,
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

/// The resident weights a move can take elsewhere (a tied output stays
/// where it was loaded).
fn resident(p: &Plan) -> HashSet<String> {
    p.tensors
        .iter()
        .filter(|t| t.resident && !t.tied)
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
    let (f, _) = follower_at_8gib();
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
    let (f, _) = follower_at_8gib();
    let excess = 600 * MIB;
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

/// The default model under an exact plan with the real engine: a follower
/// launched at `extra` bytes over the smallest budget, the model loaded on
/// the CPU with movable weights, and the greedy tokens of a generation that
/// moves nothing.
struct ExactRun {
    f: Follower,
    plan0: Plan,
    model: pipeshard::engine::Model,
    cp: pipeshard::engine::ContextParams,
    gen: pipeshard::generate::GenerateRequest,
    reference: Vec<pipeshard::engine::Token>,
}

fn exact_run(extra: u64) -> ExactRun {
    use pipeshard::engine::{self, Context, ContextParams, Model, ModelParams, SamplingParams};
    use pipeshard::generate::{generate, GenerateRequest};

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
    req.budget = minimum + extra;
    let plan0 = plan::make_plan(&info, &profile, &req).unwrap();
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
    ExactRun {
        f,
        plan0,
        model,
        cp,
        gen,
        reference,
    }
}

#[test]
fn tokens_stay_identical_across_a_live_demotion_in_exact_mode() {
    use pipeshard::engine::Context;
    use pipeshard::generate::generate_between;
    use pipeshard::launch::live;

    // Launched with room for every weight; then the card leaves a little
    // less than the plan uses: the model is small enough (66 MB of
    // weights) that the re-plan, 256 MiB under the allowance, is the
    // smallest plan, every weight on the host.
    let ExactRun {
        f,
        plan0,
        model,
        cp,
        gen,
        reference,
    } = exact_run(600 * MIB);
    assert!(plan0.exact);

    let mut ctx = Context::new(&model, cp).unwrap();
    let mut step = 0;
    let mut t = Duration::ZERO;
    let mut applied = Vec::new();
    let out = generate_between(&mut ctx, &gen, |_| true, &mut |ctx| {
        step += 1;
        // The card shrinks after 8 tokens: the next two samples decide, and
        // the move happens before the next decode.
        if step >= 8 {
            // The process holds 1 GiB more than its plan (as NVML would
            // say): far enough above the smallest plan that moving to it
            // frees memory that counts.
            f.step(t, Some(card(plan0.vram.total - 16 * MIB, Some(plan0.vram.total + GIB))));
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
        .filter(|t| t.resident && !t.tied && !f.in_force().tensors.iter().any(|n| n.name == t.name && n.resident))
        .map(|t| t.name.clone())
        .collect();
    assert_eq!(demoted.len(), m.moved);
    assert_eq!(out.tokens, reference, "the tokens changed across the migration");
}

#[test]
fn a_failed_migration_keeps_the_plan_where_the_weights_are() {
    let (f, plan0) = follower_at_8gib();
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

/// Stands in for the engine on the server's path
/// ([`Follower::between_batches`]): records each call, stages promotions
/// until told their copies are complete.
#[derive(Default)]
struct SideEngine {
    calls: Vec<String>,
    staged: Option<Vec<Move>>,
    ready: bool,
}

impl LiveEngine for SideEngine {
    fn migrate(&mut self, moves: &[Move], _: Option<Slots>) -> Result<MigrationReport, MigrationFailure> {
        assert!(self.staged.is_none(), "a migration while a promotion is staged");
        self.calls.push(format!("migrate {}", moves.len()));
        Recorder::default().migrate(moves)
    }

    fn stage(&mut self, moves: &[Move]) -> Result<(), MigrationFailure> {
        assert!(self.staged.is_none(), "staged twice");
        assert!(moves.iter().all(|m| m.to == Residence::Device), "{moves:?}");
        self.calls.push(format!("stage {}", moves.len()));
        self.staged = Some(moves.to_vec());
        self.ready = false;
        Ok(())
    }

    fn staged(&mut self) -> Staged {
        assert!(self.staged.is_some());
        if self.ready {
            Staged::Ready
        } else {
            Staged::Copying
        }
    }

    fn cancel(&mut self) {
        self.calls.push("cancel".into());
        self.staged = None;
    }

    fn commit(&mut self, _: Option<Slots>) -> Result<MigrationReport, MigrationFailure> {
        let moves = self.staged.take().expect("a staged promotion");
        self.calls.push(format!("commit {}", moves.len()));
        Ok(MigrationReport {
            moved: moves.len(),
            bytes_to_device: moves::device_bytes(&moves).1,
            elapsed: Duration::from_millis(4),
            side_copy: Duration::from_millis(120),
            ..Default::default()
        })
    }
}

fn run_side(f: &Follower, e: &mut SideEngine, t: &mut Duration, secs: f64, allowance: u64) {
    let end = *t + Duration::from_secs_f64(secs);
    while *t < end {
        f.step(*t, Some(card(allowance, None)));
        f.between_batches(e);
        *t += hysteresis::SAMPLE_EVERY;
    }
}

/// On the server's path a growing allowance stages the promotion: the plan
/// before stays in force (its weights are still on the host) while the
/// copies go on, and the new plan goes in force when they are complete,
/// with its copy time and its pause apart in the metrics. A shrink that
/// comes while a promotion is staged cancels it before anything is
/// demoted.
#[test]
fn a_promotion_is_staged_and_a_shrink_cancels_it_before_demoting() {
    let (f, _) = follower_at_8gib();
    let mut e = SideEngine::default();
    let mut t = Duration::ZERO;

    // Down to 6 GiB: demoted at once.
    run_side(&f, &mut e, &mut t, 1.0, 6 * GIB);
    assert_eq!(e.calls.len(), 1, "{:?}", e.calls);
    assert!(e.calls[0].starts_with("migrate"), "{:?}", e.calls);
    let at6 = f.in_force();

    // Back up to 8 GiB: staged, and the 6 GiB plan stays in force while
    // the copies go on.
    run_side(&f, &mut e, &mut t, 5.0, 8 * GIB);
    assert_eq!(e.calls.len(), 2, "{:?}", e.calls);
    assert!(e.calls[1].starts_with("stage"), "{:?}", e.calls);
    let staged = f.staged().expect("a staged promotion");
    assert!(resident(&staged.replanned.plan).len() > resident(&at6).len());
    assert_eq!(resident(&f.in_force()), resident(&at6));
    assert!(f.stats().staging);
    assert_eq!(f.stats().replans, 1);

    // Down to 5 GiB before the copies complete: the stage is cancelled
    // (its device memory freed), then the weights are demoted from the
    // plan in force.
    run_side(&f, &mut e, &mut t, 1.0, 5 * GIB);
    assert_eq!(e.calls.len(), 4, "{:?}", e.calls);
    assert_eq!(e.calls[2], "cancel");
    assert!(e.calls[3].starts_with("migrate"), "{:?}", e.calls);
    assert!(f.staged().is_none());
    let s = f.stats();
    assert_eq!((s.promotions_cancelled, s.promotions, s.replans), (1, 0, 2));
    assert!(!s.staging);
    assert!(resident(&f.in_force()).len() < resident(&at6).len());

    // Up again (the flap doubled the hold): staged, then committed once
    // the copies are complete.
    run_side(&f, &mut e, &mut t, 8.0, 8 * GIB);
    assert_eq!(e.calls.len(), 5, "{:?}", e.calls);
    assert!(e.calls[4].starts_with("stage"), "{:?}", e.calls);
    let staged = f.staged().unwrap().replanned.plan;
    e.ready = true;
    run_side(&f, &mut e, &mut t, 0.2, 8 * GIB);
    assert_eq!(e.calls.len(), 6, "{:?}", e.calls);
    assert!(e.calls[5].starts_with("commit"), "{:?}", e.calls);
    assert_eq!(resident(&f.in_force()), resident(&staged));
    let s = f.stats();
    assert_eq!((s.promotions, s.replans, s.failures), (1, 3, 0));
    assert!(!s.staging);
    assert!((s.last_promotion_copy_s - 0.120).abs() < 1e-9, "{s:?}");
    assert!((s.last_promotion_pause_s - 0.004).abs() < 1e-9, "{s:?}");
    assert!(
        (s.last_migration_s - 0.004).abs() < 1e-9,
        "the pause is the migration's time: {s:?}"
    );
}

/// An allowance that comes back to the plan in force while its promotion
/// is staged cancels the stage and moves nothing.
#[test]
fn a_staged_promotion_no_longer_needed_is_cancelled() {
    let (f, _) = follower_at_8gib();
    let mut e = SideEngine::default();
    let mut t = Duration::ZERO;
    run_side(&f, &mut e, &mut t, 1.0, 6 * GIB);
    let at6 = f.in_force();
    // Staged, and the copies are slow: past the shrink's retry time.
    run_side(&f, &mut e, &mut t, 11.0, 9 * GIB);
    assert!(f.staged().is_some(), "{:?}", e.calls);
    // The 6 GiB plan's own allowance: the re-plan is the plan in force.
    run_side(&f, &mut e, &mut t, 1.0, at6.vram.budget + hysteresis::SLACK);
    assert_eq!(e.calls.last().map(String::as_str), Some("cancel"), "{:?}", e.calls);
    assert!(f.staged().is_none());
    assert_eq!(resident(&f.in_force()), resident(&at6));
    assert_eq!(f.stats().promotions_cancelled, 1);
}

/// The server's path with the real engine (patch 0028; without a GPU the
/// device is the CPU's buffer type): launched at the smallest plan, the
/// card grows, the follower stages every weight's promotion while greedy
/// generation goes on, commits it between two decodes, and the tokens are
/// those of a generation without it.
#[test]
fn tokens_stay_identical_across_a_staged_promotion() {
    use pipeshard::engine::Context;
    use pipeshard::generate::generate_between;
    use pipeshard::launch::live::EngineMoves;

    // Launched at the smallest plan (every weight on the host); then the
    // card leaves room for every weight.
    let ExactRun {
        f,
        plan0,
        model,
        cp,
        gen,
        reference,
    } = exact_run(0);

    let mut ctx = Context::new(&model, cp).unwrap();
    let mut step = 0;
    let mut t = Duration::ZERO;
    let mut staged_at = None;
    let mut applied = Vec::new();
    let out = generate_between(&mut ctx, &gen, |_| true, &mut |ctx| {
        step += 1;
        // The card grows after 4 tokens; 20 samples per token, so that the
        // grow hold passes within a few tokens.
        if (4..12).contains(&step) {
            for _ in 0..20 {
                f.step(t, Some(card(plan0.vram.total + 2 * GIB, None)));
                t += hysteresis::SAMPLE_EVERY;
            }
        }
        let r = f.between_batches(&mut EngineMoves { ctx: ctx.context_ref() });
        if staged_at.is_none() && f.staged().is_some() {
            staged_at = Some(step);
        }
        if let Some(r) = r {
            applied.push((step, r));
        }
    })
    .unwrap();
    let staged_at = staged_at.expect("the promotion was staged");
    assert_eq!(applied.len(), 1, "{applied:?}");
    let (at, result) = &applied[0];
    let m = result.as_ref().expect("the engine committed the promotion");
    assert!(*at > staged_at && *at < 24, "staged at {staged_at}, committed at {at}");
    let promoted = resident(&f.in_force()).len() - resident(&plan0).len();
    assert!(promoted > 0 && m.moved == promoted, "{m:?}");
    assert!(m.bytes_to_device > 0 && m.bytes_to_host == 0, "{m:?}");
    let s = f.stats();
    assert_eq!((s.replans, s.promotions, s.failures), (1, 1, 0));
    assert!(s.last_promotion_copy_s > 0.0 && s.last_promotion_pause_s > 0.0, "{s:?}");
    assert_eq!(out.tokens, reference, "the tokens changed across the staged promotion");
}

/// Below the smallest plan with a plan in force that is already within the
/// slack of it, nothing moves: what a migration would free, the other
/// program takes at once, and the compute reservation for the new placement
/// could then fail every request (s11 on the H200: the smallest plan with
/// two slots instead of three). The log and the metrics say unfit.
#[test]
fn below_the_smallest_plan_a_plan_in_force_near_it_stays() {
    let (plan0, basis) = launched(8 * GIB, false);
    let smallest = basis.plan(0).unwrap();
    assert!(!smallest.fits);
    let near = smallest.plan.vram.total + 240 * MIB;
    let f = Follower::new(basis.clone(), plan0, 8 * GIB, Some(HEADROOM), Hooks::default());
    let rec = Recorder::default();
    let mut t = Duration::ZERO;
    // Down to a plan that fits just above the smallest.
    run(&f, &rec, &mut t, 1.0, |_| card(near + hysteresis::SLACK, None));
    assert_eq!(rec.0.lock().unwrap().len(), 1);
    let in_force = f.in_force();
    assert!(in_force.vram.total <= near && in_force.vram.total > smallest.plan.vram.total);
    assert_ne!(
        (resident(&in_force), in_force.stream_slots),
        (resident(&smallest.plan), smallest.plan.stream_slots)
    );
    // Then below the smallest plan: it stays, and says so.
    run(&f, &rec, &mut t, 12.0, |_| card(256 * MIB, None));
    assert_eq!(rec.0.lock().unwrap().len(), 1, "a migration below the smallest plan");
    assert!(f.pending().is_none());
    assert_eq!(resident(&f.in_force()), resident(&in_force));
    let s = f.stats();
    assert!(s.unfit);
    assert!(pipeshard::server_hook::live_metrics(&s).contains("pipeshard_plan_unfit 1\n"));
}

/// The server's loop steps the model's session between batches
/// ([`pipeshard::launch::Session::between_batches`]): at its first call,
/// before any request, the split the plan leaves open is timed on real
/// decode steps of the default model on the CPU (a synthetic prompt, then
/// steps after it) until one is chosen, which is then in force and
/// reported once, and the context is left empty; no request is served at a
/// probe's setting. A session whose context already holds a sequence, or
/// whose context is too short for the steps, keeps the plan's setting. A
/// session never stepped still has its tuning pending.
#[test]
fn a_session_tunes_its_split_before_a_server_serves() {
    use pipeshard::engine::{self, Context, ContextParams, Model, ModelParams};
    use pipeshard::launch::{Launch, ProcessOverhead, Session, SplitKnob};

    engine::init(None).unwrap();
    let h200 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/h200-machine-profile.yaml");
    let profile = MachineProfile::load(&h200).unwrap();
    let info = r2();
    let plan = plan::make_plan(&info, &profile, &PlanRequest::new(4 * GIB, 4352)).unwrap();
    let knob = SplitKnob::of(&plan, info.n_expert_used, false).expect("a split to tune");
    let launch = Launch {
        budget: plan.vram.budget,
        overhead: ProcessOverhead::for_machine(Some(&profile), 4352),
        replan: None,
        split_knob: Some(knob),
        plan,
    };
    let changed: Arc<Mutex<Vec<(u32, u64)>>> = Arc::default();
    let session = |cp: &ContextParams| {
        let mut s = Session::new(&launch);
        let c = Arc::clone(&changed);
        s.on_plan_changed(Arc::new(move |p: &Plan, budget| {
            c.lock().unwrap().push((p.hybrid_gpu_experts, budget))
        }));
        s.tune_before_serving(cp);
        assert!(s.tune_pending());
        s
    };
    let model = Model::load(
        &common::default_model_path(),
        ModelParams {
            n_gpu_layers: 0,
            ..Default::default()
        },
    )
    .unwrap();
    let cp = ContextParams {
        n_ctx: 512,
        ..Default::default()
    };
    let (mut served, idle) = (session(&cp), session(&cp));
    let mut ctx = Context::new(&model, cp.clone()).unwrap();
    served.between_batches(ctx.context_ref());
    assert!(!served.tune_pending());
    {
        let changed = changed.lock().unwrap();
        assert_eq!(*changed, [(served.plan().hybrid_gpu_experts, launch.budget)]);
    }
    assert_eq!(ctx.seq_pos_max(0), -1, "the tuning's cells are removed");
    served.between_batches(ctx.context_ref());
    assert_eq!(changed.lock().unwrap().len(), 1, "tuned once");
    assert!(idle.tune_pending());
    assert_eq!(idle.plan().hybrid_gpu_experts, launch.plan.hybrid_gpu_experts);

    // A context holding a sequence already: the plan's setting stays,
    // nothing is reported, the sequence is left as it was.
    let mut held = session(&cp);
    ctx.decode_tokens(&[1, 2, 3], 0, true).unwrap();
    held.between_batches(ctx.context_ref());
    assert_eq!(ctx.seq_pos_max(0), 2);
    assert!(!held.tune_pending());
    assert_eq!(held.plan().hybrid_gpu_experts, launch.plan.hybrid_gpu_experts);
    assert_eq!(changed.lock().unwrap().len(), 1);
}

/// With several slots (`-np 2`, a KV stream per slot), the session then
/// tunes the split of the step they decode together: a prompt in sequence
/// 0, copied to sequence 1, then steps of one token of each, on real decode
/// steps of the default model on the CPU. Both choices are in force and
/// reported, one after the other, and every sequence is left empty.
#[test]
fn a_session_of_several_slots_tunes_the_step_they_decode_together() {
    use pipeshard::engine::{self, Context, ContextParams, Model, ModelParams};
    use pipeshard::launch::{Launch, ProcessOverhead, Session, SplitKnob, SplitSetting};

    engine::init(None).unwrap();
    let h200 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/h200-machine-profile.yaml");
    let profile = MachineProfile::load(&h200).unwrap();
    let info = r2();
    let mut req = PlanRequest::new(4 * GIB, 2 * 4352);
    req.workload.parallel = 2;
    req.kv_unified = false;
    let plan = plan::make_plan(&info, &profile, &req).unwrap();
    let knob = SplitKnob::of(&plan, info.n_expert_used, false).expect("a split to tune");
    let launch = Launch {
        budget: plan.vram.budget,
        overhead: ProcessOverhead::for_machine(Some(&profile), 4352),
        replan: None,
        split_knob: Some(knob),
        plan,
    };
    let changed: Arc<Mutex<Vec<(u32, u32)>>> = Arc::default();
    let mut served = Session::new(&launch);
    let c = Arc::clone(&changed);
    served.on_plan_changed(Arc::new(move |p: &Plan, _| {
        c.lock().unwrap().push((p.hybrid_gpu_experts, p.batch_gpu_experts))
    }));
    let model = Model::load(
        &common::default_model_path(),
        ModelParams {
            n_gpu_layers: 0,
            ..Default::default()
        },
    )
    .unwrap();
    let cp = ContextParams {
        n_ctx: 1024,
        n_seq_max: 2,
        kv_unified: false,
        ..Default::default()
    };
    served.tune_before_serving(&cp);
    let mut ctx = Context::new(&model, cp.clone()).unwrap();
    served.between_batches(ctx.context_ref());
    assert!(!served.tune_pending());
    let p = served.plan();
    let changed = changed.lock().unwrap();
    assert_eq!(changed.len(), 2, "{changed:?}");
    assert_eq!(changed[1], (p.hybrid_gpu_experts, p.batch_gpu_experts));
    assert!(p.batch_gpu_experts < info.n_expert_used);
    assert!(matches!(knob.planned(), SplitSetting::Experts(_)));
    for s in 0..2 {
        assert_eq!(ctx.seq_pos_max(s), -1, "the tuning's cells of sequence {s} are removed");
    }
}
