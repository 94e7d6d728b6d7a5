//! The benchmark routing model: which experts each token of each MoE layer
//! uses when a benchmark drives the selection (`--routing`), instead of the
//! router of a model with random weights, which picks almost the same
//! experts every token.
//!
//! `calibrated` is a seeded process per sequence and layer, fitted to the
//! routing statistics of real models (`moe-routing.md`): a Zipf-like
//! popularity over a per-layer permutation of the experts, which drifts at
//! each new request, and reuse of the previous token's experts. `uniform` draws each token's
//! experts uniformly (no locality). Only llama.cpp sees the ids chosen here;
//! the product (cache, prefetch, planner) sees what llama.cpp selected.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use pipeshard_devtools::synth::rng::WyRand;
use serde::{Deserialize, Serialize};

use crate::engine::{MoeRoutePolicy, MoeRouteQuery};

/// A routing point of a MoE benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum RoutingPoint {
    /// The model's own router as is (for `synth` models an upper bound).
    Synthetic,
    /// The routing model calibrated to real routing (the headline).
    Calibrated,
    /// Each token's experts uniformly at random (the floor).
    Uniform,
}

impl RoutingPoint {
    /// The name the results summary gives it.
    pub fn name(self) -> &'static str {
        match self {
            RoutingPoint::Synthetic => "synthetic",
            RoutingPoint::Calibrated => "calibrated",
            RoutingPoint::Uniform => "uniform",
        }
    }

    /// The generator that drives the selection; `None` for `synthetic`,
    /// which keeps the model's router.
    pub fn router(self, seed: u64) -> Option<Arc<Router>> {
        (self != RoutingPoint::Synthetic).then(|| Arc::new(Router::new(self, seed, Calibration::default())))
    }
}

/// The calibrated process's parameters; the sizes are fractions of a
/// layer's experts, so that one calibration scales to every MoE shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    /// The expert of popularity rank r has weight 1 / (r + offset·E)^exponent.
    pub zipf_offset: f64,
    pub zipf_exponent: f64,
    /// Chance that each popularity rank swaps with a random one at a new
    /// request.
    pub drift: f64,
    /// The LRU hit rates, with a cache of 12.5% and of 25% of the experts,
    /// that the chance of reusing a previous token's expert is fitted to
    /// per shape: the first where that cache holds a token's experts, else
    /// the second (small test models).
    pub lru_target_12_5: f64,
    pub lru_target_25: f64,
}

impl Default for Calibration {
    /// Fitted to the band of `moe-routing.md` at 128 experts, top-8.
    fn default() -> Self {
        Calibration {
            zipf_offset: 0.2,
            zipf_exponent: 2.5,
            drift: 0.7,
            lru_target_12_5: 0.66,
            lru_target_25: 0.80,
        }
    }
}

/// The state of every sequence's process, per layer; [`Router::snapshot`]
/// and [`Router::restore`] take and put it back (as llama-bench restores
/// its depth's state between tg repetitions).
#[derive(Debug, Clone, Default)]
pub struct RouterState {
    processes: HashMap<(i32, u32), Process>,
}

/// The seeded routing generator of one benchmark run.
#[derive(Debug)]
pub struct Router {
    point: RoutingPoint,
    seed: u64,
    cal: Calibration,
    state: Mutex<RouterState>,
    // The fitted reuse chance per (experts, used).
    reuse: Mutex<HashMap<(u32, u32), f64>>,
}

/// One sequence's routing process in one layer.
#[derive(Debug, Clone)]
struct Process {
    /// The position after the last token routed: a token below it starts a
    /// new request.
    next_pos: i32,
    requests: u64,
    rng: WyRand,
    /// Cumulative popularity over the expert ids, for this request.
    cum: Vec<f64>,
    prev: Vec<i32>,
}

impl Router {
    pub fn new(point: RoutingPoint, seed: u64, cal: Calibration) -> Router {
        Router {
            point,
            seed,
            cal,
            state: Mutex::new(RouterState::default()),
            reuse: Mutex::new(HashMap::new()),
        }
    }

