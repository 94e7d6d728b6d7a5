//! Live weight migration (patch 0023): move weights of a loaded model
//! between VRAM and host memory in a live context, between two
//! `llama_decode` calls, and free the device memory they leave.
//!
//! The model must be loaded with [`super::ModelParams::movable_weights`] for a
//! demotion to free anything: without it, llama.cpp keeps all weights of a
//! buffer type in one buffer, which is only freed once every weight in it
//! has moved away.

use std::ffi::CString;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use super::backend::{first_device, DeviceKind};
use super::context::Context;
use super::error::{EngineError, Result};
use super::ffi;
use super::memory::{device_buffer_types, BufferType};

/// Where a weight lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Residence {
    /// In the GPU's memory (the first GPU's default buffer type).
    Device,
    /// In host memory: the GPU's pinned host buffer type, from which
    /// streaming it to the GPU is fast.
    Host,
}

/// One weight to move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightMove {
    /// The weight's GGUF name, e.g. `blk.3.ffn_up.weight`.
    pub tensor: String,
    pub to: Residence,
}

/// What one [`migrate_weights`] call did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigrationReport {
    /// Weights moved.
    pub moved: usize,
    /// Bytes of the weights moved to host memory (as allocated there).
    pub bytes_to_host: u64,
    /// Bytes of the weights moved to the device (as allocated there).
    pub bytes_to_device: u64,
    /// Device memory given back: the sizes of the device buffers freed
    /// because no weight was left in them.
    pub device_bytes_freed: u64,
    /// Weights moved to host memory by pointing them back at their host copy
    /// (made at load with `movable_weights`, or the host memory they left
    /// when promoted): no allocation, no copy.
    pub to_home: usize,
    /// Wall time of the whole call: waiting for queued work, the copies, and
    /// reserving the compute buffers again. For a staged promotion
    /// ([`commit_staged`]) the pause between two decodes: waiting for queued
    /// work, repointing the weights, freeing, reserving.
    pub elapsed: Duration,
    /// For a staged promotion, the time its copies took on the side from
    /// [`stage_weights`] until the last one completed, while decoding went
    /// on; zero for a migration that copies within [`Self::elapsed`].
    pub side_copy: Duration,
}

/// A borrowed live `llama_context`, through which its model's weights can be
/// moved. Made from an owned [`Context`] with [`Context::context_ref`], or
/// inside the engine from the raw pointer a server callback receives.
pub struct ContextRef<'a> {
    ptr: NonNull<ffi::llama_context>,
    _borrow: PhantomData<&'a mut ffi::llama_context>,
}

// SAFETY: like Context, a llama_context may be used from another thread as
// long as only one uses it at a time, which the exclusive borrow ensures.
unsafe impl Send for ContextRef<'_> {}

impl ContextRef<'_> {
    /// Borrow a raw context.
    ///
    /// # Safety
    /// `ptr` must be a live `llama_context` (or null) that nothing else uses
    /// while the returned reference exists, and that outlives it.
    #[allow(dead_code)]
    pub(crate) unsafe fn from_raw<'a>(ptr: *mut ffi::llama_context) -> Option<ContextRef<'a>> {
        NonNull::new(ptr).map(|ptr| ContextRef {
            ptr,
            _borrow: PhantomData,
        })
    }

    /// A shorter borrow of the same context, for several calls in a row.
    pub fn reborrow(&mut self) -> ContextRef<'_> {
        ContextRef {
            ptr: self.ptr,
            _borrow: PhantomData,
        }
    }

    /// The raw context, for this module's siblings (sequence 0's decoding,
    /// [`super::seq0`]).
    pub(super) fn raw(&self) -> NonNull<ffi::llama_context> {
        self.ptr
    }

    pub(super) fn model(&self) -> *const ffi::llama_model {
        // SAFETY: a live context; the model outlives it.
        unsafe { ffi::llama_get_model(self.ptr.as_ptr()) }
    }

    /// The buffer type the named weight lives in; `None` if the model has no
    /// weight of that name.
    pub fn weight_buffer_type(&self, name: &str) -> Option<BufferType> {
        let name = CString::new(name).ok()?;
        // SAFETY: a live model and a NUL-terminated name.
        let b = unsafe { ffi::llama_model_tensor_buft(self.model(), name.as_ptr()) };
        (!b.is_null()).then_some(BufferType(b))
    }

    /// Where the named weight lives: host memory (pinned or not, mapped or
    /// not) or a device's.
    pub fn residence(&self, name: &str) -> Option<Residence> {
        self.weight_buffer_type(name).map(|b| {
            if b.is_host() {
                Residence::Host
            } else {
                Residence::Device
            }
        })
    }

    /// Sequences the context holds.
    pub fn n_seq_max(&self) -> u32 {
        // SAFETY: a live context; plain query.
        unsafe { ffi::llama_n_seq_max(self.ptr.as_ptr()) }
    }

    /// Highest position of sequence `seq` in the context's memory, or -1.
    pub fn seq_pos_max(&self, seq: i32) -> i32 {
        // SAFETY: a live context; plain query of its memory.
        unsafe { ffi::llama_memory_seq_pos_max(ffi::llama_get_memory(self.ptr.as_ptr()), seq) }
    }

    /// Change the number of weight streaming slots (patch 0003) and the
    /// routed-expert streaming threshold (patch 0005) of the live context.
    /// The compute buffers are released now and reserved again by the next
    /// [`migrate_weights`] or decode; call this first when both change, so
    /// that one reservation covers both.
    pub fn set_stream_slots(&mut self, n_slots: u32, routed_max: u32) {
        // SAFETY: a live context, used by nobody else during the call.
        unsafe {
            ffi::llama_set_stream_slots(
                self.ptr.as_ptr(),
                n_slots.min(i32::MAX as u32) as i32,
                routed_max.min(i32::MAX as u32) as i32,
            )
        };
    }
}

