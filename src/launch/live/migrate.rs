//! Carrying out a re-plan's moves with the engine's live weight migration
//! (patch 0023), in the thread that runs the model, between two decodes.

use super::follower::{Migration, MigrationFailure, Slots};
use super::moves::{Move, Side};
use crate::engine::{self, ContextRef, EngineError, Residence, WeightMove};

/// Change the streaming slots to `slots` (when given), then move the
/// weights of `moves`, in order, in the context `ctx` borrows; the engine
/// reserves the compute buffers and slots for the new placement once.
pub fn migrate(mut ctx: ContextRef<'_>, moves: &[Move], slots: Option<Slots>) -> Result<Migration, MigrationFailure> {
    if let Some(s) = slots {
        ctx.set_stream_slots(s.n, s.routed_max);
    }
    let moves: Vec<WeightMove> = moves
        .iter()
        .map(|m| WeightMove {
            tensor: m.tensor.clone(),
            to: match m.to {
                Side::Device => Residence::Device,
                Side::Host => Residence::Host,
            },
        })
        .collect();
    engine::migrate_weights(ctx, &moves)
        .map(|r| Migration {
            moved: r.moved,
            bytes_to_host: r.bytes_to_host,
            bytes_to_device: r.bytes_to_device,
            device_bytes_freed: r.device_bytes_freed,
            elapsed: r.elapsed,
        })
        .map_err(|e| MigrationFailure {
            all_moved: matches!(e, EngineError::ComputeReserve { .. }),
            message: e.to_string(),
        })
}
