//! Routing statistics measured from the experts llama.cpp selected (read
//! back from the graph through patch 0050's observer), per MoE layer, and
//! their medians over the layers: what `moe-routing.md` calibrates.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::engine::{MoeIds, MoeObserver};

/// The medians over the MoE layers of one request's routing.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RoutingStats {
    /// MoE layers measured, and tokens routed in each.
    pub layers: u32,
    pub tokens: u64,
    pub n_expert: u32,
    pub n_used: u32,
    /// Share of a token's experts that the previous token also used.
    pub reuse: f64,
    /// Hit rate of a per-layer LRU cache holding 12.5% of the experts.
    pub lru_hit_12_5: f64,
    /// The same with 25% of the experts.
    pub lru_hit_25: f64,
    /// The fewest experts that take 90% of the layer's selections.
    pub experts_90: f64,
    /// The most selected expert's share of the selections.
    pub top_share: f64,
}

/// One layer's selected experts, `n_used` per token, in token order.
#[derive(Debug, Clone, Default)]
pub struct LayerTrace {
    pub n_expert: u32,
    pub n_used: u32,
    pub ids: Vec<i32>,
}

impl RoutingStats {
    /// The medians over `layers`; None without a routed token.
    pub fn of_layers<'a>(layers: impl IntoIterator<Item = &'a LayerTrace>) -> Option<RoutingStats> {
        let traces: Vec<&LayerTrace> = layers
            .into_iter()
            .filter(|t| t.n_used > 0 && t.ids.len() >= t.n_used as usize)
            .collect();
        let first = traces.first()?;
        let med = |f: &dyn Fn(&LayerTrace) -> f64| super::median(traces.iter().map(|t| f(t)).collect());
        Some(RoutingStats {
            layers: traces.len() as u32,
            tokens: (first.ids.len() / first.n_used as usize) as u64,
            n_expert: first.n_expert,
            n_used: first.n_used,
            reuse: med(&|t| reuse(&t.ids, t.n_used as usize)),
            lru_hit_12_5: med(&|t| lru_hit_rate(&t.ids, t.n_used as usize, (t.n_expert as usize / 8).max(1))),
            lru_hit_25: med(&|t| lru_hit_rate(&t.ids, t.n_used as usize, (t.n_expert as usize / 4).max(1))),
            experts_90: med(&|t| experts_for_mass(&t.ids, t.n_expert as usize, 0.9) as f64),
            top_share: med(&|t| top_share(&t.ids, t.n_expert as usize)),
        })
    }
}

/// Share of each token's `k` experts that the token before also used.
pub fn reuse(ids: &[i32], k: usize) -> f64 {
    let tokens: Vec<&[i32]> = ids.chunks_exact(k).collect();
    let kept: usize = tokens
        .windows(2)
        .map(|w| w[1].iter().filter(|e| w[0].contains(e)).count())
        .sum();
    kept as f64 / (k * tokens.len().saturating_sub(1)).max(1) as f64
}

/// Hit rate of an LRU cache of `capacity` experts that each token's `k`
/// experts are looked up in, in order (a miss loads the expert, evicting
/// the least recently used).
pub fn lru_hit_rate(ids: &[i32], k: usize, capacity: usize) -> f64 {
    // Most recent last; capacities are small (a fraction of the experts).
    let mut cache: Vec<i32> = Vec::with_capacity(capacity + 1);
    let mut hits = 0usize;
    let n = ids.len() / k * k;
    for &e in &ids[..n] {
        if let Some(at) = cache.iter().position(|&c| c == e) {
            hits += 1;
            cache.remove(at);
        } else if cache.len() == capacity {
            cache.remove(0);
        }
        cache.push(e);
    }
    hits as f64 / n.max(1) as f64
}

fn counts(ids: &[i32], n_expert: usize) -> Vec<u64> {
    let mut c = vec![0u64; n_expert];
    for &e in ids {
        if let Some(x) = c.get_mut(e as usize) {
            *x += 1;
        }
    }
    c
}

/// The fewest experts whose selections make `mass` of all selections.
pub fn experts_for_mass(ids: &[i32], n_expert: usize, mass: f64) -> usize {
    let mut c = counts(ids, n_expert);
    c.sort_unstable_by(|a, b| b.cmp(a));
    let total: u64 = c.iter().sum();
    let mut acc = 0u64;
    for (i, x) in c.iter().enumerate() {
        acc += x;
        if acc as f64 >= mass * total as f64 {
            return i + 1;
        }
    }
    n_expert
}

/// The most selected expert's share of all selections.
pub fn top_share(ids: &[i32], n_expert: usize) -> f64 {
    let c = counts(ids, n_expert);
    c.iter().max().copied().unwrap_or(0) as f64 / (ids.len().max(1)) as f64
}

/// How much of request `b`'s selections a hot list of the `share` most
/// selected experts of request `a` covers, over the list's uniform share
/// (1.0: no better than any list of that size).
pub fn hot_list_coverage(a: &[i32], b: &[i32], n_expert: usize, share: f64) -> f64 {
    let ca = counts(a, n_expert);
    let mut order: Vec<usize> = (0..n_expert).collect();
    order.sort_by_key(|&e| std::cmp::Reverse(ca[e]));
    let size = ((share * n_expert as f64).round() as usize).clamp(1, n_expert);
    let cb = counts(b, n_expert);
    let covered: u64 = order[..size].iter().map(|&e| cb[e]).sum();
    let total: u64 = cb.iter().sum();
    covered as f64 / total.max(1) as f64 / (size as f64 / n_expert as f64)
}

/// Records sequence 0's selected experts per layer from a context's
/// observer ([`crate::engine::Context::set_moe_observer`]).
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    layers: Arc<Mutex<BTreeMap<u32, LayerTrace>>>,
}

impl Recorder {
    pub fn observer(&self) -> MoeObserver {
        let layers = Arc::clone(&self.layers);
        Box::new(move |m: &MoeIds<'_>| {
            let Ok(mut layers) = layers.lock() else {
                return;
            };
            let b = &m.batch;
            let t = layers.entry(b.layer).or_default();
            t.n_expert = b.n_expert;
            t.n_used = b.n_used;
            for (i, _) in b.seq.iter().enumerate().filter(|&(_, &s)| s == 0) {
                let k = b.n_used as usize;
                t.ids.extend_from_slice(&m.ids[i * k..(i + 1) * k]);
            }
        })
    }

    /// The statistics of everything recorded, or None if nothing was.
    pub fn stats(&self) -> Option<RoutingStats> {
        let layers = self.layers.lock().ok()?;
        RoutingStats::of_layers(layers.values())
    }
}