impl Context<'_> {
    /// Borrow this context for [`migrate_weights`].
    pub fn context_ref(&mut self) -> ContextRef<'_> {
        // SAFETY: the pointer a Context owns is live for the borrow, which is
        // exclusive.
        unsafe { ContextRef::from_raw(self.as_ptr()) }.expect("a Context holds a non-null pointer")
    }
}

/// The buffer types of the two residences on this machine: the first GPU's
/// own and its pinned host buffer type (the CPU's when it has none). Without
/// a GPU both are the CPU's buffer type, so that a move still reallocates,
/// copies and frees (what CPU tests exercise).
pub fn residence_buffer_types() -> Result<(BufferType, BufferType)> {
    let cpu = first_device(DeviceKind::Cpu)
        .and_then(|d| device_buffer_types(d.index))
        .map(|(b, _)| b)
        .ok_or_else(|| EngineError::InvalidArgument("no CPU backend is loaded".into()))?;
    Ok(
        match first_device(DeviceKind::Gpu).and_then(|d| device_buffer_types(d.index)) {
            Some((gpu, host)) => (gpu, host.unwrap_or(cpu)),
            None => (cpu, cpu),
        },
    )
}

/// The progress of weights staged by [`stage_weights`] (patch 0028).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StageState {
    /// No weights are staged.
    None,
    /// The copies go on.
    Copying {
        /// Bytes of the new buffers allocated so far.
        staged_bytes: u64,
        /// Since staging started.
        elapsed: Duration,
    },
    /// Every copy is complete: [`commit_staged`] between two decodes.
    Ready {
        /// Bytes of the new buffers.
        staged_bytes: u64,
        /// From the start of staging until the last copy completed.
        copy: Duration,
    },
    /// Allocating a new buffer failed (the device's memory was taken
    /// meanwhile): [`cancel_staged`] frees what was allocated.
    Failed {
        /// Bytes of the new buffers allocated before the failure.
        staged_bytes: u64,
    },
}

/// The weights to stage and their destinations: the device buffer type for
/// each [`Residence::Device`] move (the first GPU's; the CPU's without one).
fn destinations(moves: &[WeightMove]) -> Result<Vec<(&str, BufferType)>> {
    let (device, _) = residence_buffer_types()?;
    moves
        .iter()
        .map(|m| match m.to {
            Residence::Device => Ok((m.tensor.as_str(), device)),
            Residence::Host => Err(EngineError::WeightStage {
                name: m.tensor.clone(),
                reason: "only promotions to the device are staged; a move to host memory needs no copy".into(),
            }),
        })
        .collect()
}

/// Start promoting weights to the device while decoding goes on (patch
/// 0028): a thread of llama.cpp's allocates each weight's new device buffer
/// and copies it there from its host memory (on CUDA, on a stream of its
/// own), while the weights stay where they are, so that every decode until
/// [`commit_staged`] reads them from host memory as the plan in force says.
/// The staged buffers count in the process's device memory from their
/// allocation on. Every move must go to [`Residence::Device`] and every
/// weight be in host memory; one stage at a time. A later
/// [`migrate_weights`] cancels the stage first.
pub fn stage_weights(ctx: ContextRef<'_>, moves: &[WeightMove]) -> Result<()> {
    let targets = destinations(moves)?;
    stage_weights_to(ctx, &targets)
}