    /// The policy that llama.cpp asks for each MoE layer's experts.
    pub fn policy(self: &Arc<Self>) -> MoeRoutePolicy {
        let r = Arc::clone(self);
        Arc::new(move |q: &MoeRouteQuery<'_>, ids: &mut [i32]| r.route(q, ids))
    }

    pub fn snapshot(&self) -> RouterState {
        self.state.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub fn restore(&self, state: &RouterState) {
        if let Ok(mut s) = self.state.lock() {
            *s = state.clone();
        }
    }

    /// Fill `ids` with `q.n_used` distinct experts for each token of `q`.
    pub fn route(&self, q: &MoeRouteQuery<'_>, ids: &mut [i32]) {
        let k = q.n_used as usize;
        if q.n_expert == 0 || k == 0 || k > q.n_expert as usize || ids.len() < q.pos.len() * k {
            return;
        }
        let reuse = match self.point {
            RoutingPoint::Calibrated => self.fitted_reuse(q.n_expert, q.n_used),
            _ => 0.0,
        };
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        // Runs of tokens of one sequence share a lookup of its process.
        let mut i = 0;
        while i < q.seq.len() {
            let seq = q.seq[i];
            let run = q.seq[i..].iter().take_while(|&&s| s == seq).count();
            let p = state
                .processes
                .entry((seq, q.layer))
                .or_insert_with(|| self.start(seq, q.layer, q.n_expert, 0));
            for (&pos, out) in q.pos[i..i + run]
                .iter()
                .zip(ids[i * k..(i + run) * k].chunks_exact_mut(k))
            {
                if pos < p.next_pos {
                    *p = self.start(seq, q.layer, q.n_expert, p.requests + 1);
                }
                p.next_pos = pos + 1;
                match self.point {
                    RoutingPoint::Uniform => p.uniform(out),
                    _ => p.calibrated(reuse, out),
                }
            }
            i += run;
        }
    }

    /// A new request's process: the layer's popularity drifted from its
    /// base permutation by the request's own draws.
    fn start(&self, seq: i32, layer: u32, n_expert: u32, request: u64) -> Process {
        let stream = ((seq as u32 as u64) << 32) | (request & 0xffff_ffff);
        let rng = WyRand::for_stream(self.seed, u64::from(layer), stream);
        Process::new(
            &self.cal,
            n_expert,
            WyRand::for_stream(self.seed, u64::from(layer), u64::MAX),
            rng,
            request,
        )
    }

    fn fitted_reuse(&self, n_expert: u32, n_used: u32) -> f64 {
        let Ok(mut fits) = self.reuse.lock() else {
            return 0.0;
        };
        *fits
            .entry((n_expert, n_used))
            .or_insert_with(|| fit_reuse(&self.cal, self.seed, n_expert, n_used))
    }
}

impl Process {
    fn new(cal: &Calibration, n_expert: u32, mut base: WyRand, mut rng: WyRand, requests: u64) -> Process {
        let e = n_expert as usize;
        // The layer's permutation (ranks to experts), then the request's drift.
        let mut perm: Vec<usize> = (0..e).collect();
        shuffle(&mut perm, &mut base);
        for r in 0..e {
            if unit(&mut rng) < cal.drift {
                let o = below(&mut rng, e);
                perm.swap(r, o);
            }
        }
        let offset = cal.zipf_offset * e as f64;
        let mut weight = vec![0.0; e];
        for (rank, &expert) in perm.iter().enumerate() {
            weight[expert] = (rank as f64 + offset.max(1.0)).powf(-cal.zipf_exponent);
        }
        let cum = weight
            .iter()
            .scan(0.0, |acc, w| {
                *acc += w;
                Some(*acc)
            })
            .collect();
        Process {
            next_pos: 0,
            requests,
            rng,
            cum,
            prev: Vec::new(),
        }
    }

    fn uniform(&mut self, out: &mut [i32]) {
        let e = self.cum.len();
        for j in 0..out.len() {
            out[j] = loop {
                let x = below(&mut self.rng, e) as i32;
                if !out[..j].contains(&x) {
                    break x;
                }
            };
        }
    }

    /// Each slot keeps one of the previous token's experts with chance
    /// `reuse`, else draws one by popularity.
    fn calibrated(&mut self, reuse: f64, out: &mut [i32]) {
        for j in 0..out.len() {
            let (taken, _) = out.split_at(j);
            let open = |x: &&i32| !taken.contains(x);
            let n_open = if unit(&mut self.rng) < reuse {
                self.prev.iter().filter(open).count()
            } else {
                0
            };
            out[j] = match n_open {
                0 => self.popular(taken),
                n => {
                    let pick = below(&mut self.rng, n);
                    self.prev.iter().filter(open).nth(pick).copied().unwrap_or(0)
                }
            };
        }
        self.prev.clear();
        self.prev.extend_from_slice(out);
    }

    /// An expert drawn by popularity, other than those in `taken`.
    fn popular(&mut self, taken: &[i32]) -> i32 {
        let total = self.cum.last().copied().unwrap_or(0.0);
        for _ in 0..64 {
            let x = unit(&mut self.rng) * total;
            let e = self.cum.partition_point(|&c| c <= x).min(self.cum.len() - 1) as i32;
            if !taken.contains(&e) {
                return e;
            }
        }
        // Only when the popular experts are all taken: the first free one.
        (0..self.cum.len() as i32).find(|e| !taken.contains(e)).unwrap_or(0)
    }
}

/// The chance of reusing a previous token's expert that puts the LRU hit
/// rates closest to the calibration's targets (least squares over the
/// caches that hold at least one token's experts; 25% where none does),
/// on a simulated 2048-token request, searched in steps of 0.025.
fn fit_reuse(cal: &Calibration, seed: u64, n_expert: u32, n_used: u32) -> f64 {
    let k = n_used as usize;
    let caches: Vec<(usize, f64)> = [(8, cal.lru_target_12_5), (4, cal.lru_target_25)]
        .into_iter()
        .map(|(d, t)| ((n_expert as usize / d).max(1), t))
        .filter(|&(c, _)| c >= k)
        .collect();
    let caches = if caches.is_empty() {
        vec![((n_expert as usize / 4).max(1), cal.lru_target_25)]
    } else {
        caches
    };
    let miss = |reuse: f64| -> f64 {
        let mut p = Process::new(
            cal,
            n_expert,
            WyRand::for_stream(seed, 0, u64::MAX),
            WyRand::for_stream(seed ^ 0xf17, 0, 0),
            0,
        );
        let mut ids = vec![0i32; k];
        let trace: Vec<i32> = (0..2048)
            .flat_map(|_| {
                p.calibrated(reuse, &mut ids);
                ids.clone()
            })
            .collect();
        caches
            .iter()
            .map(|&(c, t)| (super::routing_stats::lru_hit_rate(&trace, k, c) - t).powi(2))
            .sum()
    };
    (0..=38)
        .map(|i| f64::from(i) * 0.025)
        .map(|r| (r, miss(r)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map_or(0.0, |(r, _)| r)
}

fn unit(rng: &mut WyRand) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

fn below(rng: &mut WyRand, n: usize) -> usize {
    (((rng.next_u64() >> 32) * n as u64) >> 32) as usize
}

fn shuffle(v: &mut [usize], rng: &mut WyRand) {
    for i in (1..v.len()).rev() {
        let j = below(rng, i + 1);
        v.swap(i, j);
    }
}
