//! Carrying out a re-plan's moves with the engine's live weight migration
//! (patch 0023), in the thread that runs the model, between two decodes.

use super::follower::{MigrationFailure, Slots};
use super::moves::Move;
use crate::engine::{self, ContextRef, EngineError, MigrationReport, WeightMove};

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
    let moves: Vec<WeightMove> = moves
        .iter()
        .map(|m| WeightMove {
            tensor: m.tensor.clone(),
            to: m.to,
        })
        .collect();
    engine::migrate_weights(ctx, &moves).map_err(|e| MigrationFailure {
        all_moved: matches!(e, EngineError::ComputeReserve { .. }),
        message: e.to_string(),
    })
}