/// [`stage_weights`] with an explicit destination buffer type per weight.
pub fn stage_weights_to(ctx: ContextRef<'_>, moves: &[(&str, BufferType)]) -> Result<()> {
    if moves.is_empty() {
        return Err(EngineError::InvalidArgument("no weights to stage".into()));
    }
    if stage_state(&ctx) != StageState::None {
        return Err(EngineError::WeightStage {
            name: moves[0].0.to_string(),
            reason: "weights are staged already".into(),
        });
    }
    let mut seen = std::collections::HashSet::new();
    for (name, to) in moves {
        let Some(now) = ctx.weight_buffer_type(name) else {
            return Err(EngineError::UnknownWeight { name: name.to_string() });
        };
        let reason = if !seen.insert(*name) {
            Some("it is listed twice".to_string())
        } else if !now.is_host() {
            Some("it is not in host memory".to_string())
        } else if !(to.is_host() || device_buffer_types_of(*to)) {
            Some(format!("{} is not a buffer type a weight can be moved into", to.name()))
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(EngineError::WeightStage {
                name: name.to_string(),
                reason,
            });
        }
    }
    let names: Vec<CString> = moves
        .iter()
        .map(|(n, _)| CString::new(*n).map_err(|_| EngineError::NulInText))
        .collect::<Result<_>>()?;
    let name_ptrs: Vec<*const std::ffi::c_char> = names.iter().map(|n| n.as_ptr()).collect();
    let dst: Vec<ffi::ggml_backend_buffer_type_t> = moves.iter().map(|(_, b)| b.0).collect();
    // SAFETY: the arrays hold moves.len() elements each and live across the
    // call (llama.cpp copies what it keeps); the model is live and outlives
    // its stage (freeing the model cancels it); this runs between two
    // decodes, in the thread that decodes.
    let rc = unsafe {
        ffi::llama_stage_tensors(
            ctx.model() as *mut ffi::llama_model,
            name_ptrs.as_ptr(),
            dst.as_ptr(),
            moves.len(),
        )
    };
    if rc != 0 {
        return Err(EngineError::WeightStage {
            name: moves[0].0.to_string(),
            reason: "llama.cpp refused the stage (see its log)".into(),
        });
    }
    tracing::debug!(weights = moves.len(), "staging weights on the side");
    Ok(())
}

/// The progress of the model's staged weights.
pub fn stage_state(ctx: &ContextRef<'_>) -> StageState {
    let mut stats = ffi::llama_tensor_stage_stats::default();
    // SAFETY: a live model; the stats are written only.
    let rc = unsafe { ffi::llama_model_stage_status(ctx.model(), &mut stats) };
    let staged_bytes = stats.size_staged as u64;
    let us = |v: i64| Duration::from_micros(v.max(0) as u64);
    match rc {
        1 => StageState::Copying {
            staged_bytes,
            elapsed: us(stats.t_copy_us),
        },
        0 => StageState::Ready {
            staged_bytes,
            copy: us(stats.t_copy_us),
        },
        -2 => StageState::Failed { staged_bytes },
        _ => StageState::None,
    }
}

/// Stop staging and free every staged buffer; the weights stay where they
/// are. Does nothing when no weights are staged.
pub fn cancel_staged(ctx: ContextRef<'_>) {
    // SAFETY: a live model, between two decodes, in the thread that decodes.
    unsafe { ffi::llama_model_stage_cancel(ctx.model() as *mut ffi::llama_model) };
}

