#!/usr/bin/env bash
# Build the CUDA backend module (libggml-cuda.so) from the patched llama.cpp
# source that scripts/device/pack.sh put into DIST, and install it into
# DIST/lib, next to the libraries pipeshard was built with. Needs CUDA, cmake
# and ninja (or make); no Rust, no network.
#
#   build-cuda.sh DIST [ARCHS] [--native-cpu | --cpu-only]
#     ARCHS: CMake CUDA architectures, default 90 (H100/H200). Client GPUs:
#            "86;89;120" (RTX 30xx, 40xx, 50xx).
#     --native-cpu: also rebuild the CPU backend for this machine's CPU
#            (GGML_NATIVE) and replace DIST/lib/libggml-cpu.so with it.
#     --cpu-only: only that CPU backend (a CUDA module from an earlier build
#            of the same ggml is kept).
set -euo pipefail
DIST=$(cd "${1:?usage: build-cuda.sh DIST [ARCHS] [--native-cpu | --cpu-only]}" && pwd)
ARCHS=${2:-90}
NATIVE_CPU=0 CUDA=ON
for a in "${@:2}"; do
    case $a in
        --native-cpu) NATIVE_CPU=1 ;;
        --cpu-only) NATIVE_CPU=1 CUDA=OFF ;;
    esac
done
[[ "$ARCHS" == --* ]] && ARCHS=90
WORK=${PIPESHARD_CUDA_WORK:-/tmp/pipeshard-cuda}
JOBS=${JOBS:-$(nproc)}

mkdir -p "$WORK/src"
tar -C "$WORK/src" -xzf "$DIST/llama.cpp-src.tar.gz"
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
targets=()
[[ $CUDA == ON ]] && targets+=(ggml-cuda)
cpu_flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
if (( NATIVE_CPU )); then
    targets+=(ggml-cpu)
    # shellcheck source=cpu-flags.sh
    source "$(dirname "$0")/cpu-flags.sh"
    echo "build-cuda: CPU backend flags: ${cpu_flags[*]}"
fi
cmake -S "$WORK/src" -B "$WORK/build" "${GEN[@]}" \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON \
    -DGGML_CUDA=$CUDA -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" "${cpu_flags[@]}" \
    -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_MTMD=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >"$WORK/configure.log"
cmake --build "$WORK/build" --target "${targets[@]}" -j "$JOBS"
for t in "${targets[@]}"; do
    so=$(find "$WORK/build" -name "lib$t.so" | head -n1)
    [[ -n "$so" ]] || { echo "build-cuda: lib$t.so was not built" >&2; exit 1; }
    cp "$so" "$DIST/lib/"
    echo "build-cuda: installed $DIST/lib/lib$t.so"
done
# The stack the module's kernels need, for pipeshard's CUDA context.
bash "$(dirname "$0")/cuda-stack.sh" "$DIST" || true
