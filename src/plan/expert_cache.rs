//! The expert cache (patch 0040) as the cost model prices it.
//!
//! In a decode graph whose streamed splits all copy routed experts, the
//! scheduler keeps each such weight's recently used experts in device
//! memory that the graph leaves unused: the streaming slots and the end of
//! the compute buffers, which are sized for prompts. Each cached weight
//! gets the same number of positions, as many as that room holds; a step
//! copies only the experts it does not find there.
//!
//! How often an expert is found depends on the positions per weight and on
//! how local the routing is. [`Locality`] holds the routing statistics the
//! bench measures from the ids llama.cpp selected (previous-token reuse,
//! per-layer LRU hits at 12.5% and 25% of the experts); before any
//! measurement it is the calibrated band of Qwen3-30B-A3B's real routing
//! (`moe-routing.md`). The hit rate at other capacities is read off the
//! curve through those points.
//!
//! The room is what makes the cache a planning matter: the decode tier
//! ([`super::DecodeTier`]) shrinks the compute buffers and fills the memory
//! they free with weights, which leaves the cache the slots alone; weights
//! resident in every phase leave the room alone and take their experts out
//! of the cache, so that the others get more positions.

use serde::{Deserialize, Serialize};

use super::{planned_compute, small_bytes, PlanRequest};
use crate::bench::routing_stats::RoutingStats;
use crate::gguf::ModelInfo;

/// The routing locality the cache's hit rate is priced with, per MoE layer
/// (medians over layers).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Locality {
    /// Share of a token's experts that the previous token also used: the
    /// hit rate of an LRU that holds one token's experts.
    pub reuse: f64,
    /// Hit rate of a per-layer LRU holding 12.5% of the experts.
    pub lru_hit_12_5: f64,
    /// The same with 25% of the experts.
    pub lru_hit_25: f64,
}

impl Default for Locality {
    /// The calibrated band for the Qwen3-30B-A3B shape in `moe-routing.md`
    /// (LRU hits 60-72% at 12.5%, 75-85% at 25% of the experts, after
    /// llama.cpp PR #27861's 67% and 81%), at the fit the bench's
    /// calibrated router measured on the H200 (call 2026-11-29-b: reuse
    /// 59.5%, 66.6% and 79.8%): what real text is expected to give before
    /// any of the model's own routing has been measured.
    fn default() -> Self {
        Locality {
            reuse: 0.595,
            lru_hit_12_5: 0.666,
            lru_hit_25: 0.798,
        }
    }
}

impl Locality {
    /// The locality measured from selected ids.
    pub fn measured(stats: &RoutingStats) -> Locality {
        Locality {
            reuse: stats.reuse,
            lru_hit_12_5: stats.lru_hit_12_5,
            lru_hit_25: stats.lru_hit_25,
        }
    }

    /// No locality: each token's experts drawn uniformly, so an LRU of `c`
    /// of `n_expert` experts hits `c / n_expert` of them.
    pub fn uniform(n_expert: u32, n_used: u32) -> Locality {
        let e = f64::from(n_expert.max(1));
        Locality {
            reuse: f64::from(n_used) / e,
            lru_hit_12_5: 0.125,
            lru_hit_25: 0.25,
        }
    }

    /// The hit rate of a per-layer LRU holding `fraction` of the experts,
    /// when each token looks up `n_used` of `n_expert`: the measured points
    /// joined by straight lines, from nothing at no capacity to every
    /// lookup at all the experts, never falling with the capacity.
    pub fn hit_rate(&self, fraction: f64, n_expert: u32, n_used: u32) -> f64 {
        let one_token = f64::from(n_used) / f64::from(n_expert.max(1));
        let mut points = vec![(0.0, 0.0)];
        if one_token > 0.0 && one_token < 0.125 {
            points.push((one_token, self.reuse));
        }
        points.extend([(0.125, self.lru_hit_12_5), (0.25, self.lru_hit_25), (1.0, 1.0)]);
        // Measured points are noisy: each at least the one before.
        let mut floor: f64 = 0.0;
        for p in &mut points {
            p.1 = p.1.clamp(floor, 1.0);
            floor = p.1;
        }
        let f = fraction.clamp(0.0, 1.0);
        points.windows(2).find(|w| f <= w[1].0).map_or(1.0, |w| {
            let (a, b) = (w[0], w[1]);
            a.1 + (b.1 - a.1) * (f - a.0) / (b.0 - a.0).max(1e-12)
        })
    }