/// Between two decodes: change the streaming slots first (when given),
/// wait for the staged copies to complete, point each staged weight at its
/// new device buffer, free what no weight is left in, and reserve the
/// compute buffers for the new placement. The report's `elapsed` is the
/// pause (decoding waits for it), `side_copy` the copies' time on the side.
/// When an allocation failed, nothing moved and the stage is freed.
pub fn commit_staged(mut ctx: ContextRef<'_>, slots: Option<(u32, u32)>) -> Result<MigrationReport> {
    let start = Instant::now();
    let (staged_bytes, copy, ready) = match stage_state(&ctx) {
        StageState::None => return Err(EngineError::NothingStaged),
        StageState::Copying { staged_bytes, elapsed } => (staged_bytes, elapsed, false),
        StageState::Failed { staged_bytes } => (staged_bytes, Duration::ZERO, false),
        StageState::Ready { staged_bytes, copy } => (staged_bytes, copy, true),
    };
    if let Some((n, routed_max)) = slots {
        ctx.set_stream_slots(n, routed_max);
    }
    let mut stats = ffi::llama_tensor_move_stats::default();
    // SAFETY: a live context, used by nobody else during the call, between
    // two decodes.
    let rc = unsafe { ffi::llama_commit_tensors(ctx.ptr.as_ptr(), &mut stats) };
    if rc != 0 {
        return Err(EngineError::WeightAlloc {
            name: "(staged)".into(),
            buffer_type: "the device".into(),
            bytes: staged_bytes,
            done: 0,
        });
    }
    // Committed while copying: the rest of the copies was waited for.
    let copy = if ready { copy } else { copy + start.elapsed() };
    let moved_in = start.elapsed();
    // SAFETY: as above.
    let reserved = unsafe { ffi::llama_reserve_compute(ctx.ptr.as_ptr()) };
    let report = MigrationReport {
        moved: stats.n_moved,
        bytes_to_host: 0,
        bytes_to_device: staged_bytes,
        device_bytes_freed: stats.size_freed_dev as u64,
        to_home: stats.n_home,
        elapsed: start.elapsed(),
        side_copy: copy,
    };
    if !reserved {
        return Err(EngineError::ComputeReserve { moved: report.moved });
    }
    tracing::info!(
        moved = report.moved,
        to_device_mib = staged_bytes as f64 / (1u64 << 20) as f64,
        copy_ms = copy.as_secs_f64() * 1e3,
        pause_ms = report.elapsed.as_secs_f64() * 1e3,
        reserve_ms = (report.elapsed - moved_in).as_secs_f64() * 1e3,
        "committed staged weights"
    );
    Ok(report)
}

/// Move weights between device and host memory, between two decodes.
///
/// Waits for the context's queued work; moves every weight bound for host
/// memory first, then the others (so that memory the demotions give back
/// can hold the promotions); allocates each group's destinations before
/// copying anything, so that an allocation failure moves nothing of that
/// group; points each weight at its new memory and frees every buffer left
/// without weights; then reserves the context's compute buffers and
/// streaming slots for the new placement. Graphs are rebuilt at the next
/// decode, and the KV cache is kept.
///
/// With `movable_weights`, a weight loaded into VRAM keeps a copy in pinned
/// host memory (its home, made at load), and a promoted weight keeps the
/// host memory it left: a move to host memory points the weight back at its
/// home (no allocation, no copy, see [`MigrationReport::to_home`]) and frees
/// its VRAM; a promotion copies from the home and keeps it. The compute
/// buffers and streaming slots stay allocated across the move and are
/// reserved again in place.
///
/// A move to where a weight already is reallocates it anyway (a move to
/// host memory of a weight in its home changes nothing).
pub fn migrate_weights(ctx: ContextRef<'_>, moves: &[WeightMove]) -> Result<MigrationReport> {
    let (device, host) = residence_buffer_types()?;
    let targets: Vec<(&str, BufferType)> = moves
        .iter()
        .map(|m| {
            (
                m.tensor.as_str(),
                match m.to {
                    Residence::Device => device,
                    Residence::Host => host,
                },
            )
        })
        .collect();
    migrate_weights_to(ctx, &targets)
}

/// [`migrate_weights`] with an explicit destination buffer type per weight:
/// a device's own buffer type or a host buffer type (see
/// [`super::buffer_types`]).
pub fn migrate_weights_to(mut ctx: ContextRef<'_>, moves: &[(&str, BufferType)]) -> Result<MigrationReport> {
    let start = Instant::now();
    if moves.is_empty() {
        return Ok(MigrationReport::default());
    }
    let mut report = move_weights(ctx.reborrow(), moves)?;
    let moved_in = start.elapsed();
    // SAFETY: a live context, used by nobody else during the call.
    let reserved = unsafe { ffi::llama_reserve_compute(ctx.ptr.as_ptr()) };
    report.elapsed = start.elapsed();
    if !reserved {
        return Err(EngineError::ComputeReserve { moved: report.moved });
    }
    tracing::info!(
        moved = report.moved,
        to_home = report.to_home,
        to_host_mib = report.bytes_to_host as f64 / (1u64 << 20) as f64,
        to_device_mib = report.bytes_to_device as f64 / (1u64 << 20) as f64,
        device_freed_mib = report.device_bytes_freed as f64 / (1u64 << 20) as f64,
        ms = report.elapsed.as_secs_f64() * 1e3,
        reserve_ms = (report.elapsed - moved_in).as_secs_f64() * 1e3,
        "moved weights"
    );
    tracing::debug!(weights = ?moves.iter().map(|(n, b)| format!("{n}->{}", b.name())).collect::<Vec<_>>(), "moved");
    Ok(report)
}

