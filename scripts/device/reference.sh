#!/usr/bin/env bash
# The reference harness: reproduces the rows of bench/results/summary.json
# on a bare GPU machine, pipeshard's and upstream's best in-budget modes
# from the same release, in one run.
#
#   scripts/device/reference.sh CASE...
#
# Run from the repository root on the GPU machine, with dist/ from
# scripts/device/pack.sh (the binaries and libraries built on a dev
# machine, the patched source and upstream's pristine source). No Rust and
# no network are needed there: the CUDA and CPU backend modules are built
# from the patched source for this host's CPU (build-cuda.sh --native-cpu),
# upstream's llama-bench (and llama-server, which server-bench.sh runs) from
# the pristine release (build-upstream-bench.sh), and the models are written by `pipeshard synth`, all side by side.
#
# CASE is NAME, NAME:QUANT or NAME:QUANT:MIB, QUANT a `synth --quant` scheme and MIB
# the budget (defaults: the case's own):
#   R1   Llama-3.1-8B shape, Q4_0, 2 GiB       upstream: fit, FFN on the CPU (-ot), full GPU
#   R2   Qwen3-30B-A3B shape, Q4_0, 4 GiB      upstream: fit, -ncmoe N swept, all experts on the CPU, full GPU
#   R3   gpt-oss-20b shape, MXFP4, 4 GiB       as R2
#   R4   Qwen3.6-35B-A3B shape, Q4_K_M, 8 GiB  as R2
#   R5   Gemma-3-27B shape, Q4_K_M, 8 GiB      as R1
#
# The reference settings: a 4096-token prompt, then 64 tokens decoded at
# depth 4096, flash attention on, F16 KV, 16 threads. Each system of a case
# runs REPS times, the systems interleaved (pipeshard, then each upstream
# mode, then again); a row is the median of its repetitions. Upstream's
# process peak is sampled by nvidia-smi in one untimed warm-up run per mode
# (sampling steals CPU time, so never while timing); pipeshard reports its
# own NVML peak.
#
# Environment (all optional):
#   REPS=3         repetitions per system
#   CALL=ID        the rows' call id (default: the date and this host's name)
#   NCMOE="N..."   upstream's -ncmoe values tried for MoE cases (default per case, the values
#                  around the budget's edge: R2 42 40, R3 20 18, R4 32 30); upstream-cpu-moe (every
#                  layer's experts on the CPU, -ncmoe 999: llama-bench has no --cpu-moe) always runs
#   MODULES=DIR    libggml-cuda.so.xz.*, libggml-cpu.so.xz and upstream-bin.tar.xz from an
#                  earlier call on the same kind of host (the builds are skipped); with
#                  CPU_NATIVE=1 the CPU module is built again all the same (for a change
#                  to ggml-cpu only: the CUDA module of the same ggml is kept)
#   ROUTING="P..." the routing points pipeshard runs MoE cases at (default: calibrated
#                  uniform synthetic; `bench --routing`); upstream keeps the model's own
#                  router, and in decode computes host experts on the CPU, so its speed
#                  does not depend on locality
#   WORK=DIR       models and builds (default /tmp/pipeshard-ref)
#   OUT=DIR        where the summary, the raw logs' archive and the built modules are copied
#                  after each case (the device tool's $OUT)
#
# Results: rows are added to bench/results/summary.json (`pipeshard results
# add`), raw outputs land in bench/results/raw/CALL/, and SUMMARY.md is
# rendered again. The commands behind every row are in its `command` field
# and in bench/results/raw/CALL/commands.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
DIST=$ROOT/dist
PS=$DIST/pipeshard
UP=$DIST/upstream/bin/llama-bench
WORK=${WORK:-/tmp/pipeshard-ref}
REPS=${REPS:-3}
CALL=${CALL:-$(date -u +%Y-%m-%d)-$(hostname -s)}
SUMMARY=$ROOT/bench/results/summary.json
RAW=bench/results/raw/$CALL
THREADS=16
PROMPT=4096
GEN=64
CTX=4352

