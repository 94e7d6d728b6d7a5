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
#   bash scripts/device/server-bench.sh all        (or: r2, r1k, vl, np4)
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

# serve NAME ARGS...: start the server, wait until it is healthy, sample the
# process's device memory every 100 ms into $RES/NAME.smi.
serve() {
    local name=$1; shift
    $S --host 127.0.0.1 --port $PORT --metrics -t 16 -fa on -ctk f16 -ctv f16 --profile "$RES/profile.yaml" "$@" \
        > "$RES/$name.log" 2>&1 &
    SPID=$!
    # SMI=0: no nvidia-smi loop (each query takes CPU time from the threads
    # of the CPU's matmuls); the peak is then /metrics' NVML figure.
    [[ ${SMI:-1} == 0 ]] || ( while kill -0 $SPID 2>/dev/null; do
          nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -v p=$SPID '$1+0==p {print $2}'
          sleep 0.1
      done > "$RES/$name.smi" ) &
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && return 0
        kill -0 $SPID 2>/dev/null || { tail -30 "$RES/$name.log"; return 1; }
        sleep 0.5
    done
    echo "$name: not healthy after 300 s"; tail -30 "$RES/$name.log"; return 1
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

# np4: four clients with a stream per slot (default flags) and with
# --kv-unified, interleaved, REPS times (default 3), each ROUNDS rounds of
# clients; then the median totals and their ratio. ROUTING=calibrated (or
# synthetic, uniform) serves with --bench-routing, which the rows' flags name;
# TIMING=1 logs the scheduler's per-graph timing (GGML_SCHED_TIMING) into each
# server's log.
np4() {
    local extra=(--vram-budget 4GiB) i
    [[ -z ${ROUTING:-} ]] || extra+=(--bench-routing "$ROUTING")
    [[ ${TIMING:-0} == 0 ]] || export GGML_SCHED_TIMING=1
    for ((i = 1; i <= ${REPS:-3}; i++)); do
        r2_4d "np4-default-$i" "${extra[@]}"
        r2_4 "np4-unified-$i" "${extra[@]}"
    done
    python3 - "$RES" "${REPS:-3}" <<'PY' | tee "$RES/np4.txt"
import json, statistics, sys
res, reps = sys.argv[1], int(sys.argv[2])
def totals(kind):
    out = []
    for i in range(1, reps + 1):
        for line in open(f"{res}/np4-{kind}-{i}.clients"):
            j = json.loads(line)
            if "decode_tok_s_total" in j:
                out.append(j["decode_tok_s_total"])
    return out
d, u = totals("default"), totals("unified")
md, mu = statistics.median(d), statistics.median(u)
print(json.dumps({"default_flags": d, "kv_unified": u, "median_default": md, "median_unified": mu, "ratio": round(md / mu, 3)}))
PY
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