    /// The share of the `n_need` experts a step routes to each cached
    /// weight that the cache holds, with `positions` per weight. A cache
    /// that holds fewer positions than the step routes is not used (the
    /// scheduler streams through the slots then). Where a step routes fewer
    /// experts than a token uses (the GPU's part of hybrid experts), the
    /// positions cover that many more tokens back, as a cache of all of a
    /// token's experts `n_used / n_need` times its size would.
    pub fn cache_hits(&self, positions: u64, n_need: u32, n_expert: u32, n_used: u32) -> f64 {
        if n_need == 0 || positions < u64::from(n_need) || n_expert == 0 {
            return 0.0;
        }
        let window = positions as f64 * f64::from(n_used.max(n_need)) / f64::from(n_need);
        self.hit_rate(window / f64::from(n_expert), n_expert, n_used)
    }
}

/// The expert cache a plan expects in decode.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ExpertCachePlan {
    /// Experts of each cached weight held at once.
    pub positions: u32,
    /// Routed weights cached: the expert tensors whose decode copies only
    /// the experts routed to the GPU.
    pub weights: u32,
    /// Device bytes of the positions.
    pub bytes: u64,
    /// The share of the GPU's routed experts found in the cache at
    /// `locality`.
    pub hits: f64,
    pub locality: Locality,
}

/// The share of a compute buffer sized for a prompt that a single-token
/// decode graph's tensors reach into; the cache's regions go after them.
/// On the H200, R2 at 4 GiB (ub 4096) found 1136 MiB of room: its 432 MiB
/// of slots and 704 MiB of its 1138 MiB compute buffer (call 2026-s25-d,
/// `ggml_backend_sched_cache_place`), the graph's tensors 38% in.
pub const DECODE_GRAPH_SHARE: f64 = 0.38;

/// Bytes of the compute buffers that a plan's `compute` bytes
/// ([`planned_compute`]: buffers and small tensors) hold and a single-token
/// decode graph leaves unused: the expert cache's room beside the slots.
/// Buffers sized for single tokens (the decode tier's) leave none.
pub fn decode_room(model: &ModelInfo, req: &PlanRequest, compute: u64) -> u64 {
    let small = small_bytes(model);
    let buffers = compute.saturating_sub(small);
    let decode = planned_compute(model, req, 1, 0).saturating_sub(small);
    let beyond_graph = (buffers as f64 * (1.0 - DECODE_GRAPH_SHARE)) as u64;
    beyond_graph.min(buffers.saturating_sub(decode))
}

/// The positions each of the cached weights gets in `room` bytes, where
/// one position of every cached weight takes `per_position` bytes (an
/// expert of each), at most all `n_expert` experts.
pub fn positions(room: u64, per_position: u64, n_expert: u32) -> u64 {
    if per_position == 0 {
        return 0;
    }
    (room / per_position).min(u64::from(n_expert))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_curve_passes_through_the_measured_points() {
        let l = Locality::default();
        assert!((l.hit_rate(0.125, 128, 8) - 0.666).abs() < 1e-9);
        assert!((l.hit_rate(0.25, 128, 8) - 0.798).abs() < 1e-9);
        assert!((l.hit_rate(8.0 / 128.0, 128, 8) - 0.595).abs() < 1e-9);
        assert_eq!(l.hit_rate(0.0, 128, 8), 0.0);
        assert_eq!(l.hit_rate(1.0, 128, 8), 1.0);
        // Between the points, and never falling.
        let mut last = 0.0;
        for i in 0..=128 {
            let h = l.hit_rate(i as f64 / 128.0, 128, 8);
            assert!(h >= last - 1e-12, "{i}: {h} < {last}");
            last = h;
        }
    }

    #[test]
    fn uniform_routing_hits_the_share_it_holds() {
        let u = Locality::uniform(128, 8);
        for c in [8u64, 16, 32, 64] {
            assert!((u.cache_hits(c, 8, 128, 8) - c as f64 / 128.0).abs() < 1e-9);
        }
    }

    #[test]
    fn too_few_positions_mean_no_cache() {
        let l = Locality::default();
        assert_eq!(l.cache_hits(6, 7, 128, 8), 0.0);
        assert!(l.cache_hits(7, 7, 128, 8) > 0.5);
        // Fewer experts per step reach further back.
        assert!(l.cache_hits(10, 5, 128, 8) > l.cache_hits(10, 8, 128, 8));
    }

    #[test]
    fn positions_are_what_the_room_holds() {
        assert_eq!(positions(1136 << 20, 129 * (108 << 20) / 128, 128), 10);
        assert_eq!(positions(u64::MAX, 1, 128), 128);
        assert_eq!(positions(1 << 30, 0, 128), 0);
    }
}
