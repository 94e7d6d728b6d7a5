#!/usr/bin/env bash
# pipeshard-server (llama.cpp's own server with pipeshard's plan) on the GPU
# machine, against the issue's targets: R2 (qwen3-30b-a3b shapes, Q4_0) at
# 4 GiB, one client and 4 concurrent clients (reference case: 4096-token
# prompt, 64 generated, context 4352 per client, F16 KV, flash attention,
# 16 threads), R1 in Q4_K_M at 2 GiB with one client (context 4352), and
# the VL preset with a 1080p image at 4 GiB. Prints each
# client's timings, the server's /metrics gauges and the process's peak
# device memory as nvidia-smi reports it.
#
# Run from the repository root with dist/ from scripts/device/pack.sh:
#   bash scripts/device/server-bench.sh all        (or: r2, r1k, vl, np4, np4up)
# Everything lands in $PIPESHARD_WORK/results (default /root/w/results).
set -euo pipefail
W=${PIPESHARD_WORK:-/root/w}
RES=$W/results
mkdir -p "$W" "$RES"
P=dist/pipeshard
# Another server binary (e.g. an earlier build, for a before/after in one call).
S=${PIPESHARD_SERVER:-dist/pipeshard-server}
PORT=18080

# shellcheck source=committed-profile.sh
source scripts/device/committed-profile.sh

# The CUDA module, and this GPU's committed profile (measured when there is none).
prepare() {
    [[ -f dist/lib/libggml-cuda.so ]] || ( time bash dist/build-cuda.sh dist 90 ) > "$RES/build-cuda.log" 2>&1 || { tail -30 "$RES/build-cuda.log"; exit 1; }
    local committed
    committed=$(committed_profile 16)
    [[ -f $RES/profile.yaml ]] || { [[ -n $committed ]] && cp "$committed" "$RES/profile.yaml"; } \
        || $P profile --mode fast -t 16 -o "$RES/profile.yaml"
}

synth() { # NAME ARCH QUANT
    [[ -f $W/$1.gguf ]] || $P synth --arch "$2" --quant "$3" -o "$W/$1.gguf"
}

# launch NAME CMD...: start a server, wait until it is healthy, sample the
# process's device memory every SMI_EVERY seconds (default 0.1) into
# $RES/NAME.smi.
launch() {
    local name=$1; shift
    "$@" > "$RES/$name.log" 2>&1 &
    SPID=$!
    # SMI=0: no nvidia-smi loop (each query takes CPU time from the threads
    # of the CPU's matmuls); the peak is then /metrics' NVML figure.
    [[ ${SMI:-1} == 0 ]] || ( while kill -0 $SPID 2>/dev/null; do
          nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -v p=$SPID '$1+0==p {print $2}'
          sleep "${SMI_EVERY:-0.1}"
      done > "$RES/$name.smi" ) &
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && return 0
        kill -0 $SPID 2>/dev/null || { tail -30 "$RES/$name.log"; return 1; }
        sleep 0.5
    done
    echo "$name: not healthy after 300 s"; tail -30 "$RES/$name.log"; return 1
}

# serve NAME ARGS...: pipeshard-server with the reference settings.
serve() {
    local name=$1; shift
    launch "$name" $S --host 127.0.0.1 --port $PORT --metrics -t 16 -fa on -ctk f16 -ctv f16 \
        --profile "$RES/profile.yaml" "$@"
}

stop() { # NAME
    curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^(pipeshard_|llamacpp:(prompt_tokens_total|tokens_predicted_total))' | tee "$RES/$1.metrics"
    curl -s "http://127.0.0.1:$PORT/props" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin).get("pipeshard")))' > "$RES/$1.props.json"
    kill $SPID; wait $SPID 2>/dev/null || true
    [[ -f $RES/$1.smi ]] && echo "$1: peak process device memory (nvidia-smi) $(sort -n "$RES/$1.smi" | tail -1) MiB (the budget, where one is given: 4096 MiB)"
    return 0
}

