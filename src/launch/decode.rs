//! The decode tier in a running context ([`crate::plan::DecodeTier`]):
//! after a prompt, [`Session::enter_decode`] shrinks the context's compute
//! buffers to a decode step's (patch 0033) and makes the tier's weights
//! resident in the memory that frees; before the next prompt,
//! [`Session::leave_decode`] points them back at their host copies (patch
//! 0034: no copy), and the prompt's buffers are reserved again. The
//! session's [`Phase`] says which is in force.
//!
//! ```text
//! prompt (plan's ubatch) ─► enter_decode: ubatch 1, reserve, promote ─► decode steps
//!        ▲                                                                  │
//!        └──────────── leave_decode: demote (free), ubatch back, reserve ◄──┘
//! ```
//!
//! How much of the tier fits is measured, not assumed: after the small
//! reservation the process's device memory (NVML) leaves room for a prefix
//! of the tier's units, best first.

use std::time::Instant;

use super::tune::{with_setting, SplitSetting};
use super::{LaunchError, Phase, Session};
use crate::engine::{self, Context, Residence, WeightMove};
use crate::plan::{fmt_bytes, Plan, DECODE_TIER_MARGIN};

/// The decode tier while it is in force.
#[derive(Debug, Clone)]
pub struct Decoding {
    /// The plan prompts run with, restored by [`Session::leave_decode`].
    prompt_plan: Plan,
    /// The weights made resident.
    promoted: Vec<String>,
}

/// What [`Session::enter_decode`] did.
#[derive(Debug, Clone)]
pub struct DecodeEntry {
    pub units: usize,
    /// The units that fit the plan's freed memory.
    pub planned_units: usize,
    /// All units listed, beyond the planned ones too.
    pub listed_units: usize,
    pub bytes: u64,
    /// The room measured under the budget (NVML), if it was.
    pub room: Option<u64>,
    pub elapsed_s: f64,
}

impl std::fmt::Display for DecodeEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "decode tier: {} units resident ({}; {} planned, {} listed",
            self.units,
            fmt_bytes(self.bytes),
            self.planned_units,
            self.listed_units
        )?;
        if let Some(room) = self.room {
            write!(f, ", {} of room measured under the budget", fmt_bytes(room))?;
        }
        write!(f, "), in {:.1} ms", self.elapsed_s * 1e3)
    }
}

/// The split setting `plan` is at, if it splits (hybrid layers at 0
/// experts on the GPU: the tuner's choice of the CPU for all of them).
fn split_setting(plan: &Plan) -> Option<SplitSetting> {
    if plan.hybrid_gpu_experts > 0 || plan.has_hybrid_layers() {
        Some(SplitSetting::Experts(plan.hybrid_gpu_experts))
    } else if plan.row_split_share > 0.0 && plan.row_split_down_whole {
        Some(SplitSetting::RowsDownWhole(plan.row_split_share))
    } else if plan.row_split_share > 0.0 {
        Some(SplitSetting::Rows(plan.row_split_share))
    } else {
        None
    }
}

/// Units of `sizes` (bytes, best first) that fit `room`: the longest prefix.
pub fn units_that_fit(sizes: &[u64], room: u64) -> usize {
    let mut used = 0u64;
    sizes
        .iter()
        .take_while(|&&b| {
            used += b;
            used <= room
        })
        .count()
}

/// Moves of the weights `names` to `to`.
fn moves_to(names: &[String], to: Residence) -> Vec<WeightMove> {
    names.iter().map(|w| WeightMove { tensor: w.clone(), to }).collect()
}

/// Device bytes a weight of `bytes` takes in a buffer of its own: CUDA
/// allocates whole 2 MiB pages.
fn allocated(bytes: u64) -> u64 {
    bytes.div_ceil(2 << 20) * (2 << 20)
}

impl Session {
    /// Whether the decode tier's weights are resident.
    pub fn decoding(&self) -> bool {
        matches!(self.phase, Phase::Decode(Some(_)))
    }

    /// After a prompt: the decode phase. Shrink `ctx`'s compute buffers to
    /// the decode tier's ubatch and make as many of its units resident as
    /// the process's device memory leaves room for under the budget.
    /// Nothing more (None) for a plan without a decode tier, without room,
    /// or in the decode phase already (an error too ends the attempt until
    /// the next prompt). A failed allocation leaves the weights where they
    /// were.
    pub fn enter_decode(&mut self, ctx: &mut Context<'_>) -> Result<Option<DecodeEntry>, LaunchError> {
        if matches!(self.phase, Phase::Decode(_)) {
            return Ok(None);
        }
        // Tried once per prompt, whether or not its weights fit.
        let entered = self.promote_tier(ctx);
        if !matches!(entered, Ok(Some(_))) {
            self.phase = Phase::Decode(None);
        }
        entered
    }