/// The moves of [`migrate_weights_to`] without its compute reservation: the
/// context reserves at its next decode (in place: its compute buffers and
/// streaming slots stay allocated across the move), and a decode whose
/// reservation fails returns [`EngineError::Decode`] and leaves the context
/// usable.
pub fn move_weights(mut ctx: ContextRef<'_>, moves: &[(&str, BufferType)]) -> Result<MigrationReport> {
    let start = Instant::now();
    let mut report = MigrationReport::default();
    if moves.is_empty() {
        return Ok(report);
    }
    // Clean errors for what llama.cpp would only log.
    let mut seen = std::collections::HashSet::new();
    for (name, to) in moves {
        if ctx.weight_buffer_type(name).is_none() {
            return Err(EngineError::UnknownWeight { name: name.to_string() });
        }
        if !seen.insert(*name) {
            return Err(EngineError::WeightMove {
                name: name.to_string(),
                done: 0,
                reason: "it is listed twice".into(),
            });
        }
        let plain = to.is_host() || device_buffer_types_of(*to);
        if !plain {
            return Err(EngineError::WeightMove {
                name: name.to_string(),
                done: 0,
                reason: format!("{} is not a buffer type a weight can be moved into", to.name()),
            });
        }
    }
    let (to_host, to_device): (Vec<_>, Vec<_>) = moves.iter().partition(|(_, to)| to.is_host());
    for group in [to_host, to_device] {
        if group.is_empty() {
            continue;
        }
        move_group(&mut ctx, &group, &mut report)?;
    }
    report.elapsed = start.elapsed();
    Ok(report)
}

/// Whether `b` is some device's own buffer type.
fn device_buffer_types_of(b: BufferType) -> bool {
    (0..super::list_devices().len()).any(|i| device_buffer_types(i).is_some_and(|(d, _)| d == b))
}

fn move_group(ctx: &mut ContextRef<'_>, group: &[&(&str, BufferType)], report: &mut MigrationReport) -> Result<()> {
    let names: Vec<CString> = group
        .iter()
        .map(|(n, _)| CString::new(*n).map_err(|_| EngineError::NulInText))
        .collect::<Result<_>>()?;
    let name_ptrs: Vec<*const std::ffi::c_char> = names.iter().map(|n| n.as_ptr()).collect();
    let dst: Vec<ffi::ggml_backend_buffer_type_t> = group.iter().map(|(_, b)| b.0).collect();
    // Sizes before the move, as the destination will allocate them.
    let bytes: Vec<u64> = group
        .iter()
        .zip(&names)
        .map(|((_, b), n)| {
            // SAFETY: a live model, a NUL-terminated name, a valid buffer type.
            let s = unsafe { ffi::llama_model_tensor_alloc_size(ctx.model(), n.as_ptr(), b.0) };
            s.max(0) as u64
        })
        .collect();
    let mut stats = ffi::llama_tensor_move_stats::default();
    // SAFETY: the arrays hold group.len() elements each and live across the
    // call; the context is live and used by nobody else (exclusive borrow),
    // and no decode runs: this is between two llama_decode calls.
    let rc = unsafe {
        ffi::llama_move_tensors(
            ctx.ptr.as_ptr(),
            name_ptrs.as_ptr(),
            dst.as_ptr(),
            group.len(),
            &mut stats,
        )
    };
    if rc != 0 {
        let i = usize::try_from(stats.i_error).unwrap_or(0).min(group.len() - 1);
        let (name, to) = group[i];
        return Err(match rc {
            -2 => EngineError::WeightAlloc {
                name: name.to_string(),
                buffer_type: to.name(),
                bytes: bytes[i],
                done: report.moved,
            },
            _ => EngineError::WeightMove {
                name: name.to_string(),
                done: report.moved,
                reason: "llama.cpp refused the move (see its log)".into(),
            },
        });
    }
    report.moved += stats.n_moved;
    report.to_home += stats.n_home;
    for ((_, to), b) in group.iter().zip(&bytes) {
        if to.is_host() {
            report.bytes_to_host += b;
        } else {
            report.bytes_to_device += b;
        }
    }
    report.device_bytes_freed += stats.size_freed_dev as u64;
    Ok(())
}
