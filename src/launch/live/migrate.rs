//! Carrying out a re-plan's moves with the engine's live weight migration
//! (patch 0023), in the thread that runs the model, between two decodes,
//! and promotions copied on the side while it decodes (patch 0028).

use super::follower::{LiveEngine, MigrationFailure, Slots, Staged};
use super::moves::Move;
use crate::engine::{self, ContextRef, EngineError, MigrationReport, StageState, WeightMove};
use crate::plan::fmt_bytes;

/// Change the streaming slots to `slots` (when given), then move the
/// weights of `moves`, in order, in the context `ctx` borrows; the engine
/// reserves the compute buffers and slots for the new placement once.
pub fn migrate(
    mut ctx: ContextRef<'_>,
    moves: &[Move],
    slots: Option<Slots>,
) -> Result<MigrationReport, MigrationFailure> {
    if let Some(s) = slots {
        ctx.set_stream_slots(s.n, s.routed_max);
    }
    engine::migrate_weights(ctx, &weight_moves(moves)).map_err(|e| MigrationFailure {
        all_moved: matches!(e, EngineError::ComputeReserve { .. }),
        message: e.to_string(),
    })
}

/// The engine side of [`super::Follower::between_batches`] for the
/// context `ctx` borrows: demotions move at once ([`migrate`]),
/// promotions are staged and committed (patch 0028).
pub struct EngineMoves<'a> {
    pub ctx: ContextRef<'a>,
}

impl LiveEngine for EngineMoves<'_> {
    fn migrate(&mut self, moves: &[Move], slots: Option<Slots>) -> Result<MigrationReport, MigrationFailure> {
        migrate(self.ctx.reborrow(), moves, slots)
    }

    fn stage(&mut self, moves: &[Move]) -> Result<(), MigrationFailure> {
        engine::stage_weights(self.ctx.reborrow(), &weight_moves(moves)).map_err(|e| MigrationFailure {
            all_moved: false,
            message: e.to_string(),
        })
    }

    fn staged(&mut self) -> Staged {
        match engine::stage_state(&self.ctx) {
            StageState::Copying { .. } => Staged::Copying,
            StageState::Ready { .. } => Staged::Ready,
            StageState::Failed { staged_bytes } => Staged::Failed(format!(
                "a device allocation failed after {} were staged",
                fmt_bytes(staged_bytes)
            )),
            StageState::None => Staged::Failed("nothing is staged".into()),
        }
    }

    fn cancel(&mut self) {
        engine::cancel_staged(self.ctx.reborrow());
    }

    fn commit(&mut self, slots: Option<Slots>) -> Result<MigrationReport, MigrationFailure> {
        engine::commit_staged(self.ctx.reborrow(), slots.map(|s| (s.n, s.routed_max))).map_err(|e| MigrationFailure {
            all_moved: matches!(e, EngineError::ComputeReserve { .. }),
            message: e.to_string(),
        })
    }
}

fn weight_moves(moves: &[Move]) -> Vec<WeightMove> {
    moves
        .iter()
        .map(|m| WeightMove {
            tensor: m.tensor.clone(),
            to: m.to,
        })
        .collect()
}
