//! The device memory a process holds outside llama.cpp's buffers, which the
//! budget must cover too: NVML (and nvidia-smi) count the whole process.
//!
//! - The CUDA context and what the backend allocates up front: measured in
//!   this process right after the backend came up (NVML), or taken from the
//!   machine profile when planning for another machine.
//! - What grows while running: ggml-cuda's memory pool (temporaries of
//!   matmuls and attention; its VMM form never shrinks), cuBLAS handles and
//!   workspaces created on first use, CUDA graphs. Budgeted as a fixed
//!   allowance measured on the GPU machine, then checked after loading,
//!   once the largest ubatch has run ([`super::check`]).

use crate::engine;
use crate::profile::MachineProfile;

/// The CUDA context when nothing measured it: what it was on the H200 with
/// the stack the module's kernels need (CHANGELOG.md, session 7:
/// 334 MiB at 304 bytes per thread; 520 MiB at CUDA's default 1 KiB).
pub const ASSUMED_CONTEXT_BYTES: u64 = 352 << 20;

/// What grows after loading beyond llama.cpp's buffers and the streaming
/// overhead the plan prices itself (ggml-cuda's pool, cuBLAS, CUDA graphs),
/// at the peak of a warmed-up run: [`RUNTIME_BYTES`] plus
/// [`RUNTIME_BYTES_PER_TOKEN`] for each token of context, since attention's
/// temporaries grow with it. On the H200 (CHANGELOG.md, session 7),
/// everything outside llama.cpp's buffers and the context came to 91-110
/// MiB for R1 at 512-4096 tokens and 152-183 MiB at 16k (94 MiB of
/// streaming overhead priced), and 280 MiB for R2 (324 MiB priced).
pub const RUNTIME_BYTES: u64 = 64 << 20;

/// See [`RUNTIME_BYTES`].
pub const RUNTIME_BYTES_PER_TOKEN: u64 = 4 << 10;

/// Where the context figure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OverheadSource {
    /// NVML, in this process, before any model was loaded.
    Measured,
    /// The machine profile's figure (planning for that machine).
    Profile,
    /// Neither: [`ASSUMED_CONTEXT_BYTES`].
    Assumed,
}

/// Device memory of the process outside llama.cpp's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ProcessOverhead {
    /// The CUDA context and the backend's up-front allocations.
    pub context: u64,
    /// What grows while running (pool, library workspaces, graphs).
    pub runtime: u64,
    pub source: OverheadSource,
}

impl ProcessOverhead {
    /// The overhead of this process when it has a GPU (measured), else the
    /// one of the machine `profile` describes, with a context of `n_ctx`
    /// tokens.
    pub fn for_machine(profile: Option<&MachineProfile>, n_ctx: u64) -> ProcessOverhead {
        let (context, source) = match (
            engine::process_bytes_at_init(),
            profile.and_then(|p| p.process_context_bytes),
        ) {
            (Some(b), _) => (b, OverheadSource::Measured),
            (None, Some(b)) => (b, OverheadSource::Profile),
            (None, None) => (ASSUMED_CONTEXT_BYTES, OverheadSource::Assumed),
        };
        ProcessOverhead {
            context,
            runtime: RUNTIME_BYTES + RUNTIME_BYTES_PER_TOKEN * n_ctx,
            source,
        }
    }

    /// Everything outside llama.cpp's buffers.
    pub fn total(&self) -> u64 {
        self.context + self.runtime
    }
}