# clients N: N concurrent /completion requests of the reference case;
# LATE_S=S sends the last one S seconds after the others (with four
# clients and S shorter than three prompts' evaluation: "3+1" arrival).
clients() {
    python3 - "$PORT" "$1" "${LATE_S:-0}" <<'PY'
import hashlib, json, sys, threading, time, urllib.request
port, n, late = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
out = [None] * n
def one(i):
    if i == n - 1 and n > 1:
        time.sleep(late)
    # 4096 prompt tokens (token ids: the synthetic vocabulary has no words), different per client
    prompt = [1000 + (i * 7919 + k * 104729) % 20000 for k in range(4096)]
    body = {"prompt": prompt, "n_predict": 64, "ignore_eos": True, "temperature": 0, "cache_prompt": False}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(), {"Content-Type": "application/json"})
    t0 = time.time()
    j = json.loads(urllib.request.urlopen(req, timeout=600).read())
    out[i] = dict(wall_s=round(time.time() - t0, 2), **{k: j["timings"][k] for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_second")},
                  content_sha1=hashlib.sha1(j["content"].encode()).hexdigest()[:12])
ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
[t.start() for t in ts]; [t.join() for t in ts]
for o in out:
    print(json.dumps(o))
total = sum(o["predicted_n"] for o in out) / (max(o["predicted_ms"] for o in out) / 1e3)
each = [o["predicted_per_second"] for o in out]
print(json.dumps({"clients": n, "decode_tok_s_total": round(total, 1), "decode_tok_s_each": [round(x, 1) for x in each], "sum_of_each": round(sum(each), 1)}))
PY
}

