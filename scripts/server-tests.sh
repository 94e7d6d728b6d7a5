#!/usr/bin/env bash
# Run llama.cpp's own server tests (tools/server/tests/unit, from the pinned
# release) against pipeshard-server, with local models instead of upstream's
# Hugging Face ones (tests/upstream-server/pipeshard_models.py says which).
#
#   scripts/server-tests.sh [PYTEST ARGS...]
#     default: -m "not slow" unit/
#   PIPESHARD_SERVER_TESTS_SKIP_EXPECTED=1: deselect the tests listed in
#     tests/upstream-server/expected-failures.txt (they need upstream's own
#     test models; docs/upstream-server-tests.md says why).
#
# Installs the tests' Python requirements into .tools/server-tests/ (once),
# writes the synthetic models into target/server-tests/, copies upstream's
# tests there, and writes JUnit XML to target/server-tests/junit.xml
# ($PIPESHARD_SERVER_TESTS_WORK instead of target/server-tests; PORT as in
# upstream's utils.py).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SRC=$ROOT/vendor/llama.cpp/tools/server/tests
BIN=${PIPESHARD_BIN_DIR:-$ROOT/target/release}
WORK=${PIPESHARD_SERVER_TESTS_WORK:-$ROOT/target/server-tests}
PY=$ROOT/.tools/server-tests

[[ -x $BIN/pipeshard-server && -x $BIN/pipeshard && -d $SRC ]] || ./dev cargo build --release --bins
if ! PYTHONPATH=$PY python3 -c "import pytest, aiohttp, openai, prometheus_client, wget, filelock, requests, numpy" 2>/dev/null; then
    echo "server-tests: installing the tests' requirements into $PY (once)" >&2
    python3 -m pip install --quiet --disable-pip-version-check --target "$PY" -r "$SRC/requirements.txt"
fi

mkdir -p "$WORK"
text=${PIPESHARD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pipeshard}/models/SmolLM2-135M-Instruct.Q4_1.gguf
[[ -f $text ]] || "$BIN/pipeshard" run -n 1 -p hi --quiet >/dev/null
[[ -f $WORK/moe.gguf ]] || "$BIN/pipeshard" synth --arch tiny-qwen3-30b-a3b --quant q8_0 -o "$WORK/moe.gguf" >/dev/null
[[ -f $WORK/vl.gguf && -f $WORK/vl-mmproj.gguf ]] ||
    "$BIN/pipeshard" synth --arch tiny-qwen2.5-vl-7b --quant q8_0 -o "$WORK/vl.gguf" --mmproj-out "$WORK/vl-mmproj.gguf" >/dev/null
export PIPESHARD_TEST_TEXT_MODEL=$text
export PIPESHARD_TEST_MOE_MODEL=$WORK/moe.gguf
export PIPESHARD_TEST_VL_MODEL=$WORK/vl.gguf
export PIPESHARD_TEST_VL_MMPROJ=$WORK/vl-mmproj.gguf
export LLAMA_SERVER_BIN_PATH=${LLAMA_SERVER_BIN_PATH:-$BIN/pipeshard-server}
# No Hugging Face: every model is local.
export HF_HUB_OFFLINE=1

# Upstream's tests name files of the llama.cpp tree relative to their own
# directory (../../../models/templates, ...): run a copy of them inside a
# tree whose every other entry links to the patched source.
TREE=$WORK/llama.cpp
rm -rf "$TREE"
mkdir -p "$TREE/tools/server"
LLAMA=$ROOT/vendor/llama.cpp
for e in "$LLAMA"/* "$LLAMA"/.[!.]*; do [[ $(basename "$e") == tools ]] || ln -s "$e" "$TREE/"; done
for e in "$LLAMA"/tools/*; do [[ $(basename "$e") == server ]] || ln -s "$e" "$TREE/tools/"; done
for e in "$LLAMA"/tools/server/*; do [[ $(basename "$e") == tests ]] || ln -s "$e" "$TREE/tools/server/"; done
cp -r "$SRC" "$TREE/tools/server/tests"
cd "$TREE/tools/server/tests"
args=("$@")
(( ${#args[@]} )) || args=(-m "not slow" unit/)
deselect=()
if [[ ${PIPESHARD_SERVER_TESTS_SKIP_EXPECTED:-0} == 1 ]]; then
    while read -r id _; do
        [[ -z $id || $id == \#* ]] || deselect+=(--deselect "$id")
    done <"$ROOT/tests/upstream-server/expected-failures.txt"
fi
export PYTHONPATH=$PY:$TREE/tools/server/tests:$ROOT/tests/upstream-server
exec python3 -m pytest -p pipeshard_models -p no:cacheprovider -q -rfE \
    --junitxml="$WORK/junit.xml" "${deselect[@]}" "${args[@]}"