    /// The decode tier's units made resident, as far as they fit.
    fn promote_tier(&mut self, ctx: &mut Context<'_>) -> Result<Option<DecodeEntry>, LaunchError> {
        let Some(tier) = self.plan.decode_tier.clone() else {
            return Ok(None);
        };
        let start = Instant::now();
        if let Err(e) = ctx.set_ubatch(tier.ubatch) {
            // A context without causal attention keeps its ubatch.
            tracing::info!("decode tier: not used: {e}");
            return Ok(None);
        }
        ctx.reserve_compute()?;
        let sizes: Vec<u64> = tier
            .units
            .iter()
            .map(|u| {
                u.weights
                    .iter()
                    .map(|w| {
                        let t = self.plan.tensors.iter().find(|t| &t.name == w);
                        allocated(t.map_or(0, |t| t.vram_bytes))
                    })
                    .sum()
            })
            .collect();
        // The room measured now, where NVML can tell; else the plan's.
        let measured = engine::process_device_bytes().map(|(now, _)| {
            self.launch()
                .budget
                .saturating_sub(now)
                .saturating_sub(DECODE_TIER_MARGIN)
        });
        let n = units_that_fit(&sizes, measured.unwrap_or_else(|| tier.bytes()));
        if n == 0 {
            tracing::info!("decode tier: no room for its weights under the budget now");
            ctx.set_ubatch(self.plan.ubatch)?;
            return Ok(None);
        }
        let decoding = self.plan.decoding(n);
        let promoted: Vec<String> = tier.units[..n].iter().flat_map(|u| u.weights.clone()).collect();
        self.switch.switch(&decoding);
        if let Err(e) = engine::migrate_weights(ctx.context_ref(), &moves_to(&promoted, Residence::Device)) {
            // Nothing moved: the prompt's decisions and ubatch stay.
            self.switch.switch(&self.plan);
            ctx.set_ubatch(self.plan.ubatch)?;
            tracing::warn!("decode tier: the weights stay in host memory: {e}");
            return Ok(None);
        }
        let prompt_plan = std::mem::replace(&mut self.plan, decoding);
        self.phase = Phase::Decode(Some(Box::new(Decoding { prompt_plan, promoted })));
        let entry = DecodeEntry {
            units: n,
            planned_units: tier.planned().len(),
            listed_units: tier.units.len(),
            bytes: sizes[..n].iter().sum(),
            room: measured,
            elapsed_s: start.elapsed().as_secs_f64(),
        };
        tracing::info!("{entry}");
        Ok(Some(entry))
    }

    /// Before a prompt: the prompt phase. Point the decode tier's weights
    /// back at their host copies (their device memory is freed), restore
    /// the prompt's plan and ubatch, and reserve its compute buffers again.
    /// A split setting tuned while decoding carries over. Nothing more
    /// where the tier's weights were not resident.
    pub fn leave_decode(&mut self, ctx: &mut Context<'_>) -> Result<(), LaunchError> {
        let Phase::Decode(Some(decoding)) = std::mem::replace(&mut self.phase, Phase::Prompt) else {
            return Ok(());
        };
        let Decoding { prompt_plan, promoted } = *decoding;
        let start = Instant::now();
        let prompt_plan = match split_setting(&self.plan) {
            Some(s) => with_setting(&prompt_plan, s),
            None => prompt_plan,
        };
        self.switch.switch(&prompt_plan);
        let ubatch = prompt_plan.ubatch;
        self.plan = prompt_plan;
        engine::migrate_weights(ctx.context_ref(), &moves_to(&promoted, Residence::Host))?;
        ctx.set_ubatch(ubatch)?;
        ctx.reserve_compute()?;
        tracing::debug!(
            "decode tier left: {} weights back in host memory, in {:.1} ms",
            promoted.len(),
            start.elapsed().as_secs_f64() * 1e3
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_prefix_that_fits_is_taken() {
        assert_eq!(units_that_fit(&[10, 20, 30], 0), 0);
        assert_eq!(units_that_fit(&[10, 20, 30], 29), 1);
        assert_eq!(units_that_fit(&[10, 20, 30], 30), 2);
        assert_eq!(units_that_fit(&[10, 20, 30], 1000), 3);
        // A smaller unit after one that does not fit is not taken: the
        // order is the plan's, best first.
        assert_eq!(units_that_fit(&[10, 50, 5], 40), 1);
    }

    #[test]
    fn weights_of_their_own_take_whole_pages() {
        assert_eq!(allocated(0), 0);
        assert_eq!(allocated(1), 2 << 20);
        assert_eq!(allocated(9 << 20), 10 << 20);
        assert_eq!(allocated(108 << 20), 108 << 20);
    }
}
