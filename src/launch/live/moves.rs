//! The difference between the plan in force and a new one, as the ordered
//! weight moves that take the running context from one to the other.

use std::cmp::Ordering;
use std::collections::HashMap;

use crate::engine::Residence;
use crate::plan::Plan;

/// One weight to move.
#[derive(Debug, Clone, PartialEq)]
pub struct Move {
    pub tensor: String,
    pub to: Residence,
    /// Its bytes in VRAM.
    pub vram_bytes: u64,
}

/// The moves from `old` to `new`: every demotion first, least valuable
/// first (so the device memory another program needs is freed before
/// anything grows), then the promotions, most valuable per byte first
/// (`value`: seconds saved per byte; a weight without one comes last).
/// Weights are matched by name; ties go by name, so the order is
/// deterministic. A tied output stays where it was loaded: the context
/// knows it by the token embedding's name, which moves the embedding.
pub fn diff(old: &Plan, new: &Plan, value: &HashMap<String, f64>) -> Vec<Move> {
    let was: HashMap<&str, bool> = old
        .tensors
        .iter()
        .filter(|t| !t.tied)
        .map(|t| (t.name.as_str(), t.resident))
        .collect();
    let v = |name: &str| value.get(name).copied().unwrap_or(0.0);
    let cmp = |x: f64, y: f64| x.partial_cmp(&y).unwrap_or(Ordering::Equal);
    let (mut down, mut up) = (Vec::new(), Vec::new());
    for t in &new.tensors {
        let Some(&before) = was.get(t.name.as_str()) else {
            continue;
        };
        let m = |to| Move {
            tensor: t.name.clone(),
            to,
            vram_bytes: t.vram_bytes,
        };
        match (before, t.resident) {
            (true, false) => down.push(m(Residence::Host)),
            (false, true) => up.push(m(Residence::Device)),
            _ => {}
        }
    }
    down.sort_by(|a, b| cmp(v(&a.tensor), v(&b.tensor)).then_with(|| a.tensor.cmp(&b.tensor)));
    up.sort_by(|a, b| cmp(v(&b.tensor), v(&a.tensor)).then_with(|| a.tensor.cmp(&b.tensor)));
    down.extend(up);
    down
}

/// Bytes the moves free on the device and bytes they take there.
pub fn device_bytes(moves: &[Move]) -> (u64, u64) {
    moves.iter().fold((0, 0), |(freed, taken), m| match m.to {
        Residence::Host => (freed + m.vram_bytes, taken),
        Residence::Device => (freed, taken + m.vram_bytes),
    })
}
