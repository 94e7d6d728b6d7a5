//! The CUDA context's per-thread stack, which the driver backs with local
//! memory for every thread the GPU can hold at once (threads per SM x SMs):
//! at CUDA's default of 1 KiB that is about 264 MiB on a 132-SM H200,
//! counted in the process's device memory before any weight is loaded.
//! ggml's kernels need far less; a kernel that needs more still gets it
//! (the driver raises the stack for a launch that needs it, and keeps it).
//!
//! The stack must still cover every kernel's own need: below it, the driver
//! grows local memory for each launch of such a kernel and shrinks it after,
//! which cost R2's decode 40% at 256 bytes on the H200 (one flash-attention
//! kernel needs 304). So the stack is the largest any kernel of the loaded
//! CUDA module needs, as `scripts/device/cuda-stack.sh` records it from
//! `cuobjdump` next to the module (`libggml-cuda.so.stack`);
//! `PIPESHARD_CUDA_STACK_BYTES` overrides it, and without either CUDA's
//! default stays. On the H200 (CHANGELOG.md, session 7) the process
//! holds 520 MiB once the backend is up at 1 KiB, 334 MiB at 304 bytes.
//!
//! Set through the driver API (`libcuda.so.1`, loaded at run time) on the
//! primary context that ggml-cuda's runtime calls use.

use std::ffi::{c_int, c_uint, c_void};
use std::path::Path;

type CuResult = c_int;
type CuDevice = c_int;
type CuContext = *mut c_void;

const CUDA_SUCCESS: CuResult = 0;

/// The stack to set: `PIPESHARD_CUDA_STACK_BYTES`, else what the CUDA
/// module in `dir` records as its kernels' largest need; None keeps CUDA's
/// default.
pub fn stack_bytes(dir: Option<&Path>) -> Option<usize> {
    let parse = |s: &str| s.trim().parse::<usize>().ok().filter(|&b| b > 0);
    if let Ok(v) = std::env::var("PIPESHARD_CUDA_STACK_BYTES") {
        return parse(&v);
    }
    let text = std::fs::read_to_string(dir?.join("libggml-cuda.so.stack")).ok()?;
    // Stack frames are 16-byte aligned; never below CUDA's smallest.
    parse(&text).map(|b| b.max(16).next_multiple_of(16))
}
const CU_LIMIT_STACK_SIZE: c_int = 0;

/// Set the per-thread stack of every visible CUDA device's primary context
/// to `bytes`; returns the devices changed (0 without a CUDA driver).
pub fn set_stack_bytes(bytes: usize) -> usize {
    // SAFETY: driver API calls with their documented types, each result
    // checked; the primary context is retained and released around use and
    // pushed and popped on this thread only.
    unsafe {
        let Ok(lib) = libloading::Library::new("libcuda.so.1") else {
            return 0;
        };
        macro_rules! sym {
            ($name:literal, $ty:ty) => {
                match lib.get::<$ty>($name) {
                    Ok(f) => *f,
                    Err(_) => return 0,
                }
            };
        }
        let init = sym!(b"cuInit\0", unsafe extern "C" fn(c_uint) -> CuResult);
        let count = sym!(b"cuDeviceGetCount\0", unsafe extern "C" fn(*mut c_int) -> CuResult);
        let get = sym!(b"cuDeviceGet\0", unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult);
        let retain = sym!(
            b"cuDevicePrimaryCtxRetain\0",
            unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult
        );
        let release = sym!(
            b"cuDevicePrimaryCtxRelease_v2\0",
            unsafe extern "C" fn(CuDevice) -> CuResult
        );
        let push = sym!(b"cuCtxPushCurrent_v2\0", unsafe extern "C" fn(CuContext) -> CuResult);
        let pop = sym!(
            b"cuCtxPopCurrent_v2\0",
            unsafe extern "C" fn(*mut CuContext) -> CuResult
        );
        let set_limit = sym!(b"cuCtxSetLimit\0", unsafe extern "C" fn(c_int, usize) -> CuResult);
        if init(0) != CUDA_SUCCESS {
            return 0;
        }
        let mut n: c_int = 0;
        if count(&mut n) != CUDA_SUCCESS {
            return 0;
        }
        let mut changed = 0;
        for ordinal in 0..n {
            let mut dev: CuDevice = 0;
            let mut ctx: CuContext = std::ptr::null_mut();
            if get(&mut dev, ordinal) != CUDA_SUCCESS || retain(&mut ctx, dev) != CUDA_SUCCESS {
                continue;
            }
            if push(ctx) == CUDA_SUCCESS {
                if set_limit(CU_LIMIT_STACK_SIZE, bytes) == CUDA_SUCCESS {
                    changed += 1;
                }
                let mut popped: CuContext = std::ptr::null_mut();
                pop(&mut popped);
            }
            release(dev);
        }
        changed
    }
}