(( $# )) || { sed -n '2,/^set -e/{/^#/p}' "$0"; exit 2; }
[[ -x $PS ]] || { echo "reference: no $PS; run scripts/device/pack.sh on the dev machine and carry dist/" >&2; exit 1; }
mkdir -p "$WORK" "$RAW" ${OUT:+"$OUT"}
export LD_LIBRARY_PATH=$DIST/lib
log() { echo "[$(date -u +%H:%M:%S) +${SECONDS}s] $*" | tee -a "$RAW/harness.log"; }

case_arch() {
    case $1 in
        R1) echo llama3.1-8b ;; R2) echo qwen3-30b-a3b ;; R3) echo gpt-oss-20b ;;
        R4) echo qwen3.6-35b-a3b ;; R5) echo gemma-3-27b ;; *) return 1 ;;
    esac
}
case_quant() { case $1 in R3) echo mxfp4 ;; R4 | R5) echo q4_k_m ;; *) echo q4_0 ;; esac; }
case_budget_mib() { case $1 in R1) echo 2048 ;; R2 | R3) echo 4096 ;; R4 | R5) echo 8192 ;; *) return 1 ;; esac; }
case_moe() { [[ $1 == R[234] ]]; }
case_ncmoe() { echo "${NCMOE:-$(case $1 in R2) echo 42 40 ;; R3) echo 20 18 ;; R4) echo 32 30 ;; esac)}"; }

host_line() {
    local gpu cpu pcie
    gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
    pcie=$(nvidia-smi --query-gpu=pcie.link.gen.max,pcie.link.width.max --format=csv,noheader | head -1)
    cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
    echo "$gpu; $cpu, $(nproc) cores; PCIe gen/width $pcie"
}

# The backend modules and upstream's binaries: restored from MODULES or
# built here (both builds at once), and copied to OUT for later calls.
modules() {
    if [[ -n ${MODULES:-} && -f $MODULES/libggml-cpu.so.xz ]]; then
        cat "$MODULES"/libggml-cuda.so.xz.* | xz -d > "$DIST/lib/libggml-cuda.so"
        xz -dc "$MODULES/libggml-cpu.so.xz" > "$DIST/lib/libggml-cpu.so"
        mkdir -p "$DIST/upstream/bin"
        tar -C "$DIST/upstream/bin" -xJf "$MODULES/upstream-bin.tar.xz"
        log "modules restored from $MODULES"
        if [[ ${CPU_NATIVE:-0} == 1 ]]; then
            JOBS=16 bash scripts/device/build-cuda.sh "$DIST" --cpu-only > "$RAW/build-cpu.log" 2>&1 \
                || { tail -30 "$RAW/build-cpu.log"; exit 1; }
            log "CPU module built"
        fi
    else
        log "building the CUDA and CPU modules and upstream's llama-bench"
        (JOBS=4 bash scripts/device/build-upstream-bench.sh "$DIST" > "$RAW/build-upstream.log" 2>&1) &
        local up=$!
        JOBS=12 bash scripts/device/build-cuda.sh "$DIST" 90 --native-cpu > "$RAW/build-cuda.log" 2>&1 \
            || { tail -30 "$RAW/build-cuda.log"; exit 1; }
        wait $up || { tail -30 "$RAW/build-upstream.log"; exit 1; }
        log "modules built"
        if [[ -n ${OUT:-} ]]; then
            xz -T0 -6 -c "$DIST/lib/libggml-cuda.so" | split -b 15M -d - "$OUT/libggml-cuda.so.xz."
            xz -T0 -c "$DIST/lib/libggml-cpu.so" > "$OUT/libggml-cpu.so.xz"
            tar -C "$DIST/upstream/bin" -cJf "$OUT/upstream-bin.tar.xz" .
        fi
    fi
    bash scripts/device/cuda-stack.sh "$DIST" > /dev/null
    # Upstream runs the same kernels: pipeshard's modules beside its own
    # pristine libllama and libggml-base.
    cp "$DIST/lib/libggml-cuda.so" "$DIST/lib/libggml-cpu.so" "$DIST/upstream/bin/"
}

model_path() { echo "$WORK/$(case_arch "$1")-$2.gguf"; }

write_model() { # CASE QUANT
    local m; m=$(model_path "$1" "$2")
    [[ -f $m ]] || "$PS" synth --arch "$(case_arch "$1")" --quant "$2" -o "$m" > "$RAW/synth-$1-$2.log" 2>&1
}

# This GPU's committed profile, copied into a profile directory of the run's
# own: pipeshard measures the samples a model's types lack there on its
# first use (as on a user's machine), or a whole profile when none is
# committed.
# shellcheck source=committed-profile.sh
source scripts/device/committed-profile.sh
profile_dir() {
    local f d=$WORK/profiles
    f=$(committed_profile "$THREADS")
    mkdir -p "$d"
    [[ -z $f || -f $d/$(basename "$f") ]] || cp "$f" "$d/"
    echo "$d"
}

