//! A plan's per-op decisions that can be replaced while the context runs:
//! the context is made once with callbacks that ask whatever plan is in
//! force, so that after a live re-plan moved the weights, the new plan's
//! offload, hybrid-expert and row-split decisions are the ones taken.

use std::sync::{Arc, RwLock};

use super::apply::{policies, Policies};
use super::Plan;
use crate::engine::{ContextParams, MoeSplitPolicy, Offload, OffloadPolicy, OffloadQuery, RowSplitPolicy};

/// The decisions in force; [`PolicySwitch::install`] points a context's
/// callbacks at them, [`PolicySwitch::switch`] replaces them.
pub struct PolicySwitch {
    current: RwLock<Policies>,
}

impl PolicySwitch {
    /// A switch holding `plan`'s decisions.
    pub fn new(plan: &Plan) -> Arc<PolicySwitch> {
        Arc::new(PolicySwitch {
            current: RwLock::new(policies(plan)),
        })
    }

    /// Make `cp`'s callbacks ask the decisions in force. Both split
    /// callbacks are installed even when the plan has none, as a later
    /// plan may split (asking them costs a lookup per layer, and 0 rows or
    /// experts is the graph's own path).
    pub fn install(self: &Arc<Self>, cp: &mut ContextParams) {
        let s = Arc::clone(self);
        cp.offload = Some(Arc::new(move |q: &OffloadQuery<'_>| s.offload(q)) as OffloadPolicy);
        let s = Arc::clone(self);
        cp.moe_split = Some(Arc::new(move |layer, n| s.moe_split(layer, n)) as MoeSplitPolicy);
        let s = Arc::clone(self);
        cp.row_split = Some(Arc::new(move |name: &str, rows, n| s.row_split(name, rows, n)) as RowSplitPolicy);
    }

    /// Put `plan`'s decisions in force.
    pub fn switch(&self, plan: &Plan) {
        let next = policies(plan);
        match self.current.write() {
            Ok(mut g) => *g = next,
            Err(poisoned) => *poisoned.into_inner() = next,
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Policies> {
        self.current.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The offload decision in force for `q`.
    pub fn offload(&self, q: &OffloadQuery<'_>) -> Offload {
        (self.read().offload)(q)
    }

    /// Experts of each token the GPU computes in `layer` (0: no split).
    pub fn moe_split(&self, layer: u32, n_tokens: u32) -> u32 {
        self.read().moe_split.as_ref().map_or(0, |f| f(layer, n_tokens))
    }

    /// Rows of `name` the GPU computes (0: no split).
    pub fn row_split(&self, name: &str, rows: u64, n_tokens: u32) -> u64 {
        self.read().row_split.as_ref().map_or(0, |f| f(name, rows, n_tokens))
    }
}
