#!/usr/bin/env bash
# Build ggml's CPU backend for this machine's CPU from the patched llama.cpp
# source (a source tree, or DIST from scripts/device/pack.sh), link
# gemv-bench.cpp against it and run it: the CPU's batch-1 GEMV rate per
# weight type, in the weight's file bytes per second, with the buffer types
# pipeshard gives host weights. Needs cmake and a C++ compiler; no Rust.
#
#   gemv-bench.sh SRC|DIST [-t THREADS] [-g GIB] [-s SECONDS] [TYPE...]
#   e.g. gemv-bench.sh dist -t 16
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
IN=${1:?usage: gemv-bench.sh SRC|DIST [-t THREADS] [-g GIB] [-s SECONDS] [TYPE...]}
shift
WORK=${PIPESHARD_GEMV_WORK:-/tmp/pipeshard-gemv}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$WORK"
if [[ -f $IN/llama.cpp-src.tar.gz ]]; then
    mkdir -p "$WORK/src"
    tar -C "$WORK/src" -xzf "$IN/llama.cpp-src.tar.gz" ./ggml
    SRC=$WORK/src
else
    SRC=$(cd "$IN" && pwd)
fi
[[ -f $SRC/ggml/CMakeLists.txt ]] || { echo "gemv-bench: no ggml/ under $SRC" >&2; exit 1; }
# ggml's standalone build wants its pkg-config template, which the sdist lacks
[[ -f $SRC/ggml/ggml.pc.in ]] || touch "$SRC/ggml/ggml.pc.in"
# This machine's CPU features by name, as build-cuda.sh --native-cpu picks them.
# shellcheck source=cpu-flags.sh
source "$(dirname "$0")/cpu-flags.sh"
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
cmake -S "$SRC/ggml" -B "$WORK/build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF -DGGML_BACKEND_DL=OFF "${cpu_flags[@]}" \
    -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF -DGGML_CCACHE=OFF >"$WORK/configure.log"
cmake --build "$WORK/build" --target ggml ggml-cpu -j "$JOBS" >"$WORK/build.log"
lib=$WORK/build/src
${CXX:-c++} -O2 -std=c++17 -I"$SRC/ggml/include" "$HERE/gemv-bench.cpp" -o "$WORK/gemv-bench" \
    "$lib/libggml-cpu.a" "$lib/libggml.a" "$lib/libggml-cpu.a" "$lib/libggml-base.a" -fopenmp -lpthread -lm
echo "gemv-bench: CPU backend flags: ${cpu_flags[*]}"
"$WORK/gemv-bench" "$@"