# Run "$@" (a logged command) into NAME.json / NAME.log under RAW.
record() { # NAME CMD...
    local name=$1; shift
    echo "$name: $*" >> "$RAW/commands.txt"
    timeout 300 "$@" > "$RAW/$name.json" 2> "$RAW/$name.log" || { log "$name failed ($?)"; return 1; }
}

# Upstream's peak: a warm-up run of the mode while nvidia-smi samples the
# process's device memory every 20 ms.
upstream_peak() { # NAME ARGS...
    local name=$1; shift
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -lms 20 > "$RAW/$name.smi" 2>/dev/null &
    local smi=$!
    LD_LIBRARY_PATH=$DIST/upstream/bin timeout 300 "$UP" "$@" -r 1 -o json > /dev/null 2>> "$RAW/$name.warmup.log" || true
    kill $smi 2>/dev/null; wait $smi 2>/dev/null || true
    awk -F', ' '{ if ($2 > m) m = $2 } END { printf "%.0f\n", (m + 0) * 1048576 }' "$RAW/$name.smi"
}

upstream_run() { # NAME ARGS...
    local name=$1; shift
    record "$name" env LD_LIBRARY_PATH="$DIST/upstream/bin" "$UP" "$@" -r 1 -o json
}

run_case() { # CASE QUANT BUDGET_MIB
    local c=$1 q=$2 b=$3 m free r mode
    m=$(model_path "$c" "$q")
    free=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1)
    local tg=(-ngl 99 -fa 1 -t "$THREADS" -p 0 -n "$GEN" -d "$PROMPT" -m "$m")
    local fit=(-fitt $((free - b)) -fitc "$CTX")
    # upstream modes aimed at the budget: name -> llama-bench arguments
    declare -A modes=([upstream-fit]="${fit[*]}")
    if case_moe "$c"; then
        modes[upstream-cpu-moe]="-ncmoe 999"
        for n in $(case_ncmoe "$c"); do modes[upstream-ncmoe-$n]="-ncmoe $n"; done
    else
        modes[upstream-ffn-cpu]="-ot ffn_(up|gate|down)=CPU"
    fi
    declare -A peak
    for mode in "${!modes[@]}"; do
        # shellcheck disable=SC2206
        local extra=(${modes[$mode]})
        peak[$mode]=$(upstream_peak "$c-$q-$mode" "${tg[@]}" "${extra[@]}")
        log "$c $q $mode: warm-up peak ${peak[$mode]} bytes"
    done
    local psargs=(bench -m "$m" --vram-budget "${b}MiB" --policies pipeshard -p "$PROMPT" -n "$GEN" -r 1
        -t "$THREADS" --tg)
    local points=(-)
    case_moe "$c" && read -ra points <<< "${ROUTING:-calibrated uniform synthetic}"
    # Upstream's full-GPU TTFT at its best ubatch, chosen in an untimed sweep.
    local ub
    upstream_run "$c-$q-upstream-full-ubatch" -ngl 99 -fa 1 -t "$THREADS" -p "$PROMPT" -n 0 -b "$PROMPT" \
        -ub "512,1024,2048,4096" -m "$m" || true
    ub=$(python3 -c 'import json, sys; t = json.load(open(sys.argv[1])); print(min(t, key=lambda x: x["avg_ns"])["n_ubatch"])' \
        "$RAW/$c-$q-upstream-full-ubatch.json" 2> /dev/null || echo 512)
    log "$c $q upstream-full: best ubatch $ub"
    local ttft_args=(-ngl 99 -fa 1 -t "$THREADS" -p "$PROMPT" -n 0 -b "$PROMPT" -ub "$ub" -m "$m")
    for ((r = 1; r <= REPS; r++)); do
        local pt
        for pt in "${points[@]}"; do
            local name=$c-$q-pipeshard
            [[ $pt == - ]] || name+=-$pt
            local routing=()
            [[ $pt == - ]] || routing=(--routing "$pt")
            record "$name-$r" "$PS" "${psargs[@]}" "${routing[@]}" -o "$WORK/bench-$name-$r" \
                && cp "$WORK/bench-$name-$r/bench.json" "$RAW/$name-$r.json"
        done
        log "$c $q pipeshard rep $r done"
        for mode in "${!modes[@]}"; do
            # shellcheck disable=SC2206
            local extra=(${modes[$mode]})
            upstream_run "$c-$q-$mode-$r" "${tg[@]}" "${extra[@]}" || true
        done
        upstream_run "$c-$q-upstream-full-pp-$r" "${ttft_args[@]}" || true
        upstream_run "$c-$q-upstream-full-tg-$r" "${tg[@]}" || true
        python3 - "$RAW/$c-$q-upstream-full-pp-$r.json" "$RAW/$c-$q-upstream-full-tg-$r.json" \
            > "$RAW/$c-$q-upstream-full-$r.json" <<'PY'