# r2_1 NAME [EXTRA...] / r2_4 NAME [EXTRA...]: R2 with one client, and
# with four concurrent clients, EXTRA replacing the budget (e.g. upstream's
# own placement: --cpu-moe -ngl 99 and no budget). Two rounds of clients,
# or ROUNDS=N for N.
r2_1() {
    local name=$1; shift
    prepare; synth r2 qwen3-30b-a3b q4_0
    (($#)) || set -- --vram-budget 4GiB
    serve "$name" -m "$W/r2.gguf" -c 4352 -np 1 "$@"
    clients 1 | tee "$RES/$name.clients"       # warm-up and target: >= 48 tok/s
    local r
    for ((r = 1; r < ${ROUNDS:-2}; r++)); do clients 1 | tee -a "$RES/$name.clients"; done
    stop "$name"
}
r2_4() {
    local name=$1; shift
    prepare; synth r2 qwen3-30b-a3b q4_0
    (($#)) || set -- --vram-budget 4GiB
    serve "$name" -m "$W/r2.gguf" -c 17408 -np 4 --kv-unified "$@"
    clients 4 | tee "$RES/$name.clients"       # target: >= 95 tok/s in total
    local r
    for ((r = 1; r < ${ROUNDS:-2}; r++)); do clients 4 | tee -a "$RES/$name.clients"; done
    stop "$name"
}
# r2_4d NAME [EXTRA...]: four clients at llama-server's default flags for an
# explicit -np (a KV stream per slot, no --kv-unified), as a user runs it.
r2_4d() {
    local name=$1; shift
    prepare; synth r2 qwen3-30b-a3b q4_0
    (($#)) || set -- --vram-budget 4GiB
    serve "$name" -m "$W/r2.gguf" -c 17408 -np 4 "$@"
    grep -E "pipeshard plan for|kv_unified" "$RES/$name.log" | tail -2
    clients 4 | tee "$RES/$name.clients"       # target (issue 40): >= 0.95x the --kv-unified total
    local r
    for ((r = 1; r < ${ROUNDS:-2}; r++)); do clients 4 | tee -a "$RES/$name.clients"; done
    stop "$name"
}

# Upstream's llama-server from the same release, unpatched
# (build-upstream-bench.sh), run from its directory: its own libllama and
# libggml-base, and our CUDA and CPU modules copied beside it.
UPSTREAM_SERVER=${UPSTREAM_SERVER:-dist/upstream/bin/llama-server}
# Upstream's modes aimed at the budget (issue 40: its best in-budget mode
# of the same run). R2's experts are 48 layers x 128 x 3 x 2048 x 768 Q4_0,
# 324 MiB a layer; the KV cache of -c 17408 in F16 is 17408 cells x 48
# layers x 4 KV heads x 128 x 2 (K, V) x 2 B = 1632 MiB. llama-bench with
# every expert on the CPU peaked at 2206 MiB with a 4160-cell cache
# (390 MiB; call 2026-11-28-a, -ncmoe 42 at 4186), so the server's
# --cpu-moe needs about 2206 + 1242 = 3448 MiB: two layers of experts more
# fit 4 GiB just (-ncmoe 46, about 4096 MiB), one fits (-ncmoe 47).
UPMODES_DEFAULT="cpu-moe ncmoe-47 ncmoe-46 fit"

up_prepare() {
    prepare
    [[ -x $UPSTREAM_SERVER ]] || ( time bash dist/build-upstream-bench.sh dist pristine llama-server ) \
        > "$RES/build-upstream.log" 2>&1 || { tail -30 "$RES/build-upstream.log"; exit 1; }
    [[ -x $UPSTREAM_SERVER ]] || { echo "no upstream llama-server at $UPSTREAM_SERVER" >&2; exit 1; }
    local m dir
    dir=$(dirname "$UPSTREAM_SERVER")
    for m in libggml-cuda.so libggml-cpu.so; do [[ -f $dir/$m ]] || cp "dist/lib/$m" "$dir/"; done
}

# up_mode_flags MODE: llama-server's flags for one of upstream's modes at
# the budget (UP_BUDGET_MIB, default 4096): cpu-moe (every layer's experts
# on the CPU), ncmoe-N (the first N layers' experts on the CPU), fit
# (upstream's --fit, told to leave all of the card's free memory but the
# budget; it places the tensors, -c stays as given).
up_mode_flags() {
    case $1 in
        cpu-moe) echo "-ngl 99 -fit off --cpu-moe" ;;
        ncmoe-[0-9]*) echo "-ngl 99 -fit off -ncmoe ${1#ncmoe-}" ;;
        fit)
            local free
            free=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1)
            echo "-fit on -fitt $((free - ${UP_BUDGET_MIB:-4096}))" ;;
        *) echo "unknown upstream mode '$1' (cpu-moe, ncmoe-N, fit)" >&2; return 1 ;;
    esac
}

# up_r2_4 NAME MODE: upstream's llama-server with R2 and the four clients
# of r2_4d (-np 4 -c 17408, a KV stream per slot), ROUNDS rounds. Upstream
# has no NVML gauge: its peak is nvidia-smi's, sampled even with SMI=0, but
# once a second only, since each query takes CPU time from the threads of
# the experts' matmuls (its buffers are allocated at load, which that rate
# still sees).
up_r2_4() {
    local name=$1 mode=$2 flags extra r
    up_prepare; synth r2 qwen3-30b-a3b q4_0
    flags=$(up_mode_flags "$mode") || exit 1
    read -ra extra <<< "$flags"
    echo "$name: llama-server -np 4 -c 17408 ${extra[*]}" | tee "$RES/$name.flags"
    # -lv 4: the log keeps fit's decisions, the buffers' sizes and the
    # memory breakdown at exit (no line per token). A mode that does not
    # start (e.g. out of memory) is a failed row, not the end of the plan.
    SMI=1 SMI_EVERY=1 launch "$name" env LD_LIBRARY_PATH="$(dirname "$UPSTREAM_SERVER")" "$UPSTREAM_SERVER" \
        -m "$W/r2.gguf" -c 17408 -np 4 -t 16 -fa on -ctk f16 -ctv f16 --host 127.0.0.1 --port $PORT --metrics \
        -lv 4 "${extra[@]}" || {
        kill "$SPID" 2>/dev/null || true; wait "$SPID" 2>/dev/null || true
        echo "$name: failed"; return 0
    }
    grep -E "common_params_fit_impl|common_fit_params|(model|KV|compute) buffer size" "$RES/$name.log" \
        | tail -12 || true
    clients 4 | tee "$RES/$name.clients"
    for ((r = 1; r < ${ROUNDS:-2}; r++)); do clients 4 | tee -a "$RES/$name.clients"; done
    stop "$name"
}

# np4_summary NAME...: the median four-client total of each NAME over its
# REPS repetitions (NAME-1.clients ...), with the ratios the issue judges:
# a stream per slot over --kv-unified (>= 0.95), and pipeshard's default
# flags over upstream's best mode (>= 2); upstream's peaks beside them.
np4_summary() {
    python3 - "$RES" "${REPS:-3}" "$@" <<'PY'
import json, os, statistics, sys
res, reps, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def totals(name):
    out = []
    for i in range(1, reps + 1):
        if not os.path.exists(f"{res}/{name}-{i}.clients"):
            continue  # an upstream mode that failed to start
        for line in open(f"{res}/{name}-{i}.clients"):
            j = json.loads(line)
            if "decode_tok_s_total" in j:
                out.append(j["decode_tok_s_total"])
    return out
def peak_mib(name):
    mib = [float(l) for i in range(1, reps + 1) if os.path.exists(f"{res}/{name}-{i}.smi")
           for l in open(f"{res}/{name}-{i}.smi") if l.strip()]
    return max(mib, default=None)
out, med = {}, {}
for n in names:
    t = totals(n)
    if t:
        med[n] = statistics.median(t)
    if n == "np4-default":
        out.update(default_flags=t, median_default=med[n])
    elif n == "np4-unified":
        out.update(kv_unified=t, median_unified=med[n])
    elif t:
        out.setdefault("upstream", {})[n[len("np4up-"):]] = {"totals": t, "median": med[n], "peak_mib": peak_mib(n)}
    else:
        out.setdefault("upstream_failed", []).append(n[len("np4up-"):])
if "np4-default" in med and "np4-unified" in med:
    out["ratio"] = round(med["np4-default"] / med["np4-unified"], 3)
if "upstream" in out:
    best = max(out["upstream"], key=lambda m: out["upstream"][m]["median"])
    out["upstream_best"] = best
    if "np4-default" in med:
        out["ratio_to_upstream_best"] = round(med["np4-default"] / out["upstream"][best]["median"], 3)
print(json.dumps(out))
PY
}

# np4: four clients with a stream per slot (default flags) and with
# --kv-unified, interleaved, REPS times (default 3), each ROUNDS rounds of
# clients; then the median totals and their ratio. ROUTING=calibrated (or
# synthetic, uniform) serves with --bench-routing, which the rows' flags name;
# TIMING=1 logs the scheduler's per-graph timing (GGML_SCHED_TIMING) into each
# server's log. UPMODES="MODE..." (up_mode_flags) runs upstream's llama-server
# in those modes with the same clients within each repetition, and the
# summary adds their medians and pipeshard's ratio to the best of them
# (upstream keeps the model's own router whatever ROUTING says).
np4() {
    local extra=(--vram-budget 4GiB) i m modes names=(np4-default np4-unified)
    [[ -z ${ROUTING:-} ]] || extra+=(--bench-routing "$ROUTING")
    [[ ${TIMING:-0} == 0 ]] || export GGML_SCHED_TIMING=1
    read -ra modes <<< "${UPMODES:-}"
    for ((i = 1; i <= ${REPS:-3}; i++)); do
        r2_4d "np4-default-$i" "${extra[@]}"
        r2_4 "np4-unified-$i" "${extra[@]}"
        for m in "${modes[@]}"; do up_r2_4 "np4up-$m-$i" "$m"; done
    done
    for m in "${modes[@]}"; do names+=("np4up-$m"); done
    np4_summary "${names[@]}" | tee "$RES/np4.txt"
}

# np4up [MODE...]: upstream's llama-server alone, each MODE (default
# $UPMODES, else UPMODES_DEFAULT) in turn, REPS times (default 3); then each
# mode's median total and peak, and the best mode.
np4up() {
    local i m modes names=()
    read -ra modes <<< "${*:-${UPMODES:-$UPMODES_DEFAULT}}"
    for ((i = 1; i <= ${REPS:-3}; i++)); do
        for m in "${modes[@]}"; do up_r2_4 "np4up-$m-$i" "$m"; done
    done
    for m in "${modes[@]}"; do names+=("np4up-$m"); done
    np4_summary "${names[@]}" | tee "$RES/np4up.txt"
}

r2() {
    r2_1 r2-1
    r2_4 r2-4
    r2_4d r2-4d
}

# r1k: R1 in Q4_K_M at 2 GiB, one client, two rounds (target: within 10%
# of `pipeshard bench`'s decode).
r1k() {
    prepare; synth r1k llama3.1-8b q4_k_m
    serve r1k -m "$W/r1k.gguf" -c 4352 -np 1 --vram-budget 2GiB
    clients 1 | tee "$RES/r1k.clients"
    clients 1 | tee -a "$RES/r1k.clients"
    stop r1k
}

vl() { # [NAME [EXTRA...]]
    local name=${1:-vl-4g}; shift || true
    prepare
    [[ -f $W/vl.gguf ]] || $P synth --arch qwen2.5-vl-7b --quant q4_0 -o "$W/vl.gguf" --mmproj-out "$W/vl-mmproj.gguf"
    [[ -f $W/1080p.png ]] || python3 scripts/device/make-images.py "$W"
    serve "$name" -m "$W/vl.gguf" -mm "$W/vl-mmproj.gguf" --vram-budget 4GiB -c 8192 -np 1 "$@"
    python3 - "$PORT" "$W/1080p.png" <<'PY' | tee "$RES/$name.clients"   # target: >= 25 tok/s decode
import base64, json, sys, urllib.request
port, png = int(sys.argv[1]), sys.argv[2]
img = base64.b64encode(open(png, "rb").read()).decode()
for run in range(2):
    body = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{img}"}},
        {"type": "text", "text": "Describe this image in detail."}]}],
        "max_tokens": 64, "temperature": 0, "ignore_eos": True, "cache_prompt": False}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    t = json.loads(urllib.request.urlopen(req, timeout=600).read())["timings"]
    print(json.dumps({"run": run, **{k: t[k] for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_per_second")}}))
PY
    stop "$name"
}

# tiers: the same prompts (about 512 and 16k tokens of plain words) through
# `pipeshard run` and through the server, R1 at 2 GiB with one context size
# (issue 15: the server within 10% of `run`), and /metrics' counter of the
# weight bytes streamed.
tiers() {
    prepare; synth r1 llama3.1-8b q4_0
    python3 scripts/device/make-prompt.py 262 > "$W/p512.txt"
    python3 scripts/device/make-prompt.py 8330 > "$W/p16k.txt"
    local p
    for p in p512 p16k; do
        timeout 200 $P run -m "$W/r1.gguf" --vram-budget 2GiB --profile "$RES/profile.yaml" -f "$W/$p.txt" \
            -n 16 --ignore-eos -c 16896 -t 16 --flash-attn on --json > "$RES/tiers-run-$p.out" 2> "$RES/tiers-run-$p.err" \
            || echo "run $p failed: $?" | tee -a "$RES/tiers-run-$p.err"
        grep -E "^plan:" "$RES/tiers-run-$p.err" | sed "s/^/run $p: /"
        tail -1 "$RES/tiers-run-$p.err" | python3 -c 'import sys,json
j=json.loads(sys.stdin.read()); s=j["stats"]
print("run: prompt %d tokens, ttft %.0f ms, decode %.1f tok/s" % (s["prompt_tokens"], s["ttft_ms"], s["decode_tokens_per_s"]))' \
            | sed "s/^/$p /" | tee -a "$RES/tiers.txt"
    done
    serve r1-tiers -m "$W/r1.gguf" --vram-budget 2GiB -c 16896 -np 1
    grep -E "pipeshard plan for" "$RES/r1-tiers.log" | tail -1
    python3 - "$PORT" "$W" <<'PY' | tee -a "$RES/tiers.txt"
import json, sys, urllib.request
port, w = int(sys.argv[1]), sys.argv[2]
def metric(name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    return int(float(next(l.split()[1] for l in text.splitlines() if l.startswith(name + " "))))
for p in ("p512", "p16k"):
    text = open(f"{w}/{p}.txt").read()
    for run in range(2):
        before = metric("pipeshard_bytes_streamed_total")
        body = {"prompt": text, "n_predict": 16, "ignore_eos": True, "temperature": 0, "cache_prompt": False}
        req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(), {"Content-Type": "application/json"})
        t = json.loads(urllib.request.urlopen(req, timeout=600).read())["timings"]
        streamed = metric("pipeshard_bytes_streamed_total") - before
        print("%s server run %d: prompt %d tokens, prompt %.0f ms, decode %.1f tok/s, streamed %.2f GiB" % (
            p, run, t["prompt_n"], t["prompt_ms"], t["predicted_per_second"], streamed / 2**30))
PY
    stop r1-tiers
}

all() { r2; vl; }

"$@"