import json, sys
rows = []
for f in sys.argv[1:]:
    try:
        rows += json.load(open(f))
    except (OSError, ValueError):
        pass
print(json.dumps(rows, indent=1))
PY
        log "$c $q upstream rep $r done"
    done
    local host; host=$(host_line)
    local common=(--summary "$SUMMARY" --call "$CALL" --case "$c" --host "$host" --entry bench
        --model "$(case_arch "$c")" --quant "${q^^}")
    rows() { # SYSTEM BUDGET_MIB|- PEAK|- ROUTING|- ARGS-FOR-COMMAND FILES...
        local sys=$1 bud=$2 pk=$3 rt=$4 cmd=$5; shift 5
        local files=() f
        for f in "$@"; do [[ -s $f ]] && files+=("$f"); done
        (( ${#files[@]} )) || { log "$c $q $sys: no result"; return 0; }
        local opt=()
        [[ $bud == - ]] || opt+=(--budget "${bud}MiB")
        [[ $pk == - ]] || opt+=(--peak-bytes "$pk")
        [[ $rt == - ]] || opt+=(--routing "$rt")
        "$PS" results add "${common[@]}" --system "$sys" --command "$cmd" --raw "$RAW" "${opt[@]}" \
            --from "$([[ $sys == pipeshard ]] && echo pipeshard-bench || echo llama-bench)" "${files[@]}" \
            || log "$c $q $sys: results add failed"
    }
    for pt in "${points[@]}"; do
        if [[ $pt == - ]]; then
            rows pipeshard "$b" - - "pipeshard ${psargs[*]}" "$RAW/$c-$q-pipeshard-"[0-9]*.json
        else
            rows pipeshard "$b" - "$pt" "pipeshard ${psargs[*]} --routing $pt" "$RAW/$c-$q-pipeshard-$pt-"[0-9]*.json
        fi
    done
    for mode in "${!modes[@]}"; do
        rows "$mode" "$b" "${peak[$mode]}" - "llama-bench ${tg[*]} ${modes[$mode]} -r 1 -o json" "$RAW/$c-$q-$mode-"[0-9]*.json
    done
    rows upstream-full - - - "llama-bench ${ttft_args[*]} -r 1 -o json; llama-bench ${tg[*]} -r 1 -o json" \
        "$RAW/$c-$q-upstream-full-"[0-9]*.json
}

save() {
    "$PS" results render --summary "$SUMMARY" -o bench/results/SUMMARY.md || log "render failed"
    [[ -n ${OUT:-} ]] || return 0
    mkdir -p "$OUT"
    cp "$SUMMARY" bench/results/SUMMARY.md "$OUT/" || true
    tar -czf "$OUT/raw-$CALL.tgz" -C bench/results/raw "$CALL" || true
}

log "call $CALL on $(host_line)"
quants=()
for spec in "$@"; do
    c=${spec%%:*}
    case_arch "$c" > /dev/null || { echo "reference: unknown case $c (R1-R5)" >&2; exit 2; }
    IFS=: read -r _ q b <<< "$spec"
    quants+=("$c:${q:-$(case_quant "$c")}:${b:-$(case_budget_mib "$c")}")
done
# The models are written while the modules build.
( for s in "${quants[@]}"; do IFS=: read -r c q _ <<< "$s"; write_model "$c" "$q"; done ) &
writer=$!
modules
wait $writer || { log "writing the models failed"; exit 1; }
log "models written"
PIPESHARD_PROFILE_DIR=$(profile_dir)
export PIPESHARD_PROFILE_DIR
for s in "${quants[@]}"; do
    IFS=: read -r c q b <<< "$s"
    run_case "$c" "$q" "$b"
    save
done
log "done"
