#!/usr/bin/env bash
# The exact steps run on the GPU machine (no Rust, no network there), in two
# calls because one upload is limited to 64 MiB and the default model is 98 MB:
#   stage1: build the CUDA module (and a native CPU module), write the R1/R2
#           models with `pipeshard synth`, measure the machine profile, plan.
#   stage2: reassemble the default model, run it fully on the GPU, then
#           `pipeshard bench` R1 at 2 GiB and R2 at 4 GiB against upstream policies.
# Run from the repository root with dist/ (scripts/device/pack.sh) present.
set -euo pipefail
W=${PIPESHARD_WORK:-/root/w}
RES=$W/results
mkdir -p "$W" "$RES"
P=dist/pipeshard
SMOL_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

stage1() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$RES/machine.txt"
    lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$RES/machine.txt"
    cp .stash/smol.part1 "$W/"
    mkdir -p dist/lib-avx2 && cp dist/lib/libggml-cpu.so dist/lib-avx2/
    [[ -d .stash/lib ]] && cp -a .stash/lib/. dist/lib/
    [[ -f dist/lib/libggml-cuda.so ]] || ( time bash dist/build-cuda.sh dist 90 --native-cpu ) > "$RES/build-cuda.log" 2>&1 || { tail -30 "$RES/build-cuda.log"; exit 1; }
    tail -3 "$RES/build-cuda.log"
    $P synth --arch llama3.1-8b --quant q4_0 -o "$W/r1.gguf"
    $P synth --arch qwen3-30b-a3b --quant q4_0 -o "$W/r2.gguf"
    $P profile --mode fast -t 16 -o "$RES/profile.yaml"
    $P plan -m "$W/r1.gguf" --vram-budget 2GiB -c 4352 --profile "$RES/profile.yaml" | tee "$RES/plan-r1-2gib.txt"
    $P plan -m "$W/r2.gguf" --vram-budget 4GiB -c 4352 --profile "$RES/profile.yaml" | tee "$RES/plan-r2-4gib.txt"
}

# The default model, uploaded in two parts (one upload is at most 64 MiB).
join_smol() {
    cat "$W/smol.part1" .stash/smol.part2 > "$W/smol.gguf"
    echo "$SMOL_SHA  $W/smol.gguf" | sha256sum -c
}

stage2() {
    join_smol
    smol
    bench
}

smol() {
    $P run -m "$W/smol.gguf" --n-gpu-layers=-1 --chat -p "What is the capital of France?" -n 64 -t 16 2>&1 | tee "$RES/smol-gpu.txt"
    $P run -m "$W/smol.gguf" --n-gpu-layers=-1 -p "The three primary colors are" -n 64 -t 16 --json 2>&1 | tee -a "$RES/smol-gpu.txt"
}

bench() {
    [[ -f .stash/pipeshard ]] && cp .stash/pipeshard dist/pipeshard
    $P bench -m "$W/r1.gguf" --vram-budget 2GiB -p 4096 -n 64 -r 2 -t 16 --profile "$RES/profile.yaml" -o "$RES/r1" 2>&1 | tee "$RES/bench-r1.log"
    $P bench -m "$W/r2.gguf" --vram-budget 4GiB -p 4096 -n 64 -r 2 -t 16 --profile "$RES/profile.yaml" -o "$RES/r2" 2>&1 | tee "$RES/bench-r2.log"
}

# Issue-6 comparison: R1 at 2/4/6/8 GiB, R2 at 4/8/12 GiB, in two calls.
prepare() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$RES/machine.txt"
    lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$RES/machine.txt"
    [[ -f dist/lib/libggml-cuda.so ]] || ( time bash dist/build-cuda.sh dist 90 --native-cpu ) > "$RES/build-cuda.log" 2>&1
    [[ -f $W/r1.gguf ]] || $P synth --arch llama3.1-8b --quant q4_0 -o "$W/r1.gguf"
    [[ -f $W/r2.gguf ]] || $P synth --arch qwen3-30b-a3b --quant q4_0 -o "$W/r2.gguf"
    [[ -f $RES/profile.yaml ]] || $P profile --mode fast -t 16 -o "$RES/profile.yaml"
}

bench_set() { # NAME MODEL BUDGETS
    $P bench -m "$W/$2.gguf" --vram-budget "$3" -p 4096 -n 64 -r 2 -t 16 --profile "$RES/profile.yaml" \
        -o "$RES/$1" 2>&1 | tee "$RES/$1.log"
}

full1() { prepare; bench_set r1-a r1 2GiB,4GiB; }
full2() { bench_set r1-b r1 6GiB,8GiB; bench_set r2 r2 4GiB,8GiB,12GiB; }
r2only() { prepare; bench_set r2 r2 4GiB; }

bench_policies() { # NAME MODEL BUDGETS POLICIES
    $P bench -m "$W/$2.gguf" --vram-budget "$3" --policies "$4" -p 4096 -n 64 -r 2 -t 16 \
        --profile "$RES/profile.yaml" -o "$RES/$1" 2>&1 | tee "$RES/$1.log"
}

# After the profile and planner fixes: the reference cases with every
# policy, and pipeshard alone at the other budgets.
final() {
    prepare
    bench_policies r1-ref r1 2GiB pipeshard,fit,ngl,attn-gpu
    bench_policies r2-ref r2 4GiB pipeshard,fit,ngl,attn-gpu
    bench_policies r1-budgets r1 4GiB,6GiB,8GiB pipeshard
    bench_policies r2-budgets r2 8GiB,12GiB pipeshard
}

# Session 2 (issue 4, overlapped streaming): call s1, then s2 within the
# machine's warm window. The committed H200 profile is used when the GPU is
# an H200; otherwise a fast profile is measured.
sprep() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$RES/machine.txt"
    lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$RES/machine.txt"
    [[ -f dist/lib/libggml-cuda.so ]] || ( time bash dist/build-cuda.sh dist 90 --native-cpu ) > "$RES/build-cuda.log" 2>&1 \
        || { tail -30 "$RES/build-cuda.log"; exit 1; }
    [[ -f $W/r1.gguf ]] || $P synth --arch llama3.1-8b --quant q4_0 -o "$W/r1.gguf"
    [[ -f $W/r2.gguf ]] || $P synth --arch qwen3-30b-a3b --quant q4_0 -o "$W/r2.gguf"
    if [[ ! -f $RES/profile.yaml ]]; then
        if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
            cp profiles/intel-r-xeon-r-processor__nvidia-h200__t16.yaml "$RES/profile.yaml"
        else
            $P profile --mode fast -t 16 -o "$RES/profile.yaml"
        fi
    fi
}

lossless() { # NAME MODEL BUDGET [EXTRA...]
    local name=$1 model=$2 budget=$3; shift 3
    timeout 300 $P lossless -m "$model" --vram-budget "$budget" --profile "$RES/profile.yaml" -n 128 -t 16 "$@" \
        > "$RES/lossless-$name.json" 2> "$RES/lossless-$name.log" || echo "lossless $name failed: $?" | tee -a "$RES/lossless-$name.log"
    tail -1 "$RES/lossless-$name.log"
}

s1() {
    sprep
    cp .stash/smol.part1 "$W/"
    lossless r1-modes "$W/r1.gguf" 2GiB
    timeout 330 $P bench -m "$W/r1.gguf" --vram-budget 2GiB --policies pipeshard,pipeshard-sync,fit,ngl,attn-gpu \
        -p 4096 -n 64 -r 2 -t 16 --profile "$RES/profile.yaml" -o "$RES/r1-ref" > "$RES/r1-ref.log" 2>&1
    tail -12 "$RES/r1-ref.log"
}

s2() {
    join_smol
    lossless smol-modes "$W/smol.gguf" 64MiB
    lossless r1-plan "$W/r1.gguf" 2GiB
    lossless r2-modes "$W/r2.gguf" 4GiB
    timeout 330 $P bench -m "$W/r2.gguf" --vram-budget 4GiB --policies pipeshard,pipeshard-sync,fit,ngl,attn-gpu \
        -p 4096 -n 64 -r 2 -t 16 --profile "$RES/profile.yaml" -o "$RES/r2-ref" > "$RES/r2-ref.log" 2>&1
    tail -12 "$RES/r2-ref.log"
}

one() { # NAME MODEL BUDGET POLICY [EXTRA...]: one policy in its own process
    local name=$1 model=$2 budget=$3 policy=$4; shift 4
    timeout 240 $P bench -m "$W/$model.gguf" --vram-budget "$budget" --policies "$policy" -p 4096 -n 64 -r 2 -t 16 \
        --profile "${PROF:-$RES/profile.yaml}" -o "$RES/$name" "$@" > "$RES/$name.log" 2>&1 || echo "$name failed: $?"
    grep -E "TTFT|error|process VRAM" "$RES/$name.log" | sed "s/^/$name: /"
}

# Why R2 gains little from overlap, and whether the first policy of a
# process pays extra device memory: each policy in its own process.
s3() {
    sprep
    cp .stash/smol.part1 "$W/"
    one r2-pipeshard r2 4GiB pipeshard
    one r2-sync r2 4GiB pipeshard-sync
    one r2-slots4 r2 4GiB pipeshard --stream-slots 4
    one r1-slots3 r1 2GiB pipeshard --stream-slots 3
    local nsys; nsys=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1 || true)
    echo "nsys: ${nsys:-none}"
    if [[ -n $nsys ]]; then
        timeout 150 "$nsys" profile -t cuda -o "$RES/r2-nsys" --force-overwrite true \
            $P bench -m "$W/r2.gguf" --vram-budget 4GiB --policies pipeshard -p 4096 -n 4 -r 1 -t 16 \
            --profile "$RES/profile.yaml" -o "$RES/r2-nsys-bench" > "$RES/r2-nsys.log" 2>&1
        timeout 60 "$nsys" stats -r cuda_gpu_mem_size_sum,cuda_gpu_mem_time_sum,cuda_gpu_kern_sum "$RES/r2-nsys.nsys-rep" \
            > "$RES/r2-nsys-stats.txt" 2>&1
        head -40 "$RES/r2-nsys-stats.txt"
        rm -f "$RES/r2-nsys.nsys-rep" "$RES"/r2-nsys.sqlite
    fi
}

# After the pipelined cost model, 4 slots, one logits row per sequence and
# the dry-run check: pipeshard (and the same plan with synchronous copies)
# at the reference budgets and two more, each in its own process.
s4() {
    sprep
    cp .stash/smol.part1 "$W/"
    one r2-4g r2 4GiB pipeshard
    one r2-4g-sync r2 4GiB pipeshard-sync
    one r1-2g r1 2GiB pipeshard
    one r1-2g-sync r1 2GiB pipeshard-sync
    one r1-4g r1 4GiB pipeshard
    one r1-6g r1 6GiB pipeshard
    one r2-8g r2 8GiB pipeshard
}

# Upstream policies of the same library on the same machine, and the
# lossless checks.
s5() {
    join_smol
    lossless smol-modes "$W/smol.gguf" 256MiB
    lossless smol-plan "$W/smol.gguf" 256MiB
    lossless r1-plan "$W/r1.gguf" 2GiB
    lossless r2-plan "$W/r2.gguf" 4GiB
    one r1-2g-upstream r1 2GiB fit,ngl,attn-gpu
    one r2-4g-upstream r2 4GiB fit,ngl,attn-gpu
}

# With the measured streaming overhead in the budget, and the lossless
# check that streams every weight with everything on the GPU.
s6() {
    sprep
    cp .stash/smol.part1 "$W/"
    one r2-4g r2 4GiB pipeshard
    one r1-2g r1 2GiB pipeshard
    one r2-8g r2 8GiB pipeshard
}

s7() {
    join_smol
    lossless smol-modes "$W/smol.gguf" 256MiB
    lossless r1-modes "$W/r1.gguf" 2GiB
}


# Session 3 (issue 7, VLMOpt): a Qwen2.5-VL-7B-shape model and mmproj,
# images at 480p..1440p, pipeshard at 4/8/14 GiB against upstream's
# placements of the same library (LM all on the GPU or none of it, mmproj on
# the GPU or on the CPU). Call v1, then v2 within the warm window.
mkimages() {
    python3 - "$W" <<'PY'
import sys, zlib, struct, numpy as np
out = sys.argv[1]
for name, (w, h) in {"480p": (854, 480), "720p": (1280, 720), "1080p": (1920, 1080), "1440p": (2560, 1440)}.items():
    y, x = np.mgrid[0:h, 0:w]
    rng = np.random.default_rng(0)
    img = np.stack([(x * 255 // w), (y * 255 // h), ((x + y) % 256)], axis=-1).astype(np.uint8)
    img = (img.astype(np.int16) + rng.integers(-20, 20, img.shape)).clip(0, 255).astype(np.uint8)
    raw = b"".join(b"\x00" + img[r].tobytes() for r in range(h))
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) \
        + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")
    open(f"{out}/{name}.png", "wb").write(png)
PY
    ls -la "$W"/*.png
}

vrun() { # NAME RES EXTRA...: one `pipeshard run` with an image, JSON timings and peak device memory
    local name=$1 res=$2; shift 2
    timeout 150 $P run -m "$W/vl.gguf" --mmproj "$W/vl-mmproj.gguf" --image "$W/$res.png" \
        -p "Describe this image in detail." -n 64 -c 8192 -t 16 --flash-attn on --json "$@" \
        > "$RES/vlm-$name.out" 2> "$RES/vlm-$name.err" || echo "vlm $name failed: $?" >> "$RES/vlm-$name.err"
    echo "$name: $(grep -E '^vision encoder|^plan:|failed|^Error|^error' "$RES/vlm-$name.err" | tr '\n' ' ')"
    tail -1 "$RES/vlm-$name.err" | python3 -c 'import sys,json
try:
    j=json.loads(sys.stdin.read()); s=j["stats"]
    p=j["peak_device_bytes"]; p=p.get("device",0) if isinstance(p,dict) else (p or 0)
    print("   encode %.0f ms  ttft %.0f ms  decode %.1f tok/s  prompt %d tok  peak %.2f GiB  loaded %s" % (j["image_encode_ms"], s["ttft_ms"], s["decode_tokens_per_s"], s["prompt_tokens"], p/2**30, j.get("loaded_memory")))
except Exception as e: print("   (no json)", e)'
}

vres() { # RES: every configuration for one resolution
    local r=$1
    for b in 4 8 14; do vrun "$r-pipeshard-${b}g" "$r" --vram-budget "${b}GiB" --profile "$RES/profile.yaml"; done
    vrun "$r-up-gpu-mmgpu" "$r" -ngl 99
    vrun "$r-up-gpu-mmcpu" "$r" -ngl 99 --no-mmproj-offload
    vrun "$r-up-cpu-mmgpu" "$r" -ngl 0
    vrun "$r-up-cpu-mmcpu" "$r" -ngl 0 --no-mmproj-offload
}

vprep() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$RES/machine.txt"
    lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$RES/machine.txt"
    [[ -f dist/lib/libggml-cuda.so ]] || ( time bash dist/build-cuda.sh dist 90 --native-cpu ) > "$RES/build-cuda.log" 2>&1 \
        || { tail -30 "$RES/build-cuda.log"; exit 1; }
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        cp profiles/intel-r-xeon-r-processor__nvidia-h200__t16.yaml "$RES/profile.yaml"
    else
        $P profile --mode fast -t 16 -o "$RES/profile.yaml"
    fi
    [[ -f $W/vl.gguf ]] || $P synth --arch qwen2.5-vl-7b --quant q4_0 -o "$W/vl.gguf" --mmproj-out "$W/vl-mmproj.gguf"
    ls -la "$W"/vl*.gguf
    mkimages
}

v1() { vprep; vlossless 1080p; vres 1080p; }

vlossless() { # RES [EXTRA...]: image embeddings, encoder weights on the host vs full GPU
    local r=$1; shift
    timeout 90 $P lossless -m "$W/vl.gguf" --mmproj "$W/vl-mmproj.gguf" --image "$W/$r.png" -t 16 "$@" \
        > "$RES/vlm-lossless-$r$*.json" 2> "$RES/vlm-lossless-$r$*.log" || echo "lossless $r $* failed"
    echo "$r $*: $(tail -1 "$RES/vlm-lossless-$r$*.log")"
}

# Why the streamed encoder's embeddings differ: synchronous copies vs 1 and 4 slots.
v4() { vprep; vlossless 480p --vision-stream-slots 0; vlossless 480p --vision-stream-slots 1; vlossless 480p --vision-stream-slots 4; }

# After patch 0003's view fix: is the streamed encoder exact now?
v6() { vprep; for r in 480p 1080p; do for k in 0 1 4; do vlossless $r --vision-stream-slots $k; done; done; }

# With synchronous copies for the encoder (lossless): pipeshard again.
v5() {
    vprep; vlossless 1080p; vlossless 1440p
    for r in 480p 720p 1080p 1440p; do vrun "$r-pipeshard-4g" "$r" --vram-budget 4GiB --profile "$RES/profile.yaml"; done
    vrun 1080p-pipeshard-8g 1080p --vram-budget 8GiB --profile "$RES/profile.yaml"
}

v2() { vprep; vlossless 480p; vlossless 1440p; vres 480p; vres 720p; vres 1440p; }

# After v1: the encoder's pools and workspaces measured and budgeted.
vpipeshard() { # RES
    for b in 4 8 14; do vrun "$1-pipeshard-${b}g" "$1" --vram-budget "${b}GiB" --profile "$RES/profile.yaml"; done
}
v3() { vprep; vlossless 1080p; vpipeshard 1080p; vlossless 480p; vlossless 1440p; vres 480p; vres 720p; vres 1440p; }

# Session 4. w1: is the streamed encoder exact after patch 0003's view fix,
# and the shipped (synchronous) encoder timed at every resolution.
w1() {
    vprep
    for r in 480p 1080p; do for k in 0 1 4; do vlossless $r --vision-stream-slots $k; done; done
    for r in 480p 720p 1080p 1440p; do
        vrun "$r-pipeshard-4g-slots0" "$r" --vram-budget 4GiB --profile "$RES/profile.yaml" --vision-stream-slots 0
    done
}

serve_vlm() { # BUDGET [CTX]: pipeshard serve with images under a budget; peak from its /metrics
    local port=8089 log=$RES/serve-vlm-$1.log
    $P serve -m "$W/vl.gguf" --mmproj "$W/vl-mmproj.gguf" --vram-budget "$1" -c "${2:-8192}" -np 2 -t 16 \
        --flash-attn on --port $port --metrics > "$log" 2>&1 &
    local pid=$! i
    for i in $(seq 360); do curl -sf localhost:$port/health > /dev/null && break; sleep 0.5; done
    timeout 240 python3 scripts/device/vlm_client.py $port "$W" | tee "$RES/serve-vlm-$1.jsonl" || echo "client failed"
    kill $pid 2>/dev/null || true; wait $pid || true
    grep -E "plan:|vision|error|ERROR" "$log" | head -8
}

# w2: the streamed encoder timed (4 slots), the language model's lossless
# check under a plan, and serve with images at 4 GiB.
w2() {
    for r in 480p 720p 1080p 1440p; do
        vrun "$r-pipeshard-4g-slots4" "$r" --vram-budget 4GiB --profile "$RES/profile.yaml" --vision-stream-slots 4
    done
    timeout 150 $P lossless -m "$W/vl.gguf" --vram-budget 4GiB --profile "$RES/profile.yaml" -n 128 -t 16 \
        > "$RES/vlm-lm-lossless-4g.json" 2> "$RES/vlm-lm-lossless-4g.log" || echo "lm lossless failed"
    tail -1 "$RES/vlm-lm-lossless-4g.log"
    serve_vlm 4GiB
}

# w3: why R2 decodes below 48 tok/s: pinned 4 KiB pages vs huge pages
# (patch 0005, then in patches/; it made no measurable difference and is now
# bench/results/h200-session4/0005-pinned-host-hugepages.patch), and
# upstream's CPU experts with and without repacking.
w3() {
    [[ -f $W/r1.gguf ]] || $P synth --arch llama3.1-8b --quant q4_0 -o "$W/r1.gguf"
    [[ -f $W/r2.gguf ]] || $P synth --arch qwen3-30b-a3b --quant q4_0 -o "$W/r2.gguf"
    grep -H . /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag | tee -a "$RES/machine.txt"
    one r2-4g r2 4GiB pipeshard
    GGML_CUDA_HOST_HUGEPAGES=1 one r2-4g-huge r2 4GiB pipeshard &
    sleep 40; grep AnonHugePages /proc/meminfo | sed 's/^/during r2-4g-huge: /'; wait
    one r2-attn r2 4GiB attn-gpu
    one r2-attn-norepack r2 4GiB attn-gpu --no-repack
    one r1-2g r1 2GiB pipeshard
    GGML_CUDA_HOST_HUGEPAGES=1 one r1-2g-huge r1 2GiB pipeshard
}

# The CUDA and native CPU modules built in session 4's first call, brought
# back and carried (.stash/cudalib.tar.xz), so a fresh machine skips the build.
cudalib() {
    if [[ -f .stash/cudalib.tar.xz ]]; then
        cp dist/lib/libggml-cpu.so /tmp/libggml-cpu-avx2.so
        tar -C dist/lib -xJf .stash/cudalib.tar.xz
        # the CPU module was built for the H200 host's features: keep the
        # AVX2 one where this CPU lacks any of them
        local f; for f in avx512f avx512vbmi avx512_vnni avx512_bf16 avx_vnni; do
            grep -qw "$f" /proc/cpuinfo || { echo "no $f: AVX2 CPU module"; cp /tmp/libggml-cpu-avx2.so dist/lib/libggml-cpu.so; break; }
        done
    fi
    [[ -f dist/lib/libggml-cuda.so ]] || ( time bash dist/build-cuda.sh dist 90 --native-cpu ) > "$RES/build-cuda.log" 2>&1
    ls -la dist/lib/libggml-cuda.so
}

# w4: huge pages (pipeshard's default while patch 0005 was in) against 4 KiB pinned pages,
# alternated, R2 and R1; the VLM at 8 and 14 GiB with the streamed encoder.
w4() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$RES/machine.txt"
    cudalib
    cp profiles/intel-r-xeon-r-processor__nvidia-h200__t16.yaml "$RES/profile.yaml"
    [[ -f $W/r1.gguf ]] || $P synth --arch llama3.1-8b --quant q4_0 -o "$W/r1.gguf"
    [[ -f $W/r2.gguf ]] || $P synth --arch qwen3-30b-a3b --quant q4_0 -o "$W/r2.gguf"
    for k in a b; do
        one r2-4g-huge-$k r2 4GiB pipeshard
        GGML_CUDA_HOST_HUGEPAGES=0 one r2-4g-4k-$k r2 4GiB pipeshard
    done
    one r1-2g-huge r1 2GiB pipeshard
    GGML_CUDA_HOST_HUGEPAGES=0 one r1-2g-4k r1 2GiB pipeshard
}

# w5: serve with images at 8 GiB (16k context: 1440p fits a slot; at 4 GiB
# that context is refused with the minimum, 4.14 GiB), and
# the VLM run at 8 and 14 GiB with the streamed encoder.
w5() {
    [[ -f $W/vl.gguf ]] || $P synth --arch qwen2.5-vl-7b --quant q4_0 -o "$W/vl.gguf" --mmproj-out "$W/vl-mmproj.gguf"
    [[ -f $W/1080p.png ]] || mkimages > /dev/null
    serve_vlm 8GiB 16384
    for b in 8 14; do vrun "1080p-pipeshard-${b}g-slots4" 1080p --vram-budget "${b}GiB" --profile "$RES/profile.yaml"; done
}

# h1 (H100): the H100 profile, and R1/R2 with it (prediction against measurement).
h1() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$RES/machine.txt"
    lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$RES/machine.txt"
    cudalib
    $P synth --arch llama3.1-8b --quant q4_0 -o "$W/r1.gguf"
    $P synth --arch qwen3-30b-a3b --quant q4_0 -o "$W/r2.gguf"
    ( time $P profile --mode fast -t 16 -o "$RES/profile.yaml" ) > "$RES/profile.log" 2>&1; tail -4 "$RES/profile.log"
    one r1-2g r1 2GiB pipeshard
    one r2-4g r2 4GiB pipeshard
}

# Session 5. x1: hybrid experts (patches 0005/0006) on R2 at 4 GiB: the
# planner's choice, the split off, each GPU share, and a 2048 ubatch.
x1() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$RES/machine.txt"
    lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$RES/machine.txt"
    cudalib
    cp profiles/intel-r-xeon-r-processor__nvidia-h200__t16.yaml "$RES/profile.yaml"
    [[ -f $W/r2.gguf ]] || $P synth --arch qwen3-30b-a3b --quant q4_0 -o "$W/r2.gguf"
    $P plan -m "$W/r2.gguf" --vram-budget 4GiB -c 4352 --profile "$RES/profile.yaml" > "$RES/plan-r2-4g.txt" 2>&1; head -6 "$RES/plan-r2-4g.txt"
    one r2-4g-hyb r2 4GiB pipeshard
    one r2-4g-hyb0 r2 4GiB pipeshard --hybrid-experts 0
    for k in 3 4 1; do one r2-4g-hyb$k r2 4GiB pipeshard --hybrid-experts $k; done
    one r2-4g-ub2048 r2 4GiB pipeshard --plan-ubatch 2048
}

# Session 5's calls after x1 each start on a fresh H200: the modules, R1 and R2.
xprep() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$RES/machine.txt"
    cudalib
    [[ -f $W/r1.gguf ]] || $P synth --arch llama3.1-8b --quant q4_0 -o "$W/r1.gguf"
    [[ -f $W/r2.gguf ]] || $P synth --arch qwen3-30b-a3b --quant q4_0 -o "$W/r2.gguf"
}

xprofile() { # a fast profile of this machine into $RES/profile.yaml
    ( time $P profile --mode fast -t 16 -o "$RES/profile.yaml" ) > "$RES/profile.log" 2>&1 || { grep -a ERROR "$RES/profile.log" | head -3; return 1; }
    tail -4 "$RES/profile.log"
}

xplans() { # the R2 and R1 plans of $RES/profile.yaml at their reference budgets
    $P plan -m "$W/r2.gguf" --vram-budget 4GiB -c 4352 --profile "$RES/profile.yaml" > "$RES/plan-r2-4g.txt" 2>&1; sed -n 3,8p "$RES/plan-r2-4g.txt"
    $P plan -m "$W/r1.gguf" --vram-budget 2GiB -c 4352 --profile "$RES/profile.yaml" > "$RES/plan-r1-2g.txt" 2>&1; sed -n 3,5p "$RES/plan-r1-2g.txt"
}

xreference() { # R2 and R1 at their reference budgets twice each, and upstream's R2 rows
    one r2-4g r2 4GiB pipeshard
    one r2-4g-b r2 4GiB pipeshard
    one r1-2g r1 2GiB pipeshard
    one r1-2g-b r1 2GiB pipeshard
    one r2-fit r2 4GiB fit
    one r2-attn r2 4GiB attn-gpu
}

# x2: the profile re-measured (expert matmuls over 4 layers with fresh
# routing per repetition; it crashed, see x3, and the committed profile was
# used), forced GPU shares, upstream's R2 rows, and R2's plan against full GPU.
x2() {
    xprep
    xprofile || cp profiles/intel-r-xeon-r-processor__nvidia-h200__t16.yaml "$RES/profile.yaml"
    xplans
    one r2-4g r2 4GiB pipeshard
    one r2-4g-hyb4 r2 4GiB pipeshard --hybrid-experts 4
    one r2-4g-hyb5 r2 4GiB pipeshard --hybrid-experts 5
    one r2-4g-hyb0 r2 4GiB pipeshard --hybrid-experts 0
    one r2-4g-b r2 4GiB pipeshard
    one r1-2g r1 2GiB pipeshard
    one r2-fit r2 4GiB fit
    one r2-attn r2 4GiB attn-gpu
    lossless r2-plan "$W/r2.gguf" 4GiB
}

# x3: x2's profile again (the first try set the routing only after the
# warm-up run, whose random ids crashed the GPU benchmark), the plans it
# makes run, and R2 with every weight streamed against the full GPU.
x3() {
    xprep; xprofile; xplans
    one r2-4g r2 4GiB pipeshard
    one r2-4g-b r2 4GiB pipeshard
    one r1-2g r1 2GiB pipeshard
    lossless r2-modes "$W/r2.gguf" 4GiB
}

# x4: the profile with expert matmuls also at half the experts per token
# (the op's fixed cost), its R2 plan run twice, R1 once, upstream's R2 rows.
x4() {
    xprep; xprofile; xplans
    one r2-4g r2 4GiB pipeshard
    one r2-4g-b r2 4GiB pipeshard
    one r1-2g r1 2GiB pipeshard
    one r2-fit r2 4GiB fit
    one r2-attn r2 4GiB attn-gpu
}

# x5: with x4's profile (then profiles/...nvidia-h200__t16.yaml) and the
# hybrid cost with the CPU part's transfers: R1 and R2 at their reference
# budgets, upstream's R2 rows, and two more budgets each for issue 3.
x5() {
    xprep
    cp profiles/intel-r-xeon-r-processor__nvidia-h200__t16.yaml "$RES/profile.yaml"
    $P plan -m "$W/r2.gguf" --vram-budget 4GiB -c 4352 --profile "$RES/profile.yaml" > "$RES/plan-r2-4g.txt" 2>&1; sed -n 3,5p "$RES/plan-r2-4g.txt"
    one r2-4g-warm r2 4GiB pipeshard
    xreference
    one r1-4g r1 4GiB pipeshard
    one r1-6g r1 6GiB pipeshard
    one r2-8g r2 8GiB pipeshard
    one r2-12g r2 12GiB pipeshard
}

# x6: the profile with dense matmuls over four weights (one alone sat in the
# host's last-level cache; now profiles/...nvidia-h200__t16.yaml), and what
# its plans do: R1 at 2 and 4 GiB, R2 at 4.
x6() {
    xprep; xprofile
    one r1-2g r1 2GiB pipeshard
    one r1-4g r1 4GiB pipeshard
    one r2-4g r2 4GiB pipeshard
    one r1-2g-b r1 2GiB pipeshard
    one r2-4g-b r2 4GiB pipeshard
}

# h2 (H100): the profile re-measured as on the H200 in x6, and R1/R2 with it
# (hybrid experts for R2), against upstream's R2 rows.
h2() {
    xprep
    lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$RES/machine.txt"
    xprofile
    xreference
}

# Session 6: speculative decoding. R1 runs `pipeshard run` on a 4,090-token
# prompt (scripts/device/make-prompt.py) with 64 tokens generated at its
# depth, with and without a Llama-3.2-1B-shaped draft, JSON stats to $RES.
yprep() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$RES/machine.txt"
    cudalib
    [[ -f $W/r1.gguf ]] || $P synth --arch llama3.1-8b --quant q4_0 -o "$W/r1.gguf"
    local gpu; gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    case $gpu in
        *H200*) cp profiles/intel-r-xeon-r-processor__nvidia-h200__t16.yaml "$RES/profile.yaml" ;;
        *) cp profiles/intel-r-xeon-r-processor__nvidia-h100-80gb-hbm3__t16.yaml "$RES/profile.yaml" ;;
    esac
    [[ -f $W/draft.gguf ]] || $P synth --arch llama3.2-1b --quant q4_0 -o "$W/draft.gguf"
    python3 scripts/device/make-prompt.py > "$W/prompt.txt"
}

yplan() { # NAME BUDGET EXTRA...: R1's plan for the run's context, with its alternatives logged
    local name=$1 budget=$2; shift 2
    $P plan -m "$W/r1.gguf" --vram-budget "$budget" -c 8192 --profile "$RES/profile.yaml" "$@" > "$RES/plan-$name.txt" 2>&1
    grep -E "INFO|^predicted|^speculative" "$RES/plan-$name.txt" | sed 's/.*INFO.. //' | cut -c1-220
}

yrun() { # NAME BUDGET EXTRA...: one `pipeshard run` of R1
    local name=$1 budget=$2; shift 2
    $P run -m "$W/r1.gguf" -f "$W/prompt.txt" -c 8192 -n 64 --ignore-eos -t 16 -fa on \
        --vram-budget "$budget" --profile "$RES/profile.yaml" --json "$@" > "$RES/$name.txt" 2> "$RES/$name.log" \
        || { echo "$name failed:"; tail -3 "$RES/$name.log"; return 0; }
    echo "$name: $(grep -E '^plan: (draft|the draft)' "$RES/$name.log" | cut -c1-160)"
    grep '^{' "$RES/$name.log" | tail -1 | python3 -c '
import json, sys
j = json.loads(sys.stdin.read())
s, p, sp = j["stats"], j.get("predicted") or {}, j.get("speculation")
line = "  TTFT %.3f s, decode %.1f tok/s, peak %.2f GiB; predicted %.3f s / %.1f tok/s" % (
    s["ttft_ms"] / 1e3, s["decode_tokens_per_s"], (j["peak_device_bytes"] or 0) / 2**30,
    p.get("ttft_s", 0), p.get("decode_tok_s", 0))
if sp:
    line += "; %d/%d accepted in %d steps, verify %.1f ms/step, draft %.2f ms/step, draft prompt %.0f ms" % (
        sp["accepted"], sp["drafted"], sp["steps"], sp["verify_ms"] / sp["steps"], sp["draft_ms"] / sp["steps"], sp["draft_prompt_ms"])
    ps = p.get("speculation")
    if ps:
        line += " (predicted verify %.1f ms)" % (ps["verify_s"] * 1e3)
print(line)' || true
}

y1() {
    yprep
    for b in 2GiB 4GiB 6GiB; do yplan r1-$b-draft $b -md "$W/draft.gguf"; done
    yrun r1-4g-plain 4GiB
    yrun r1-4g-draft 4GiB -md "$W/draft.gguf"
    yrun r1-4g-draft-n1 4GiB -md "$W/draft.gguf" --spec-draft-n-max 1
    yrun r1-4g-draft-n6 4GiB -md "$W/draft.gguf" --spec-draft-n-max 6
    yrun r1-2g-plain 2GiB
    yrun r1-2g-auto 2GiB -md "$W/draft.gguf"
    yrun r1-2g-draft-gpu 2GiB -md "$W/draft.gguf" -ngld all
    yrun r1-6g-plain 6GiB
    yrun r1-6g-draft 6GiB -md "$W/draft.gguf" -ngld all
}

# y2: the profile re-measured with CPU attention for 512-query chunks, the
# cost model with every layer's small ops; R1 at 2/4/6 GiB and R2 at 4/8
# GiB against their predictions; the speculative runs of y1 again with the
# draft's softmax skipped (p-min 0).
y2() {
    yprep
    xprofile
    grep -B1 -A6 "device: cpu" "$RES/profile.yaml" | grep -A5 "n_head: 32" | grep -E "tokens|seconds" | paste - - | tail -3
    [[ -f $W/r2.gguf ]] || $P synth --arch qwen3-30b-a3b --quant q4_0 -o "$W/r2.gguf"
    one r1-2g r1 2GiB pipeshard
    one r1-4g r1 4GiB pipeshard
    one r1-6g r1 6GiB pipeshard
    one r2-4g r2 4GiB pipeshard
    one r2-8g r2 8GiB pipeshard
    for b in 2GiB 4GiB; do yplan r1-$b-draft $b -md "$W/draft.gguf"; done
    yrun r1-4g-plain 4GiB
    yrun r1-4g-draft 4GiB -md "$W/draft.gguf" -ngld all
    yrun r1-2g-auto 2GiB -md "$W/draft.gguf"
    yrun r1-2g-draft-gpu 2GiB -md "$W/draft.gguf" -ngld all
}

# y3: is y2's slower decode the machine or this session's code? On one
# machine, the last session's binary (a85826e, .stash/old) and this one,
# each with the committed profile, then this one with a fresh profile.
y3() {
    yprep
    lscpu | grep -E "Model name|^CPU\(s\)|MHz" | tee -a "$RES/machine.txt"
    [[ -f $W/r2.gguf ]] || $P synth --arch qwen3-30b-a3b --quant q4_0 -o "$W/r2.gguf"
    local new=$P
    xz -dkf .stash/old/pipeshard-a85826e.xz && chmod +x .stash/old/pipeshard-a85826e
    P=.stash/old/pipeshard-a85826e
    one old-r2-4g r2 4GiB pipeshard
    one old-r1-4g r1 4GiB pipeshard
    P=$new
    one new-r2-4g r2 4GiB pipeshard
    one new-r1-4g r1 4GiB pipeshard
    P=.stash/old/pipeshard-a85826e
    one old-r2-4g-b r2 4GiB pipeshard
    P=$new
    cp "$RES/profile.yaml" "$RES/profile-committed.yaml"
    xprofile
    one fresh-r1-4g r1 4GiB pipeshard
    one fresh-r2-4g r2 4GiB pipeshard
}

# y4 (on y3's machine): the last session's binary beside this one, in
# dist/ for its libraries, alternated, with the committed profile.
y4() {
    cudalib > /dev/null
    xz -dkf .stash/old/pipeshard-a85826e.xz
    cp .stash/old/pipeshard-a85826e dist/pipeshard-old && chmod +x dist/pipeshard-old
    cp "$RES/profile-committed.yaml" "$RES/profile.yaml"
    local new=$P i
    for i in 1 2; do
        P=dist/pipeshard-old; one old-r2-$i r2 4GiB pipeshard
        P=$new; one new-r2-$i r2 4GiB pipeshard
    done
    P=dist/pipeshard-old; one old-r1-4g r1 4GiB pipeshard
    P=$new; one new-r1-4g-2 r1 4GiB pipeshard
}

# y5: why R1's TTFT is ~25% slower than predicted even with every weight
# resident: pipeshard at 6 GiB (nothing streamed) per ubatch, and where a
# full-GPU prefill spends its time by kernel (nsys, when the machine has it).
y5() {
    yprep > /dev/null
    local u
    for u in 512 1024 2048 4096; do one r1-6g-ub$u r1 6GiB pipeshard --plan-ubatch $u; done
    local nsys; nsys=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1 || true)
    echo "nsys: ${nsys:-none}"
    if [[ -n $nsys ]]; then
        timeout 200 "$nsys" profile -t cuda -o "$W/r1-full" --force-overwrite true \
            $P bench -m "$W/r1.gguf" --vram-budget 6GiB --policies pipeshard --plan-ubatch 4096 -p 4096 -n 8 -r 1 -t 16 \
            --profile "$RES/profile.yaml" -o "$RES/nsys-bench" > "$RES/nsys.log" 2>&1 || echo "nsys failed: $?"
        timeout 120 "$nsys" stats -r cuda_gpu_kern_sum --format csv -o "$RES/r1-kern" "$W/r1-full.nsys-rep" > /dev/null 2>&1 || echo "nsys stats failed"
        ls "$RES"/r1-kern* 2>/dev/null && head -25 "$RES"/r1-kern*.csv | cut -c1-200
    fi
}

# y6: the profile with GPU matmuls of a 4096 x 4096 weight at big batches
# too (y5: a full-GPU prefill is ~20% slower than a 4096 x 32768 weight's
# rate predicts), and what its plans do against their predictions.
y6() {
    yprep > /dev/null
    xprofile
    [[ -f $W/r2.gguf ]] || $P synth --arch qwen3-30b-a3b --quant q4_0 -o "$W/r2.gguf"
    one r1-2g r1 2GiB pipeshard
    one r1-4g r1 4GiB pipeshard
    one r1-6g r1 6GiB pipeshard
    one r1-6g-ub1024 r1 6GiB pipeshard --plan-ubatch 1024
    one r2-4g r2 4GiB pipeshard
    one r2-8g r2 8GiB pipeshard
    one r1-2g-b r1 2GiB pipeshard
    one r2-4g-b r2 4GiB pipeshard
}

# y7 (H200) and h4 (H100): the profile with read-bound matmuls timed over
# 1 GiB of weights (four 75 MB weights sat partly in the host's cache), and
# R1/R2 against its predictions.
ycold() {
    yprep > /dev/null
    lscpu | grep -E "Model name|^CPU\\(s\\)" | tee -a "$RES/machine.txt"
    xprofile
    [[ -f $W/r2.gguf ]] || $P synth --arch qwen3-30b-a3b --quant q4_0 -o "$W/r2.gguf"
    one r1-2g r1 2GiB pipeshard
    one r1-4g r1 4GiB pipeshard
    one r2-4g r2 4GiB pipeshard
    one r2-8g r2 8GiB pipeshard
}
y7() { ycold; }
h4() { ycold; }

# h3 (H100): y6's steps on the H100 host (its profile re-measured with the
# 512-query and small-weight samples), R1/R2 at their reference budgets and
# one more each, then the reference budgets again.
h3() {
    ycold
    one r1-2g-b r1 2GiB pipeshard
    one r2-4g-b r2 4GiB pipeshard
}

# h5 (H100): R2 at 4 GiB with each GPU share of hybrid experts, twice, with
# h4's profile (now profiles/...nvidia-h100-80gb-hbm3__t16.yaml).
h5() {
    yprep > /dev/null
    [[ -f $W/r2.gguf ]] || $P synth --arch qwen3-30b-a3b --quant q4_0 -o "$W/r2.gguf"
    local k i
    for i in a b; do
        one r2-4g-$i r2 4GiB pipeshard
        for k in 3 4 5; do one r2-4g-hyb$k-$i r2 4GiB pipeshard --hybrid-experts $k; done
    done
}

# Session 7 (the budget is the process's NVML figure; full-GPU parity).
# zprep builds the CUDA module and upstream's llama-bench side by side
# (8 jobs each), or restores the module from .stash/cudalib (carried back
# from an earlier call), then writes R1 and R2.
zprep() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$RES/machine.txt"
    lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$RES/machine.txt"
    if [[ -f .stash/cudalib/libggml-cuda.so.xz.00 && ! -f dist/lib/libggml-cuda.so ]]; then
        cat .stash/cudalib/libggml-cuda.so.xz.* | xz -d > dist/lib/libggml-cuda.so
        xz -dc .stash/cudalib/libggml-cpu.so.xz > dist/lib/libggml-cpu.so
    fi
    [[ -f dist/lib/libggml-cuda.so && ! -f dist/lib/libggml-cuda.so.stack ]] && bash scripts/device/cuda-stack.sh dist
    local up=
    if [[ -x /tmp/pipeshard-upstream/out/llama-bench ]]; then
        mkdir -p dist/upstream/bin && cp -a /tmp/pipeshard-upstream/out/. dist/upstream/bin/
    fi
    if [[ ! -x dist/upstream/bin/llama-bench && ${ZUPSTREAM:-1} == 1 ]]; then
        ( time JOBS=6 bash dist/build-upstream-bench.sh dist ) > "$RES/build-upstream.log" 2>&1 &
        up=$!
    fi
    if [[ ! -f dist/lib/libggml-cuda.so ]]; then
        ( time JOBS=12 bash dist/build-cuda.sh dist 90 --native-cpu ) > "$RES/build-cuda.log" 2>&1 \
            || { tail -30 "$RES/build-cuda.log"; exit 1; }
        tail -2 "$RES/build-cuda.log"
    fi
    if [[ -n $up ]]; then
        wait $up || { tail -30 "$RES/build-upstream.log"; exit 1; }
        tail -2 "$RES/build-upstream.log"
    fi
    [[ -d dist/upstream/bin ]] && cp dist/lib/libggml-cuda.so dist/lib/libggml-cpu.so dist/upstream/bin/
    [[ -f $W/r1.gguf ]] || $P synth --arch llama3.1-8b --quant q4_0 -o "$W/r1.gguf" > /dev/null
    [[ -f $W/r2.gguf ]] || $P synth --arch qwen3-30b-a3b --quant q4_0 -o "$W/r2.gguf" > /dev/null
    if [[ ! -f $RES/profile.yaml ]]; then
        if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
            cp profiles/intel-r-xeon-r-processor__nvidia-h200__t16.yaml "$RES/profile.yaml"
        else
            cp profiles/intel-r-xeon-r-processor__nvidia-h100-80gb-hbm3__t16.yaml "$RES/profile.yaml"
        fi
    fi
}

# The CUDA and CPU modules, compressed in parts under 16 MiB, into $OUT.
zsave_modules() {
    xz -T16 -6 -c dist/lib/libggml-cuda.so | split -b 15M -d - "$OUT/libggml-cuda.so.xz."
    xz -T16 -c dist/lib/libggml-cpu.so > "$OUT/libggml-cpu.so.xz"
}

# Peak device memory of every compute process, sampled by nvidia-smi every
# 20 ms while "$@" runs (for upstream's binaries; pipeshard reports its own).
smi_peak() { # NAME CMD...
    local name=$1; shift
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -lms 20 > "$RES/$name.smi" 2>/dev/null &
    local smi=$!
    "$@" > "$RES/$name.log" 2>&1 || echo "$name failed: $?" | tee -a "$RES/$name.log"
    kill $smi 2>/dev/null; wait $smi 2>/dev/null || true
    echo "$name: process peak $(awk -F', ' '{ if ($2 > m) m = $2 } END { print m + 0 }' "$RES/$name.smi") MiB" | tee -a "$RES/$name.log"
}

# Upstream's llama-bench on MODEL, everything on the GPU: pp4096 at each
# ubatch, and tg64 at depth 4096.
upstream_full() { # NAME MODEL
    local ub=dist/upstream/bin/llama-bench
    smi_peak "$1-pp" timeout 240 $ub -m "$W/$2.gguf" -ngl 99 -fa 1 -t 16 -p 4096 -n 0 -b 4096 -ub 512,1024,2048,4096 -r 2 -o md
    grep -E "pp4096" "$RES/$1-pp.log"
    smi_peak "$1-tg" timeout 240 $ub -m "$W/$2.gguf" -ngl 99 -fa 1 -t 16 -p 0 -n 64 -d 4096 -ub 512 -r 2 -o md
    grep -E "tg64" "$RES/$1-tg.log"
}

# z1: the process's memory at each step for R1 and R2 at their budgets,
# pipeshard's full-GPU row, a smaller CUDA stack, and upstream's full-GPU
# llama-bench beside it.
z1() {
    zprep
    zsave_modules
    one r1-2g r1 2GiB pipeshard,full-gpu
    PIPESHARD_CUDA_STACK_BYTES=256 one r1-2g-stack256 r1 2GiB pipeshard
    upstream_full up-r1 r1
}
z2() {
    zprep
    one r2-4g r2 4GiB pipeshard,full-gpu
    upstream_full up-r2 r2
}

# The CUDA context's size at each per-thread stack (a plan's log says it).
zcontext() {
    local s
    for s in default 512 256; do
        if [[ $s == default ]]; then
            $P -v plan -m "$W/r1.gguf" --vram-budget 2GiB -c 4352 --profile "$RES/profile.yaml" > /dev/null 2> "$RES/context-$s.log"
        else
            PIPESHARD_CUDA_STACK_BYTES=$s $P -v plan -m "$W/r1.gguf" --vram-budget 2GiB -c 4352 --profile "$RES/profile.yaml" \
                > /dev/null 2> "$RES/context-$s.log"
        fi
        echo "stack $s: $(grep -o 'CUDA context [^)]*' "$RES/context-$s.log" | head -1)"
    done
}

zrun() { # NAME MODEL BUDGET EXTRA...: `pipeshard run` on a 4k-token prompt, JSON timings and the process peak
    local name=$1 model=$2 budget=$3; shift 3
    [[ -f $W/prompt4k.txt ]] || python3 scripts/device/make-prompt.py > "$W/prompt4k.txt"
    timeout 200 $P run -m "$W/$model.gguf" --vram-budget "$budget" --profile "$RES/profile.yaml" -f "$W/prompt4k.txt" \
        -n 64 --ignore-eos -c 4352 -t 16 --flash-attn on --json "$@" > "$RES/$name.out" 2> "$RES/$name.err" \
        || echo "$name failed: $?" >> "$RES/$name.err"
    grep -E "^plan:|failed|^error" "$RES/$name.err" | sed "s/^/$name: /"
    tail -1 "$RES/$name.err" | python3 -c 'import sys,json
try:
    j=json.loads(sys.stdin.read()); s=j["stats"]; p=j["peak_device_bytes"] or {}
    print("   ttft %.0f ms  decode %.1f tok/s  prompt %d tok  process peak %.0f MiB (%s)  loaded %s" % (s["ttft_ms"], s["decode_tokens_per_s"], s["prompt_tokens"], p.get("device",0)/2**20, p.get("source"), j.get("loaded_memory")))
except Exception as e: print("   (no json)", e)'
}

# z3: the budget as the process's NVML figure, R1 (run the CUDA build first).
z3() {
    zprep
    zsave_modules
    zcontext
    one r1-2g r1 2GiB pipeshard,full-gpu
    zrun r1-2g-run4k r1 2GiB
    PIPESHARD_CUDA_STACK_BYTES=256 one r1-2g-stack256 r1 2GiB pipeshard
}
# z4 (carry .stash with z3's modules): R2, the VL preset, upstream's R1.
z4() {
    zprep
    one r2-4g r2 4GiB pipeshard
    upstream_full up-r1 r1
    [[ -f $W/vl.gguf ]] || $P synth --arch qwen2.5-vl-7b --quant q4_0 -o "$W/vl.gguf" --mmproj-out "$W/vl-mmproj.gguf" > /dev/null
    [[ -f $W/1080p.png ]] || mkimages > /dev/null
    vrun vl-1080p-4g 1080p --vram-budget 4GiB --profile "$RES/profile.yaml"
}

# z5 (carry .stash with the modules; ZUPSTREAM=0): every budget row again
# with the CUDA stack at 256 bytes and the calibrated runtime allowance.
# The budget rows of issue 15: R1 bench and run, R2 bench, VL run.
zrows() {
    one r1-2g r1 2GiB pipeshard
    zrun r1-2g-run4k r1 2GiB
    one r2-4g r2 4GiB pipeshard
    [[ -f $W/vl.gguf ]] || $P synth --arch qwen2.5-vl-7b --quant q4_0 -o "$W/vl.gguf" --mmproj-out "$W/vl-mmproj.gguf" > /dev/null
    [[ -f $W/1080p.png ]] || mkimages > /dev/null
    vrun vl-1080p-4g 1080p --vram-budget 4GiB --profile "$RES/profile.yaml"
}
z5() {
    ZUPSTREAM=0 zprep
    zrows
}

# A plan for the prompt against every fixed ubatch: R1 at 2 GiB, prompts of
# P tokens, pipeshard's choice and each ubatch forced.
zsweep() { # P REPS
    local p=$1 r=$2 u
    timeout 150 $P bench -m "$W/r1.gguf" --vram-budget 2GiB --policies pipeshard -p "$p" -n 16 -r "$r" -t 16 \
        --profile "$RES/profile.yaml" -o "$RES/sweep-$p-plan" > "$RES/sweep-$p-plan.log" 2>&1 || echo "sweep $p plan failed"
    grep -E "TTFT|process VRAM" "$RES/sweep-$p-plan.log" | sed "s/^/sweep-$p-plan: /"
    for u in 512 1024 2048 4096; do
        timeout 150 $P bench -m "$W/r1.gguf" --vram-budget 2GiB --policies pipeshard -p "$p" -n 16 -r "$r" -t 16 \
            --plan-ubatch $u --profile "$RES/profile.yaml" -o "$RES/sweep-$p-ub$u" > "$RES/sweep-$p-ub$u.log" 2>&1 \
            || echo "sweep $p ub $u failed"
        grep -E "TTFT|error" "$RES/sweep-$p-ub$u.log" | sed "s/^/sweep-$p-ub$u: /"
    done
}
z6() {
    ZUPSTREAM=0 zprep
    zsweep 512 3
    zsweep 16384 1
}

# The largest per-thread stack any kernel of the CUDA module needs
# (cuobjdump's STACK), and the kernels that need the most.
zstack() {
    local cuobjdump; cuobjdump=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)
    [[ -n $cuobjdump ]] || { echo "no cuobjdump"; return; }
    "$cuobjdump" -res-usage dist/lib/libggml-cuda.so 2>/dev/null | awk '
        /Function/ { fn = $2 }
        /STACK:/ { match($0, /STACK:[0-9]+/); st = substr($0, RSTART + 6, RLENGTH - 6) + 0; print st, fn }' \
        | sort -n > "$RES/kernel-stacks.txt"
    echo "kernels: $(wc -l < "$RES/kernel-stacks.txt"), by stack bytes:"
    awk '{ print $1 }' "$RES/kernel-stacks.txt" | uniq -c | tail -8
    tail -5 "$RES/kernel-stacks.txt" | cut -c1-160
    ZSTACK_MAX=$(tail -1 "$RES/kernel-stacks.txt" | awk '{ print $1 }')
}

# z7: why R2's decode fell with a 256-byte stack (the driver grows local
# memory for a kernel that needs more and shrinks it after); R2 at CUDA's
# default stack and at the largest any kernel needs; full-GPU parity rows
# with upstream's llama-bench in the same call.
z7() {
    zprep
    zstack
    PIPESHARD_CUDA_STACK_BYTES=1024 one r2-4g-stack1024 r2 4GiB pipeshard
    if [[ -n ${ZSTACK_MAX:-} && $ZSTACK_MAX -gt 256 && $ZSTACK_MAX -lt 1024 ]]; then
        PIPESHARD_CUDA_STACK_BYTES=$ZSTACK_MAX one r2-4g-stack$ZSTACK_MAX r2 4GiB pipeshard
    fi
    PIPESHARD_CUDA_STACK_BYTES=1024 one r1-full r1 64GiB full-gpu
    PIPESHARD_CUDA_STACK_BYTES=1024 one r2-full r2 64GiB full-gpu
    upstream_full up-r1 r1
    upstream_full up-r2 r2
}

# z8: the final budget rule (the stack the module's kernels need, the
# runtime allowance) on every row, and the plan for the prompt at 512 and
# 16k tokens against each fixed ubatch (host-KV attention priced on the GPU).
z8() {
    ZUPSTREAM=0 zprep
    zrows
    zsweep 16384 2
}

# z9: the runtime allowance that grows with the context: R1 at 2 GiB with
# the reference prompt and with 16k tokens against each fixed ubatch.
z9() {
    ZUPSTREAM=0 zprep
    one r1-2g r1 2GiB pipeshard
    zsweep 16384 2
}

# zserver: pipeshard-server (upstream's server, plan installed at load) on
# R2 at 4 GiB with one and four clients, and the VL preset with a 1080p
# image at 4 GiB (scripts/device/server-bench.sh). The modules and the
# binaries together are over one call's upload, so `zunstash` (carrying
# .stash) puts the modules in /root/cudalib first, and `zserver` (carrying
# dist/, on the same warm machine) takes them from there.
zunstash() {
    mkdir -p /root/cudalib
    cat .stash/cudalib/libggml-cuda.so.xz.* | xz -d > /root/cudalib/libggml-cuda.so
    xz -dc .stash/cudalib/libggml-cpu.so.xz > /root/cudalib/libggml-cpu.so
    ls -la /root/cudalib
}
zserver() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep
    bash scripts/device/server-bench.sh all
}

# zh100 (after zunstash, on the same warm machine): the budget rows on an
# H100 host (its committed profile), with dist/ carried.
zh100() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep
    zrows
}


# Session 8 (after zunstash, on the same warm machine, dist/ carried):
# s8a: both modes of math against the full-GPU run (lossless), what the exact
# mode costs and upstream's own fit (common_fit_params) at the same budget,
# each policy in its own process.
s8a() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep
    local m b p
    for m in "r1 2GiB" "r2 4GiB"; do
        set -- $m
        for p in pipeshard pipeshard-exact fit; do
            one "$1-$p" "$1" "$2" "$p"
        done
    done
    # What the memory sampler costs a full-GPU row (issue 16, part 1): every
    # 20 ms (the default) against once a minute.
    one r1-full r1 64GiB full-gpu
    PIPESHARD_MEMORY_SAMPLE_MS=60000 one r1-full-nosample r1 64GiB full-gpu
    one r2-full r2 64GiB full-gpu
    PIPESHARD_MEMORY_SAMPLE_MS=60000 one r2-full-nosample r2 64GiB full-gpu
}
# s8b: prompts of 512 and 16k tokens through `run` and through the server
# (R1 at 2 GiB, one context size), the streamed-bytes counter, both modes
# against the full-GPU run, and R1's exact plan once the planner prices the
# host KV copies on the link.
s8b() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep
    bash scripts/device/server-bench.sh tiers
    lossless r1-modes "$W/r1.gguf" 2GiB
    lossless r2-modes "$W/r2.gguf" 4GiB
    one r1-pipeshard-exact2 r1 2GiB pipeshard-exact
    one r1-pipeshard2 r1 2GiB pipeshard
}

# s8c (after the session's merges): the 512/16k prompts again with the
# server planned for a full slot, R2's lossless modes (with the warm-up fix),
# and every budget row with the session's planner.
s8c() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep
    bash scripts/device/server-bench.sh tiers
    lossless r2-modes "$W/r2.gguf" 4GiB
    zrows
}
# s8d (same warm machine): the server's R2 (one and four clients) and VL
# rows with the session's planner.
s8d() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep
    bash scripts/device/server-bench.sh all
    # Images up to 1080p (about 2,650 tokens): the encoder's peak reserved
    # for them, not for the largest image the projector takes.
    bash scripts/device/server-bench.sh vl vl-4g-max2700 --image-max-tokens 2700
}

# s8e (same warm machine): the VL server with images up to 1080p once the
# largest image's peak is measured over several aspect ratios; R2 through
# the server with one client, against threads and the sampler's period
# (the server decoded 36-40 tok/s where bench decoded 49 with the same plan).
s8e() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep
    local sb=scripts/device/server-bench.sh
    bash $sb vl vl-4g-max2700 --image-max-tokens 2700
    bash $sb r2_1 r2-1
    bash $sb r2_1 r2-1-t15 --vram-budget 4GiB -t 15
    PIPESHARD_MEMORY_SAMPLE_MS=1000 bash $sb r2_1 r2-1-sample1s
    one r2-4g r2 4GiB pipeshard
}

# s8f: the VL server with images up to 1080p, without upstream's encoder
# warm-up at load (it coexisted with the language model's compute).
s8f() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep
    bash scripts/device/server-bench.sh vl vl-4g-max2700 --image-max-tokens 2700
    bash scripts/device/server-bench.sh vl vl-4g
}

# s8g: the plan for the prompt against every fixed ubatch with this
# session's cost model (host KV copies on the link), 16k and 512 tokens.
s8g() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep
    zsweep 16384 1
    zsweep 512 2
}

# s8fuzz FIRST N: `pipeshard fuzz-http` cases FIRST..FIRST+N-1 of seed 10001
# with every known class, on the default model (reassembled from the parts
# carried in .whl/smol by earlier calls into /root/smol), in chunks of 1000
# cases (one report each) while the call has time for another.
s8fuzz() {
    local first=$1 n=$2 c t0=$SECONDS
    s9model
    for ((c = first; c < first + n; c += 1000)); do
        (( SECONDS - t0 > 420 )) && { echo "fuzz: out of time before case $c"; break; }
        timeout 170 $P fuzz-http -m /root/smol.gguf --seed 10001 --first-case "$c" --cases 1000 --jobs 8 --known all \
            --work-dir "/root/fuzz-$c" --json > "$RES/seed10001-$c.json" 2> "$RES/seed10001-$c.log" \
            || echo "fuzz $c failed: $?"
        echo "chunk $c: $(python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print({k: j[k] for k in ('cases','seconds','crashes','unanswered','rss_max_case_growth_mib','probe_identical')})" "$RES/seed10001-$c.json" 2>&1 | tail -1)"
    done
}

# zs8 (session 8, issue 14's server targets; after zunstash on the same
# warm machine, with dist/ carried): R2 with four clients under
# dist/pipeshard-server and, on the same host, under another build
# (dist/pipeshard-server.base, e.g. the base commit's); R2 with one client;
# the VL preset through the server, also with upstream's --image-max-tokens
# at the 1080p image's size (a diagnostic, not the reference setting), and
# through `run` with the same image; upstream's own placement for MoE in
# little VRAM (experts on the CPU, --cpu-moe -ngl 99, no budget).
zs8() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep
    local sb=scripts/device/server-bench.sh
    bash $sb r2_4 r2-4 || true
    [[ -x dist/pipeshard-server.base ]] && { PIPESHARD_SERVER=dist/pipeshard-server.base bash $sb r2_4 r2-4-base || true; }
    bash $sb r2_1 r2-1 || true
    bash $sb vl vl-4g || true
    bash $sb vl vl-4g-maxtok2700 --image-max-tokens 2700 || true
    vrun vl-run-4g 1080p --vram-budget 4GiB --profile "$RES/profile.yaml" || true
    bash $sb r2_4 r2-4-up-cpumoe --cpu-moe -ngl 99 || true
    bash $sb r2_1 r2-1-up-cpumoe --cpu-moe -ngl 99 || true
}

# zs8b (after zunstash, dist/ carried): R2 with four clients under
# dist/pipeshard-server with the plan's own hybrid share and with 4 of 8
# experts on the GPU, and under dist/pipeshard-server.base beside.
zs8b() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep
    local sb=scripts/device/server-bench.sh
    bash $sb r2_4 r2-4 || true
    bash $sb r2_4 r2-4-k4 --vram-budget 4GiB --hybrid-experts 4 || true
    [[ -x dist/pipeshard-server.base ]] && { PIPESHARD_SERVER=dist/pipeshard-server.base bash $sb r2_4 r2-4-base || true; }
}

# Session 9 (after zunstash, on the same warm machine, dist/ carried).
# s9a: full-GPU parity (issue 16, part 1). Upstream's llama-bench from the
# pristine release and the same llama-bench from pipeshard's patched tree
# (hooks idle), with pipeshard's own CUDA/CPU modules in both, beside
# pipeshard's bench with no budget (full-gpu, at two ubatches) and with a
# budget larger than the model (the planner's hooks active).
upstream_full_patched() { # NAME MODEL
    local ub=dist/upstream/bin-patched/llama-bench
    smi_peak "$1-pp" timeout 240 $ub -m "$W/$2.gguf" -ngl 99 -fa 1 -t 16 -p 4096 -n 0 -b 4096 -ub 1024,4096 -r 2 -o md
    grep -E "pp4096" "$RES/$1-pp.log"
    smi_peak "$1-tg" timeout 240 $ub -m "$W/$2.gguf" -ngl 99 -fa 1 -t 16 -p 0 -n 64 -d 4096 -ub 512 -r 2 -o md
    grep -E "tg64" "$RES/$1-tg.log"
}
s9a() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ( time JOBS=6 bash dist/build-upstream-bench.sh dist patched ) > "$RES/build-upstream-patched.log" 2>&1 &
    local pb=$!
    ZUPSTREAM=1 zprep
    wait $pb || tail -20 "$RES/build-upstream-patched.log"
    tail -2 "$RES/build-upstream-patched.log"
    cp dist/lib/libggml-cuda.so dist/lib/libggml-cpu.so dist/upstream/bin-patched/
    echo "nsys: $(command -v nsys || ls /usr/local/cuda*/bin/nsys 2>/dev/null | head -1 || echo none)"
    local m
    for m in r1 r2; do
        upstream_full "up-$m" "$m"
        upstream_full_patched "upp-$m" "$m"
        one "$m-full-ub1024" "$m" 64GiB full-gpu --ub 1024
        one "$m-full-ub4096" "$m" 64GiB full-gpu --ub 4096
        one "$m-big" "$m" 64GiB pipeshard
    done
}
# s9b (same warm machine, after s9a): the 16k-token prompt, the planner's
# plan against every fixed ubatch, with the KV cache of CPU layers pinned and
# copied without a drain (patch 0018), and the base build (session 8's, in
# .whl/lead/base.tar.xz) on the plan and ub 2048; the budget rows.
s9b() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep
    zsweep 16384 1
    rm -rf base && tar -xJf .whl/lead/base.tar.xz && cp dist/lib/libggml-cuda.so dist/lib/libggml-cpu.so base/lib/
    local u
    for u in plan 2048; do
        local extra=(); [[ $u != plan ]] && extra=(--plan-ubatch "$u")
        timeout 150 base/pipeshard bench -m "$W/r1.gguf" --vram-budget 2GiB --policies pipeshard -p 16384 -n 16 -r 1 -t 16 \
            --profile "$RES/profile.yaml" -o "$RES/base-sweep-16384-$u" "${extra[@]}" > "$RES/base-sweep-16384-$u.log" 2>&1 \
            || echo "base sweep $u failed"
        grep -E "TTFT|error" "$RES/base-sweep-16384-$u.log" | sed "s/^/base-sweep-16384-$u: /"
    done
    one r1-2g r1 2GiB pipeshard
    one r2-4g r2 4GiB pipeshard
}

# s9c (after zunstash, dist/ and .whl/lead/base.tar.xz carried): issue 15
# part 2 on one host (512-token sweep, `run` against `bench` at 4k, the
# server against `run` at 512 and 16k tokens), and why R1's full-GPU prefill
# at ub 4096 is slower than upstream's at the same ubatch (base build beside,
# other ubatches).
s9c() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep
    zsweep 512 2
    one r1-2g r1 2GiB pipeshard
    zrun r1-2g-run4k r1 2GiB
    bash scripts/device/server-bench.sh tiers
    rm -rf base && tar -xJf .whl/lead/base.tar.xz && cp dist/lib/libggml-cuda.so dist/lib/libggml-cpu.so base/lib/
    one r1-full-ub4096 r1 64GiB full-gpu --ub 4096
    one r1-full-ub2048 r1 64GiB full-gpu --ub 2048
    P=base/pipeshard one r1-full-ub4096-base r1 64GiB full-gpu --ub 4096
    P=base/pipeshard one r1-full-ub1024-base r1 64GiB full-gpu --ub 1024
}

# s9d (after zunstash, dist/ carried): the machine profile measured again
# with expert matmuls timed one layer per repetition (all of a batch's tokens
# in one layer, as in a model), the plans it makes, and full-GPU parity with
# a budget larger than the model beside upstream's llama-bench built in the
# same call.
s9d() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep
    ( time $P profile --mode fast -t 16 -o "$RES/profile-s9.yaml" ) > "$RES/profile-s9.log" 2>&1 || tail -5 "$RES/profile-s9.log"
    tail -3 "$RES/profile-s9.log"
    ( time JOBS=8 bash dist/build-upstream-bench.sh dist ) > "$RES/build-upstream.log" 2>&1 &
    local up=$! m b
    for m in "llama3.1-8b 64GiB" "qwen3-30b-a3b 64GiB" "llama3.1-8b 2GiB" "qwen3-30b-a3b 4GiB"; do
        set -- $m
        for pr in "$RES/profile.yaml" "$RES/profile-s9.yaml"; do
            echo "plan $1 $2 $(basename "$pr"): $($P plan --arch "$1" --vram-budget "$2" -c 4352 --profile "$pr" 2>&1 | grep -E "^model|^predicted" | tr '\n' ' ')"
        done
    done
    PROF=$RES/profile-s9.yaml one r1-big r1 64GiB pipeshard
    PROF=$RES/profile-s9.yaml one r2-big r2 64GiB pipeshard
    wait $up || tail -20 "$RES/build-upstream.log"
    cp dist/lib/libggml-cuda.so dist/lib/libggml-cpu.so dist/upstream/bin/
    upstream_full up-r1 r1
    upstream_full up-r2 r2
    one r1-full-ub2048 r1 64GiB full-gpu --ub 2048
    one r2-full-ub2048 r2 64GiB full-gpu --ub 2048
}
# s9e (same warm machine, after s9d): the budget rows with the new profile
# beside the old, and R1's exact plan (its KV cache now in pinned host
# memory) for speed and token-for-token output.
s9e() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep
    local np=$RES/profile-s9.yaml
    [[ -f $np ]] || { echo "no $np (run s9d first on this machine)"; return 1; }
    PROF=$np one r1-2g-s9 r1 2GiB pipeshard
    one r1-2g r1 2GiB pipeshard
    PROF=$np one r2-4g-s9 r2 4GiB pipeshard
    one r2-4g r2 4GiB pipeshard
    PROF=$np one r1-exact-s9 r1 2GiB pipeshard-exact
    timeout 300 $P lossless -m "$W/r1.gguf" --vram-budget 2GiB --profile "$np" -n 128 -t 16 \
        > "$RES/lossless-r1-s9.json" 2> "$RES/lossless-r1-s9.log" || echo "lossless r1 failed: $?"
    tail -3 "$RES/lossless-r1-s9.log"
}

# s9final (after the session's merges; zunstash first, dist/ carried): every
# budget row of issue 15's table with the final build (bench, `run`, VL,
# the server with four slots), the VL server with default flags, and the
# default mode with most of its KV cache in pinned host memory against the
# full-GPU run (patch 0018's copies: a race would show as an early
# divergence with large logit differences, not rounding).
s9final() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep
    zrows
    bash scripts/device/server-bench.sh r2_4 r2-4 || true
    bash scripts/device/server-bench.sh vl vl-4g || true
    python3 scripts/device/make-prompt.py 2500 > "$W/p5k.txt"
    timeout 300 $P lossless -m "$W/r1.gguf" --vram-budget 2GiB --profile "$RES/profile.yaml" -c 6144 -n 32 -t 16 \
        -p "$(cat "$W/p5k.txt")" > "$RES/lossless-r1-hostkv.json" 2> "$RES/lossless-r1-hostkv.log" \
        || echo "lossless host KV failed: $?"
    tail -2 "$RES/lossless-r1-hostkv.log"
}

# s9vl NAME (after zunstash, dist/ carried): the VL server with default
# flags (first with the encoder's MLP in row chunks, a patch tried at ef8c02f
# and reverted: the 2.12 GiB reserved for the largest image did not change;
# then with window attention in chunks of whole windows, patch 0021), and
# `run` on the 1080p image.
s9vl() {
    local name=${1:-vl-4g-chunked}
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep
    bash scripts/device/server-bench.sh vl "$name" || true
    grep -E "vision encoder|pipeshard plan for" "$RES/$name.log" | tail -3
    vrun "$name-run" 1080p --vram-budget 4GiB --profile "$RES/profile.yaml" || true
}

# Session 9, issue 17 (CPU only, the GPU unused; the default model's parts
# put into /root/smol by an earlier call on the same warm machine, dist/
# carried): s9soak starts the 10-minute soak in its own process session
# (it outlives the call; s9collect waits for it), then s9rel runs the
# 10,000 fuzz cases of seed 10001 (every known class) as two streams of
# 1,000-case chunks and the 10 SIGTERM trials beside it. Cores are split
# with taskset: soak 0-7, fuzz 8-13, shutdown 14-15.
ts() { # CPUS: the taskset prefix, where the machine has taskset
    command -v taskset > /dev/null && echo "taskset -c $1" || true
}
# The default model from its parts in /root/smol (joined again unless an
# earlier join already checks out), checked against its SHA-256.
s9model() {
    echo "$SMOL_SHA  /root/smol.gguf" | sha256sum -c --status 2>/dev/null || cat /root/smol/part0* > /root/smol.gguf
    echo "$SMOL_SHA  /root/smol.gguf" | sha256sum -c
}
s9soak() {
    s9model
    mkdir -p /root/s9
    setsid nohup $(ts 0-7) "$(readlink -f $P)" fuzz-http -m /root/smol.gguf --mode soak --clients 32 --duration-s 600 \
        --server-args "-c 16384 -np 32 -t 8 --cache-ram 0" --work-dir /root/s9/soak --json \
        > /root/s9/soak-32-clients-600s.json 2> /root/s9/soak.log < /dev/null &
    echo "soak started"
}
s9fuzz_stream() { # FIRST COUNT
    local c
    for ((c = $1; c < $1 + $2; c += 1000)); do
        timeout 280 $(ts 8-13) $P fuzz-http -m /root/smol.gguf --seed 10001 --first-case "$c" --cases 1000 --jobs 8 \
            --known all --work-dir "/root/fuzz-$c" --json > "$RES/seed10001-$c.json" 2> "$RES/seed10001-$c.log" \
            || echo "fuzz $c failed: $?"
        echo "chunk $c: $(python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print({k: j[k] for k in ('cases','seconds','crashes','unanswered','rss_max_case_growth_mib','probe_identical')})" "$RES/seed10001-$c.json" 2>&1 | tail -1)"
    done
}
s9rel() {
    s9model
    ( $(ts 14-15) $P fuzz-http -m /root/smol.gguf --mode shutdown --trials 10 --streams 4 --grace-s 10 \
        --work-dir /root/shutdown --json > "$RES/shutdown-10-trials.json" 2> "$RES/shutdown.log" || echo "shutdown failed: $?" ) &
    local sh=$!
    s9fuzz_stream "${1:-0}" "${2:-5000}" &
    local a=$!
    s9fuzz_stream "${3:-5000}" "${4:-5000}" &
    local b=$!
    wait $a $b $sh
    python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('shutdown:', j['passed'], 'passed, max', j['max_exit_s'], 's')" "$RES/shutdown-10-trials.json" || true
}
s9collect() {
    local t0=$SECONDS
    while pgrep -f "mode soak" > /dev/null && (( SECONDS - t0 < ${1:-300} )); do sleep 2; done
    cp /root/s9/soak-32-clients-600s.json /root/s9/soak.log "$RES/" 2>/dev/null || true
    python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print({k: v for k, v in j.items() if k != 'slot_free_ms'})" "$RES/soak-32-clients-600s.json" || true
}


# Session 9, MoE decode (after zunstash on the same warm machine; dist/
# carried with the base build in dist/base/: its binaries and libraries).
# zmoe_prep: the modules into both builds.
zmoe_prep() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep
    if [[ -d dist/base/lib ]]; then
        cp dist/lib/libggml-cuda.so dist/lib/libggml-cpu.so dist/base/lib/
        cp dist/lib/libggml-cuda.so.stack dist/base/lib/ 2>/dev/null || true
    fi
}
# zmoe1: R2 at 4 GiB, the base build against this one: bench rows with the
# scheduler's per-graph host timing (GGML_SCHED_TIMING), this build with its
# host worker thread off (GGML_SCHED_HOST_THREAD=0: that build also computed
# the CPU split on a worker thread, which was slower and is not on the branch,
# bench/results/h200-session9/moe-decode/host-worker-thread-tried.diff) and
# with the old synchronous host copies (GGML_SCHED_SYNC_HOST_COPIES=1); the
# server with one and four clients. (The `run` comparison failed in session
# 9: the 4k prompt is 4524 tokens for R2's vocabulary, over the context.)
zmoe1() {
    zmoe_prep
    export PIPESHARD_LOG=info,llama.cpp=debug   # ggml's info lines (the timing)
    local sb=${SB:-scripts/device/server-bench.sh}
    P=dist/base/pipeshard one r2-base r2 4GiB pipeshard
    GGML_SCHED_TIMING=1 one r2-new r2 4GiB pipeshard
    GGML_SCHED_TIMING=1 GGML_SCHED_HOST_THREAD=0 one r2-new-nothread r2 4GiB pipeshard
    GGML_SCHED_TIMING=1 GGML_SCHED_SYNC_HOST_COPIES=1 one r2-new-sync r2 4GiB pipeshard
    P=dist/base/pipeshard zrun r2-run-base r2 4GiB
    zrun r2-run-new r2 4GiB
    cmp "$RES/r2-run-base.out" "$RES/r2-run-new.out" && echo "run: same greedy output (base, new)"
    GGML_SCHED_TIMING=1 one r2-new-k5 r2 4GiB pipeshard --hybrid-experts 5
    PIPESHARD_SERVER=dist/base/pipeshard-server bash "$sb" r2_1 r2-1-base || true
    GGML_SCHED_TIMING=1 bash "$sb" r2_1 r2-1-new || true
    PIPESHARD_SERVER=dist/base/pipeshard-server bash "$sb" r2_4 r2-4-base || true
    GGML_SCHED_TIMING=1 bash "$sb" r2_4 r2-4-new || true
    P=dist/base/pipeshard one r2-base2 r2 4GiB pipeshard
    GGML_SCHED_TIMING=1 one r2-new2 r2 4GiB pipeshard
    grep -h "sched_compute_splits" "$RES"/r2-new.log "$RES"/r2-new-nothread.log "$RES"/r2-new-sync.log | cut -c1-400 | tail -12
}
# zmoe2 (after zunstash, dist/ carried with dist/base/): R2 at 4 GiB, the
# base build against this one (the early/async host copies of patch 0019),
# each hybrid share forced beside the planner's, with the scheduler's timing;
# the server with one client, and with four with the hybrid split also for
# ubatches of up to 4 tokens (PIPESHARD_HYBRID_DECODE_TOKENS=4).
zmoe2() {
    zmoe_prep
    export PIPESHARD_LOG=info,llama.cpp=debug   # ggml's info lines (the timing)
    local sb=${SB:-scripts/device/server-bench.sh} k
    P=dist/base/pipeshard one r2-base r2 4GiB pipeshard
    GGML_SCHED_TIMING=1 one r2-new r2 4GiB pipeshard
    for k in 5 6 3; do
        GGML_SCHED_TIMING=1 one r2-new-k$k r2 4GiB pipeshard --hybrid-experts $k
    done
    PIPESHARD_SERVER=dist/base/pipeshard-server bash "$sb" r2_1 r2-1-base || true
    GGML_SCHED_TIMING=1 bash "$sb" r2_1 r2-1-new || true
    PIPESHARD_SERVER=dist/base/pipeshard-server bash "$sb" r2_4 r2-4-base || true
    GGML_SCHED_TIMING=1 PIPESHARD_HYBRID_DECODE_TOKENS=4 bash "$sb" r2_4 r2-4-new-hyb4 || true
    P=dist/base/pipeshard one r2-base2 r2 4GiB pipeshard
    GGML_SCHED_TIMING=1 one r2-new2 r2 4GiB pipeshard
}
# zmoe3 (after zunstash, dist/ and dist/base/ carried): the branch's final
# build (patch 0019, the planner's own hybrid share) against the base.
zmoe3() {
    zmoe_prep
    P=dist/base/pipeshard one r2-base r2 4GiB pipeshard
    one r2-new r2 4GiB pipeshard
    one r2-new-k4 r2 4GiB pipeshard --hybrid-experts 4
    P=dist/base/pipeshard one r2-base2 r2 4GiB pipeshard
    one r2-new2 r2 4GiB pipeshard
}

# zrowsplit (after zunstash, dist/ carried): the dense row split (patch
# 0017). R1 at 2 GiB with the planner's share, with the split off, and with
# forced shares; R2 at 4 GiB with its default policy. RSPROF: a profile to
# plan with instead of the repository's (e.g. with host_read_bw_with_link);
# RSSHARES: the forced shares; RSTAG: a suffix for a second round's names
# (which then runs only the plan, the shares and the 4k-prompt run).
zrowsplit() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep
    [[ -n ${RSPROF:-} ]] && cp "$RSPROF" "$RES/profile.yaml"
    one "rs-r1-2g-plan${RSTAG:-}" r1 2GiB pipeshard
    [[ -n ${RSTAG:-} ]] || PIPESHARD_DENSE_SPLIT=0 one rs-r1-2g-off r1 2GiB pipeshard
    local f
    for f in ${RSSHARES:-0.3 0.45 0.6 0.75}; do
        PIPESHARD_DENSE_SPLIT=$f one "rs-r1-2g-f$f${RSTAG:-}" r1 2GiB pipeshard
    done
    zrun "rs-r1-2g-run4k${RSTAG:-}" r1 2GiB
    [[ -n ${RSTAG:-} ]] || one rs-r2-4g r2 4GiB pipeshard
    grep -h "row split" "$RES"/rs-*.log | sort | uniq -c || true
}

# Session 10 (after zunstash, dist/ carried). s10a: the merged build on one
# host: every budget row (s9final) and issue 15 part 2 (the 512- and
# 16k-token sweeps, `run` against `bench`, the server's tiers against `run`).
s10a() {
    s9final
    zsweep 512 2
    zsweep 16384 1
    bash scripts/device/server-bench.sh tiers
}

# s10r2c (after zunstash, dist/ carried with dist/pipeshard-server.base, the
# merged main's server): issue 14's R2 server rows, this branch's server (one
# plan ubatch per slot in upstream's batch) against the base, interleaved,
# twice each, then the same server with no budget as upstream places R2:
# experts on the CPU (--cpu-moe -ngl 99) and everything on the GPU (-ngl 99).
s10r2c() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep
    local sb=${SB:-scripts/device/server-bench.sh} base=dist/pipeshard-server.base r
    for r in a b; do
        bash $sb r2_4 r2-4-new-$r || true
        PIPESHARD_SERVER=$base bash $sb r2_4 r2-4-base-$r || true
    done
    for r in a b; do
        bash $sb r2_1 r2-1-new-$r || true
        PIPESHARD_SERVER=$base bash $sb r2_1 r2-1-base-$r || true
    done
    bash $sb r2_4 r2-4-up-cpumoe --cpu-moe -ngl 99 || true
    bash $sb r2_1 r2-1-up-cpumoe --cpu-moe -ngl 99 || true
    bash $sb r2_4 r2-4-up-gpu -ngl 99 || true
}

# s10live (after zunstash, dist/ carried): live re-planning (issue 18). A
# torch filler leaves LIVE_FREE GiB of the card free (default 8);
# pipeshard-server serves R2 with --vram-budget auto (headroom LIVE_HEADROOM,
# default 1GiB: what another program can take at once before pipeshard
# has moved anything; beyond it, the filler gets memory as pipeshard
# releases it) while 4 clients stream the reference request one after
# another; the filler then holds LIVE_STEPS GiB more in turn (default
# "2 8": 2 GiB, then 6 GiB more), then frees them, each for LIVE_PHASE
# seconds (default 20). Records the loop's samples (process memory against
# the allowance, every 50 ms), every request (failures, decode speed), the
# migrations the log reports and /metrics; client 0's every other request is
# a fixed greedy probe, whose outputs the summary counts (one distinct
# output across migrations with LIVE_EXACT=1, which serves with --exact).
# LIVE_FRESH=1 (default) then starts the server afresh at each phase's
# budget for the speed reference.
s10live() {
    LIVE_PY=${LIVE_PY:-scripts/device/live_replan.py}
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/ 2>/dev/null || true
    ZUPSTREAM=0 zprep
    local port=18090 phase=${LIVE_PHASE:-20} ctl=$W/filler.want stop=$W/clients.stop
    rm -f "$RES"/live.* "$stop"
    echo 0 > "$ctl"
    python3 "$LIVE_PY" filler "$ctl" "${LIVE_FREE:-8}" > "$RES/live.filler" 2>&1 &
    local filler=$!
    for _ in $(seq 120); do grep -q base_gib "$RES/live.filler" && break; sleep 0.5; done
    cat "$RES/live.filler"
    PIPESHARD_REPLAN_RECORD=$RES/live.trace dist/pipeshard-server --host 127.0.0.1 --port $port --metrics \
        -t 16 -fa on -ctk f16 -ctv f16 --profile "$RES/profile.yaml" -m "$W/r2.gguf" -c 17408 -np 4 --kv-unified \
        --vram-budget auto --vram-headroom "${LIVE_HEADROOM:-1GiB}" ${LIVE_EXACT:+--exact} > "$RES/live.log" 2>&1 &
    local spid=$!
    ( while kill -0 $spid 2>/dev/null; do
          echo "$(date +%s.%N) $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | tr '\n' ' ')"
          sleep 0.1
      done > "$RES/live.smi" ) &
    local ok=
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null && { ok=1; break; }
        kill -0 $spid 2>/dev/null || break
        sleep 0.5
    done
    [[ -n $ok ]] || { tail -30 "$RES/live.log"; echo -1 > "$ctl"; kill $filler 2>/dev/null || true; return 1; }
    grep -E "pipeshard plan for|follows the card" "$RES/live.log" || true
    python3 "$LIVE_PY" clients $port 4 "$stop" "$RES/live.requests" &
    local cl=$!
    local step
    echo "{\"name\": \"start\", \"extra_gib\": 0, \"t\": $(date +%s.%N)}" > "$RES/live.phases"
    sleep "$phase"
    for step in ${LIVE_STEPS:-2 8} 0; do
        echo "$step" > "$ctl"
        echo "{\"name\": \"filler+$step\", \"extra_gib\": $step, \"t\": $(date +%s.%N)}" >> "$RES/live.phases"
        sleep "$phase"
    done
    touch "$stop"
    wait $cl || true
    curl -s "http://127.0.0.1:$port/metrics" | grep -E '^pipeshard_' > "$RES/live.metrics" || true
    cat "$RES/live.metrics"
    kill $spid 2>/dev/null || true; wait $spid 2>/dev/null || true
    echo -1 > "$ctl"; wait $filler 2>/dev/null || true
    cat "$RES/live.filler"
    grep -E "re-plan|allowance|smallest plan" "$RES/live.log" > "$RES/live.moves" || true
    head -40 "$RES/live.moves"
    python3 "$LIVE_PY" summary "$RES" > "$RES/live.summary.json" || true
    cat "$RES/live.summary.json"
    [[ ${LIVE_FRESH:-1} == 1 ]] || return 0
    if [[ -n ${LIVE_FRESH_LEVELS:-} ]]; then
        # A fresh start under the live run's own flags (`auto`, the same
        # headroom, so the same batching) with the filler holding each
        # phase's level: the speed reference of a fresh start at that budget.
        local lvl
        for lvl in $LIVE_FRESH_LEVELS; do
            echo "$lvl" > "$ctl"
            python3 "$LIVE_PY" filler "$ctl" "${LIVE_FREE:-8}" > "$RES/live-fresh-auto-$lvl.filler" 2>&1 &
            filler=$!
            for _ in $(seq 120); do grep -q extra_gib "$RES/live-fresh-auto-$lvl.filler" && break; sleep 0.5; done
            cat "$RES/live-fresh-auto-$lvl.filler"
            live_fresh "live-fresh-auto-$lvl" "fresh under auto, filler +$lvl GiB" \
                --vram-budget auto --vram-headroom "${LIVE_HEADROOM:-1GiB}"
            echo -1 > "$ctl"; wait $filler 2>/dev/null || true
        done
        return 0
    fi
    # A fresh start at each budget the live plan had, for the speed reference.
    local b
    # (budgets within 0.5 GiB of one measured already are not measured again)
    for b in $(python3 -c 'import json,sys
seen = []
for p in json.load(open(sys.argv[1]))["phases"]:
    # below the smallest plan, the smallest plan (its total) is what serves
    b = p["budget_gib"] and max(p["budget_gib"], p["plan_total_gib"] + 0.0625)
    if b and all(abs(b - x) > 0.5 for x in seen):
        seen.append(b)
        print(int(b * 2**30))' "$RES/live.summary.json"); do
        live_fresh "live-fresh-$b" "fresh at $b bytes" --vram-budget "$b"
    done
}

# One fresh server for s10live's speed reference: R2 as the live run serves
# it, with the given budget flags, 4 clients for LIVE_FRESH_S seconds (the
# first round left out); its mean decode per client goes to live.fresh.
live_fresh() { # NAME LABEL BUDGET-FLAGS...
    local name=$1 label=$2; shift 2
    local port=18090 stop=$W/clients.stop spid cl ok=
    rm -f "$stop"
    dist/pipeshard-server --host 127.0.0.1 --port $port --metrics -t 16 -fa on -ctk f16 -ctv f16 \
        --profile "$RES/profile.yaml" -m "$W/r2.gguf" -c 17408 -np 4 --kv-unified "$@" > "$RES/$name.log" 2>&1 &
    spid=$!
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null && { ok=1; break; }
        kill -0 $spid 2>/dev/null || break
        sleep 0.5
    done
    if [[ -n $ok ]]; then
        grep -E "pipeshard plan for|follows the card" "$RES/$name.log" || true
        python3 "$LIVE_PY" clients $port 4 "$stop" "$RES/$name.requests" &
        cl=$!
        sleep "${LIVE_FRESH_S:-12}"; touch "$stop"; wait $cl || true
        python3 -c 'import json,sys
r=[json.loads(l) for l in open(sys.argv[1])]; r=[x for x in r if not x.get("probe")]; s=[x["predicted_per_second"] for x in r[4:] if x["ok"]] or [x["predicted_per_second"] for x in r if x["ok"]]
print("%s: %d requests, %d failed, decode %.1f tok/s each (mean)" % (sys.argv[2], len(r), sum(not x["ok"] for x in r), sum(s)/max(len(s),1)))' "$RES/$name.requests" "$label" | tee -a "$RES/live.fresh"
    else
        tail -5 "$RES/$name.log"
    fi
    kill $spid 2>/dev/null || true; wait $spid 2>/dev/null || true
}

# Issue 18, engine half (patch 0023), after zunstash with dist/ carried
# (pipeshard, examples/migrate_gpu and the libraries): R1 under an exact-mode
# plan with movable weights; ~1 GiB of device weights demoted to pinned host
# memory mid-decode and promoted back, tokens against the unmoved run, NVML
# process memory around each move, and each move's time. At 8 GiB the plan
# keeps everything on the GPU (the demoted weights then stream through slots
# the demotion adds); at 4 GiB it already streams some.
zmigrate() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$RES/machine.txt"
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    [[ -f dist/lib/libggml-cuda.so.stack ]] || bash scripts/device/cuda-stack.sh dist
    [[ -f $W/r1.gguf ]] || $P synth --arch llama3.1-8b --quant q4_0 -o "$W/r1.gguf" > /dev/null
    cp profiles/intel-r-xeon-r-processor__nvidia-h200__t16.yaml "$RES/profile.yaml"
    local b
    for b in 8GiB 4GiB; do
        PIPESHARD_LOG=warn,pipeshard=info,llama.cpp=debug \
            dist/migrate_gpu "$W/r1.gguf" "$b" "$RES/profile.yaml" 1024 48 > "$RES/migrate-r1-$b.jsonl" 2> "$RES/migrate-r1-$b.log" \
            || echo "migrate_gpu $b failed: rc $?"
        cat "$RES/migrate-r1-$b.jsonl"
        grep -iE "error|abort|moved weights|llama_move_tensors|sched_reserve: reserving|streaming host weights" "$RES/migrate-r1-$b.log" | tail -12 || true
    done
}

# s10parity (after zunstash; dist/ carried with upstream's llama-bench built
# from the pristine release, with its own libllama and libggml-base, in
# dist/upstream/bin: build-upstream-bench.sh's build, made on the CPU
# machine to save device time): full-GPU parity (issue 16,
# part 1) on one host, five repetitions each. Upstream's llama-bench pp4096
# at three ubatches and tg64 at depth 4096 (at its default ubatch and at
# 2048); pipeshard's bench with no budget (hooks idle, ub 2048) and with a
# budget larger than the model (the planner's plan, hooks active); R1 then
# R2, upstream first and again last to bracket the host's drift.
parity_up() { # NAME MODEL
    local ub=dist/upstream/bin/llama-bench
    # Its own pristine libllama/libggml-base next to it, never dist/lib's.
    export LD_LIBRARY_PATH=$PWD/dist/upstream/bin
    smi_peak "$1-pp" timeout 240 $ub -m "$W/$2.gguf" -ngl 99 -fa 1 -t 16 -p 4096 -n 0 -b 4096 -ub 1024,2048,4096 -r 5 -o md
    grep -E "pp4096" "$RES/$1-pp.log" || true
    smi_peak "$1-tg" timeout 240 $ub -m "$W/$2.gguf" -ngl 99 -fa 1 -t 16 -p 0 -n 64 -d 4096 -ub 512,2048 -r 5 -o md
    grep -E "tg64" "$RES/$1-tg.log" || true
    unset LD_LIBRARY_PATH
}
parity_ps() { # NAME MODEL BUDGET POLICY [EXTRA...]
    local name=$1 model=$2 budget=$3 policy=$4; shift 4
    timeout 240 $P bench -m "$W/$model.gguf" --vram-budget "$budget" --policies "$policy" -p 4096 -n 64 -r 5 -t 16 \
        --profile "$RES/profile.yaml" -o "$RES/$name" "$@" > "$RES/$name.log" 2>&1 || echo "$name failed: $?"
    grep -E "TTFT|error" "$RES/$name.log" | sed -E "s/^.*(INFO|WARN|ERROR)[^ ]* //; s/^/$name: /" || true
}
s10parity() {
    ZUPSTREAM=0 zprep
    local m
    for m in r1 r2; do
        parity_up "up-$m" "$m"
        parity_ps "$m-full" "$m" 64GiB full-gpu --ub 2048
        parity_ps "$m-big" "$m" 64GiB pipeshard
        parity_up "up2-$m" "$m"
    done
}

# s10parity2 (same warm machine after s10parity, or after zunstash with the
# same carry): where pipeshard's rows lose. llama.cpp's own prompt and decode
# times beside the wall clock; R2 at 64 GiB with the same plan without
# stream slots (pipeshard-sync: the offload hook still installed); R1 with
# the NVML sampler once a minute; upstream's pp4096 at ub 2048 in the same call.
parity_up_pp() { # NAME MODEL
    export LD_LIBRARY_PATH=$PWD/dist/upstream/bin
    smi_peak "$1-pp" timeout 240 dist/upstream/bin/llama-bench -m "$W/$2.gguf" -ngl 99 -fa 1 -t 16 -p 4096 -n 0 -b 4096 -ub 2048 -r 5 -o md
    grep -E "pp4096" "$RES/$1-pp.log" || true
    unset LD_LIBRARY_PATH
}
s10parity2() {
    ZUPSTREAM=0 zprep
    parity_up_pp b-up-r1 r1
    parity_ps b-r1-full r1 64GiB full-gpu --ub 2048
    PIPESHARD_MEMORY_SAMPLE_MS=60000 parity_ps b-r1-full-nosample r1 64GiB full-gpu --ub 2048
    parity_up_pp b-up-r2 r2
    parity_ps b-r2-full r2 64GiB full-gpu --ub 2048
    parity_ps b-r2-big r2 64GiB pipeshard
    parity_ps b-r2-big-sync r2 64GiB pipeshard-sync
    # CUDA's default per-thread stack instead of the module's largest need
    PIPESHARD_CUDA_STACK_BYTES=1024 parity_ps b-r2-full-stack1024 r2 64GiB full-gpu --ub 2048
    PIPESHARD_CUDA_STACK_BYTES=1024 parity_ps b-r2-big-stack1024 r2 64GiB pipeshard
    parity_up_pp b-up2-r2 r2
    PIPESHARD_CUDA_STACK_BYTES=1024 parity_ps b-r1-full-stack1024 r1 64GiB full-gpu --ub 2048
    parity_up_pp b-up2-r1 r1
}

# s10parity3 (after zunstash; dist/ carried with the pristine llama-bench in
# dist/upstream/bin and the same llama-bench built from pipeshard's patched
# tree in dist/upstream/bin-patched, each with its own libllama and
# libggml-base): whether pipeshard's prefill loss is its patches (hooks idle)
# or its own process, alternating the two llama-benches around pipeshard's row.
parity_llb() { # NAME MODEL DIR TEST
    export LD_LIBRARY_PATH=$PWD/dist/upstream/$3
    local t=(-p 4096 -n 0 -b 4096 -ub 2048)
    [[ $4 == tg ]] && t=(-p 0 -n 64 -d 4096 -ub 512)
    smi_peak "$1" timeout 240 dist/upstream/$3/llama-bench -m "$W/$2.gguf" -ngl 99 -fa 1 -t 16 "${t[@]}" -r 5 -o md
    grep -E "pp4096|tg64" "$RES/$1.log" | sed "s/^/$1: /" || true
    unset LD_LIBRARY_PATH
}
s10parity3() {
    ZUPSTREAM=0 zprep
    cp dist/lib/libggml-cuda.so dist/lib/libggml-cpu.so dist/upstream/bin-patched/
    local m
    for m in r1 r2; do
        parity_llb "c-up-$m-pp" $m bin pp
        parity_llb "c-upp-$m-pp" $m bin-patched pp
        parity_ps "c-$m-full" $m 64GiB full-gpu --ub 2048
        parity_llb "c-upp2-$m-pp" $m bin-patched pp
        parity_llb "c-up2-$m-pp" $m bin pp
        parity_llb "c-up-$m-tg" $m bin tg
        parity_llb "c-upp-$m-tg" $m bin-patched tg
    done
    parity_ps c-r2-big r2 64GiB pipeshard
    parity_ps c-r1-big r1 64GiB pipeshard
}

# s10parity4 (after zunstash; dist/ carried with both llama-benches, the
# patched one built with patch 0025): the parity rows after patch 0025, one
# call: upstream's pristine llama-bench (pp4096 at ub 1024 and 2048, tg64 @
# d4096 at its default ubatch and at 2048) before and after pipeshard's rows
# (no budget at ub 2048, hooks idle; 64 GiB with the planner's plan, hooks
# active), and the patched llama-bench's pp4096 at ub 2048.
s10parity4() {
    ZUPSTREAM=0 zprep
    cp dist/lib/libggml-cuda.so dist/lib/libggml-cpu.so dist/upstream/bin-patched/
    local m
    for m in r1 r2; do
        parity_up "d-up-$m" "$m"
        parity_ps "d-$m-full" "$m" 64GiB full-gpu --ub 2048
        parity_ps "d-$m-big" "$m" 64GiB pipeshard
        parity_llb "d-upp-$m-pp" $m bin-patched pp
        parity_up "d-up2-$m" "$m"
    done
}

# s10parity5 (after zunstash; dist/ carried from this branch's final build,
# and dist-no0025/: the same with libggml-base built without patch 0025):
# the final parity rows, and patch 0025 on and off within one call.
s10parity5() {
    ZUPSTREAM=0 zprep
    cp dist/lib/libggml-cuda.so dist/lib/libggml-cpu.so dist-no0025/lib/
    local m
    for m in r1 r2; do
        parity_up "e-up-$m" "$m"
        parity_ps "e-$m-full" "$m" 64GiB full-gpu --ub 2048
        parity_ps "e-$m-big" "$m" 64GiB pipeshard
        P=dist-no0025/pipeshard parity_ps "e-$m-full-no0025" "$m" 64GiB full-gpu --ub 2048
        P=dist-no0025/pipeshard parity_ps "e-$m-big-no0025" "$m" 64GiB pipeshard
        parity_up "e-up2-$m" "$m"
    done
}

# s10parity6 (as s10parity5): patch 0025 on the paths that copy CPU-computed
# data every step: R2 at 4 GiB (hybrid experts) and R1 at 2 GiB, with and
# without it, speed and the generated tokens (greedy, same prompt).
s10parity6() {
    ZUPSTREAM=0 zprep
    cp dist/lib/libggml-cuda.so dist/lib/libggml-cpu.so dist-no0025/lib/
    local v d
    for v in with no0025; do
        d=dist; [[ $v == no0025 ]] && d=dist-no0025
        P=$d/pipeshard one "f-r2-4g-$v" r2 4GiB pipeshard
        P=$d/pipeshard one "f-r1-2g-$v" r1 2GiB pipeshard
        timeout 120 $d/pipeshard run -m "$W/r2.gguf" --vram-budget 4GiB --profile "$RES/profile.yaml" -t 16 \
            -p "The three primary colors are" -n 48 --temp 0 > "$RES/f-r2-4g-run-$v.txt" 2> "$RES/f-r2-4g-run-$v.log" || echo "run $v failed"
    done
    cmp "$RES/f-r2-4g-run-with.txt" "$RES/f-r2-4g-run-no0025.txt" && echo "R2 4 GiB greedy text identical with and without patch 0025"
}

# s11parity (after zunstash; dist/ carried from this branch's build, the
# pristine llama-bench in dist/upstream/bin, and in dist/upstream/bin-patched
# the same llama-bench compiled from pipeshard's patched tree and linked to
# dist/lib's libraries): issue 16 part 1 in one call. Upstream's pristine
# llama-bench (pp4096 at ub 1024/2048/4096, tg64 @ d4096 at its default ub
# and 2048) before and after pipeshard's rows: no budget (hooks idle, ub
# 2048) and 64 GiB (the planner's plan, hooks active), each with the greedy
# token taken in the graph (backend sampling, the default) and with the old
# loop (--host-argmax); the patched llama-bench's tg (what the patches cost
# with hooks idle); upstream's tg repetitions one by one (JSON); no budget
# with patch 0019's queued host copies off.
s11parity() {
    ZUPSTREAM=0 zprep
    if [[ -x dist/upstream/bin-patched/llama-bench ]]; then
        cp -a dist/lib/. dist/upstream/bin-patched/
    fi
    local m
    for m in r1 r2; do
        parity_up "g-up-$m" "$m"
        parity_ps "g-$m-full" "$m" 64GiB full-gpu --ub 2048
        parity_ps "g-$m-big" "$m" 64GiB pipeshard
        parity_ps "g-$m-full-host" "$m" 64GiB full-gpu --ub 2048 --host-argmax
        parity_ps "g-$m-big-host" "$m" 64GiB pipeshard --host-argmax
        [[ -x dist/upstream/bin-patched/llama-bench ]] && parity_llb "g-upp-$m-tg" "$m" bin-patched tg
        # each repetition's time (samples_ns): the first against the others
        LD_LIBRARY_PATH=$PWD/dist/upstream/bin timeout 240 dist/upstream/bin/llama-bench -m "$W/$m.gguf" -ngl 99 -fa 1 -t 16 \
            -p 0 -n 64 -d 4096 -ub 512 -r 5 -o json > "$RES/g-up-$m-tg-json.log" 2>&1 || echo "g-up-$m-tg-json failed"
        grep -A7 '"samples_ns"' "$RES/g-up-$m-tg-json.log" | tr -d ' \n' | sed "s/^/g-up-$m-tg-json: /"; echo
        GGML_SCHED_SYNC_HOST_COPIES=1 parity_ps "g-$m-full-synccopy" "$m" 64GiB full-gpu --ub 2048
        parity_up "g-up2-$m" "$m"
    done
}

# s11parity2 (as s11parity): the final rows with bench's --tg (decode also
# measured as llama-bench's tg @ d4096: the prompt's cache kept between
# repetitions instead of the prompt run again), upstream's tg repetitions one
# by one (JSON) beside its pp and tg tables, before and after.
parity_up_json() { # NAME MODEL
    LD_LIBRARY_PATH=$PWD/dist/upstream/bin timeout 240 dist/upstream/bin/llama-bench -m "$W/$2.gguf" -ngl 99 -fa 1 -t 16 \
        -p 0 -n 64 -d 4096 -ub 512 -r 5 -o json > "$RES/$1.log" 2>&1 || echo "$1 failed"
    grep -A7 '"samples_ts"' "$RES/$1.log" | tr -d ' \n' | sed "s/^/$1: /"; echo
}
s11parity2() {
    ZUPSTREAM=0 zprep
    local m
    for m in r1 r2; do
        parity_up "h-up-$m" "$m"
        parity_up_json "h-up-$m-tg-json" "$m"
        parity_ps "h-$m-full" "$m" 64GiB full-gpu --ub 2048 --tg
        parity_ps "h-$m-big" "$m" 64GiB pipeshard --tg
        grep -h "as llama-bench" "$RES/h-$m-full.log" "$RES/h-$m-big.log" | sed -E "s/^.*INFO[^ ]* //" || true
        parity_up_json "h-up2-$m-tg-json" "$m"
        parity_up "h-up2-$m" "$m"
        # greedy tokens: the argmax in the graph (CUDA) against the host's
        local v
        for v in graph host; do
            timeout 120 $P run -m "$W/$m.gguf" --n-gpu-layers=-1 -t 16 -p "The three primary colors are" -n 64 --ignore-eos \
                $([[ $v == host ]] && echo --host-argmax) > "$RES/h-$m-run-$v.txt" 2> "$RES/h-$m-run-$v.log" || echo "run $m $v failed"
        done
        cmp "$RES/h-$m-run-graph.txt" "$RES/h-$m-run-host.txt" && echo "h-$m-run: the same 64 greedy tokens with the argmax in the graph and on the host"
    done
}

# s11slot (after zunstash, dist/ carried with dist/pipeshard-server.base, the
# merged main's server): issue 14's R2 rows with the slots' own decode tier
# (the server's plan prices a 4-token ubatch for -np 4). Every pipeshard row
# logs the scheduler's host time per graph (GGML_SCHED_TIMING, patch 0019;
# upstream's server shows ggml's info lines from -lv 4), by the tokens a
# graph routes: 1 for one client's decode, 4 when four slots decode together.
# One client: `pipeshard bench` and the server on the same plan (where the
# server's decode loses). Four clients: this branch's server against the
# base, then a plan with a 2048-token ubatch (`pipeshard plan --ub 2048`,
# served with --plan): its compute buffer's difference goes to resident
# weights. Then upstream's own placement with no budget, one round each:
# --cpu-moe -ngl 99 and -ngl 99; then, where the call's time allows, the
# four-client pair again.
s11slot() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep
    local sb=${SB:-scripts/device/server-bench.sh} base=dist/pipeshard-server.base
    export GGML_SCHED_TIMING=1
    PIPESHARD_LOG=info,llama.cpp=debug one r2-1-bench r2 4GiB pipeshard
    bash $sb r2_1 r2-1-new --vram-budget 4GiB -lv 4 || true
    bash $sb r2_4 r2-4-new --vram-budget 4GiB -lv 4 || true
    PIPESHARD_SERVER=$base bash $sb r2_4 r2-4-base --vram-budget 4GiB -lv 4 || true
    timeout 120 $P plan -m "$W/r2.gguf" --vram-budget 4GiB --profile "$RES/profile.yaml" -c 17408 -np 4 --ub 2048 \
        --flash-attn on -t 16 --format yaml > "$RES/plan-np4-ub2048.yaml" 2> "$RES/plan-np4-ub2048.log" \
        && bash $sb r2_4 r2-4-ub2048 --plan "$RES/plan-np4-ub2048.yaml" -lv 4 || true
    unset GGML_SCHED_TIMING
    ROUNDS=1 bash $sb r2_4 r2-4-up-cpumoe --cpu-moe -ngl 99 || true
    ROUNDS=1 bash $sb r2_1 r2-1-up-cpumoe --cpu-moe -ngl 99 || true
    ROUNDS=1 bash $sb r2_4 r2-4-up-gpu -ngl 99 || true
    # a second pair, where the call's time allows (S11_UNTIL: seconds)
    if ((SECONDS < ${S11_UNTIL:-230})); then
        GGML_SCHED_TIMING=1 bash $sb r2_4 r2-4-new-b --vram-budget 4GiB -lv 4 || true
        GGML_SCHED_TIMING=1 PIPESHARD_SERVER=$base bash $sb r2_4 r2-4-base-b --vram-budget 4GiB -lv 4 || true
    fi
}

# s11b (after zunstash, dist/ carried as for s11slot): why s11slot's
# four-client rows with the slots' tier were slower (88 ms per 4-token step
# against the base's 45, twice the bytes streamed per step), one round each,
# with the scheduler's timing, from plans written by `pipeshard plan` and
# edited (JSON) before --plan: the new plan with stream_routed_max 64 (the
# base's; the new cost model gives 240), the one-sequence plan for this
# context (the base's residency) as written (240), and the new plan with
# its routers in host memory again (64); the base server between them. One
# client: `pipeshard bench` and the server without the script's nvidia-smi
# loop (SMI=0: each query takes CPU from the CPU's matmuls).
s11b() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep
    local sb=${SB:-scripts/device/server-bench.sh} base=dist/pipeshard-server.base
    export GGML_SCHED_TIMING=1
    PIPESHARD_LOG=info,llama.cpp=debug one r2-1-bench-b r2 4GiB pipeshard
    SMI=0 bash $sb r2_1 r2-1-new-nosmi --vram-budget 4GiB -lv 4 || true
    local pl="$P plan -m $W/r2.gguf --vram-budget 4GiB --profile $RES/profile.yaml -c 17408 --flash-attn on -t 16 --format json"
    $pl -np 4 > "$RES/plan-np4.json" 2> "$RES/plan-np4.log"
    $pl -np 1 > "$RES/plan-np1.json" 2> "$RES/plan-np1.log"
    python3 - "$RES" <<'PY'
import json, sys
res = sys.argv[1]
p = json.load(open(f"{res}/plan-np4.json"))
p["stream_routed_max"] = 64
json.dump(p, open(f"{res}/plan-np4-rm64.json", "w"))
for t in p["tensors"]:
    if t["role"] == "MoeRouter":
        t["resident"] = False
        t["exec"] = [[n, "cpu" if n == 1 else "stream"] for n, _ in t["exec"]]
json.dump(p, open(f"{res}/plan-np4-rm64-router-host.json", "w"))
q = json.load(open(f"{res}/plan-np1.json"))
print("np4:", p["stream_routed_max"], p["tiers"], "np1:", q["stream_routed_max"], q["tiers"])
PY
    ROUNDS=1 bash $sb r2_4 r2-4-np4-rm64 --plan "$RES/plan-np4-rm64.json" -lv 4 || true
    ROUNDS=1 PIPESHARD_SERVER=$base bash $sb r2_4 r2-4-base-c --vram-budget 4GiB -lv 4 || true
    ROUNDS=1 bash $sb r2_4 r2-4-np1plan --plan "$RES/plan-np1.json" -lv 4 || true
    ROUNDS=1 bash $sb r2_4 r2-4-np4-rm64-router-host --plan "$RES/plan-np4-rm64-router-host.json" -lv 4 || true
    for f in r2-1-bench-b r2-1-new-nosmi r2-4-np4-rm64 r2-4-base-c r2-4-np1plan r2-4-np4-rm64-router-host; do
        echo "== $f"; grep -h "compute_splits: [14]-token" "$RES/$f.log" "$RES/$f/"*.log 2>/dev/null | tail -2 | sed 's/.*graphs/graphs/'
    done
}

# s11c (after zunstash, dist/ carried as for s11slot): the final build (the
# slots' tier with the routers in host memory) against the base, and
# upstream's placement, all without the script's nvidia-smi loop (SMI=0,
# s11b: it cost the one-client server ~3 ms of CPU splits per token); the
# pipeshard rows' peak is /metrics' NVML figure for the process.
s11c() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep
    local sb=${SB:-scripts/device/server-bench.sh} base=dist/pipeshard-server.base
    export SMI=0 GGML_SCHED_TIMING=1
    bash $sb r2_1 r2-1-final --vram-budget 4GiB -lv 4 || true
    bash $sb r2_4 r2-4-final --vram-budget 4GiB -lv 4 || true
    PIPESHARD_SERVER=$base bash $sb r2_4 r2-4-base-d --vram-budget 4GiB -lv 4 || true
    unset GGML_SCHED_TIMING
    bash $sb r2_1 r2-1-up-cpumoe-d --cpu-moe -ngl 99 || true
    ROUNDS=1 bash $sb r2_4 r2-4-up-cpumoe-d --cpu-moe -ngl 99 || true
    ROUNDS=1 bash $sb r2_4 r2-4-up-gpu-d -ngl 99 || true
}

# Everything lands in $RES; the caller packs it: tar czf $OUT/results.tgz -C $W results

# Session 11, issue 17's last criterion (branch slot-free, patch 0026): the
# soak of session 9's H200 command, this build against the same build
# without patch 0026 (base/: only libllama-server-impl.so differs) and with
# the server's DEBUG_TIMINGS (timings/: the averages of pre_decode, decode,
# post_decode and sampling every 5 s). Three calls on one warm machine:
#   sf1 (carry .stash and .whl/slot-free): the CUDA module and the builds in /root/sf
#   sf2 (carry .whl/smol/part00, part01) and sf3 (carry part02, part03): the
#   default model, then the soaks, results into $OUT.
sf1() {
    zunstash
    mkdir -p /root/sf && tar -C /root/sf -xJf .whl/slot-free/sf.tar.xz
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so /root/sf/dist/lib/
    bash /root/sf/dist/cuda-stack.sh /root/sf/dist || true
    local v
    for v in base timings; do
        cp /root/sf/dist/pipeshard-server /root/sf/$v/
        ln -sfn ../dist/lib /root/sf/$v/lib
    done
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    lscpu | grep -E "Model name|^CPU\(s\)"
}
sf2() {
    mkdir -p /root/smol && cp .whl/smol/part0* /root/smol/ && ls -la /root/smol
    if [[ -f .whl/slot-free27/sf27.tar.xz ]]; then cp .whl/slot-free27/sf27.tar.xz /root/; fi
}
sfsoak() { # NAME SERVER SECONDS
    local name=$1 server=$2 secs=$3
    /root/sf/dist/pipeshard fuzz-http -m /root/smol.gguf --mode soak --clients 32 --duration-s "$secs" \
        --server "$server" --server-args "-c 16384 -np 32 -t 8 --cache-ram 0 -ngl 99" \
        --work-dir "/root/sfw/$name" --json > "$OUT/$name.json" 2> "$OUT/$name.log" || echo "soak $name: exit $?"
    tail -2 "$OUT/$name.log"
    xz -T8 -c "/root/sfw/$name/server.log" > "$OUT/$name-server.log.xz" || true
}
sf3() {
    sf2
    s9model
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/machine.txt"
    lscpu | grep -E "Model name|^CPU\(s\)" >> "$OUT/machine.txt"
    sfsoak after /root/sf/dist/pipeshard-server "${SF_AFTER_S:-130}"
    GGML_SCHED_TIMING=1 sfsoak timings /root/sf/timings/pipeshard-server "${SF_TIMINGS_S:-25}"
    sfsoak before /root/sf/base/pipeshard-server "${SF_BEFORE_S:-50}"
}

# sf4 (on the same warm machine after sf1-sf3; carry .whl/slot-free): the
# soak again with patch 0027 too (p27/: only libllama-server-impl.so differs).
sf4() {
    [[ -x /root/sf/dist/pipeshard && -f /root/smol.gguf ]] || { echo "sf4: run sf1-sf3 first"; exit 1; }
    mkdir -p /root/sf/p27 && tar -C /root/sf/p27 -xJf .whl/slot-free27/sf27.tar.xz
    cp /root/sf/dist/pipeshard-server /root/sf/p27/
    ln -sfn ../dist/lib /root/sf/p27/lib
    sfsoak after27 /root/sf/p27/pipeshard-server "${SF_AFTER27_S:-60}"
}

# sf5 (after sf1 and sf2 on a fresh machine, with .whl/smol/part02, part03
# carried): the model, then only the soak with patches 0026 and 0027.
sf5() {
    sf2
    s9model
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/machine.txt"
    lscpu | grep -E "Model name|^CPU\(s\)" >> "$OUT/machine.txt"
    local d=/root/sf/p27
    mkdir -p $d && tar -C $d -xJf /root/sf27.tar.xz
    cp /root/sf/dist/pipeshard-server $d/
    ln -sfn ../dist/lib $d/lib
    sfsoak after27 $d/pipeshard-server "${SF_AFTER27_S:-60}"
}

# Session 11 (lead): issue 17's 10-minute soak on the merged build (patches
# 0026 and 0027), session 9's H200 command. Three calls on one warm machine:
#   zunstash (carry .stash), then the model's parts (.whl/smol/part00..03, two
#   at a time) into /root/smol, s11soak2 (joins them)
#   s11soak (carry dist): starts the soak in its own session and waits ~570 s;
#   s11collect (same call as the next runs): waits for it, copies the reports.
s11soak1() { zunstash; mkdir -p /root/smol && cp .whl/smol/part00 /root/smol/; }
s11soak2() {
    mkdir -p /root/smol && cp .whl/smol/part0* /root/smol/
    s9model
}
s11soak() {
    rm -rf /root/s11 && cp -a dist /root/s11 && cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so /root/s11/lib/
    bash scripts/device/cuda-stack.sh /root/s11 || true
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > /root/s11-machine.txt
    lscpu | grep -E "Model name|^CPU\(s\)" >> /root/s11-machine.txt
    rm -rf /root/s11w && mkdir -p /root/s11w
    setsid nohup /root/s11/pipeshard fuzz-http -m /root/smol.gguf --mode soak --clients 32 --duration-s "${SOAK_S:-600}" \
        --server /root/s11/pipeshard-server --server-args "-c 16384 -np 32 -t 8 --cache-ram 0 -ngl 99" \
        --work-dir /root/s11w/soak --json > /root/s11w/soak.json 2> /root/s11w/soak.log < /dev/null &
    local t
    for t in $(seq $((${SOAK_WAIT_S:-570} / 5))); do
        sleep 5
        pgrep -f "fuzz-http -m /root/smol.gguf" > /dev/null || { echo "the soak ended after $((t * 5)) s"; break; }
        [[ $t == 6 ]] && { tail -3 /root/s11w/soak.log; nvidia-smi --query-compute-apps=pid,used_memory --format=csv; }
    done
    tail -3 /root/s11w/soak.log
}
s11collect() {
    local i
    for i in $(seq 240); do pgrep -f "fuzz-http -m /root/smol.gguf" > /dev/null || break; sleep 1; done
    mkdir -p "$OUT/soak"
    cp /root/s11-machine.txt /root/s11w/soak.json /root/s11w/soak.log "$OUT/soak/" || true
    xz -T8 -c /root/s11w/soak/server.log > "$OUT/soak/server.log.xz" || true
    tail -5 /root/s11w/soak.log
}


# Session 12, issue 14's four clients (branch four-clients, patch 0029's
# greedy fast path in common_sampler). After zunstash, one call carrying
# .whl/four-clients: its dist/ (without the sources for building the CUDA
# module and upstream's bench); base/, main's libllama-common.so.0 (the only
# library the patch changes; main's pipeshard-server is the same); tim/, the
# server library built with upstream's DEBUG_TIMINGS (the loop's pre-decode,
# decode, post-decode and per-slot sampling averages every 5 s). R2 with four
# clients on this build and on main's, with and without those timings, with
# upstream's --backend-sampling (default chain, and a chain the backend can
# run whole), one client, and upstream's --cpu-moe; all without the
# nvidia-smi loop (SMI=0). Rows that would not end within the call's 600 s
# are left out.
s12prep() {
    rm -rf dist && cp -a .whl/four-clients/dist dist
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep
    local v
    for v in base timing base-timing; do mkdir -p dist/$v && ln -sfn ../lib dist/$v/lib && cp dist/pipeshard-server dist/$v/; done
    xz -dc .whl/four-clients/base/libllama-common.so.0.xz > dist/base/libllama-common.so.0
    xz -dc .whl/four-clients/tim/libllama-server-impl.so.xz > dist/timing/libllama-server-impl.so
    cp dist/base/libllama-common.so.0 dist/timing/libllama-server-impl.so dist/base-timing/
}
# row NAME SERVER-DIR|- r2_4|r2_1 ARGS...: one server-bench row with the
# server in dist/SERVER-DIR (- for dist/), unless the call is past S12_STOP_S.
s12row() {
    local name=$1 dir=$2 what=$3 sb=.whl/four-clients/server-bench.sh; shift 3
    (( SECONDS < ${S12_STOP_S:-480} )) || { echo "$name: left out (${SECONDS} s)"; return 0; }
    if [[ $dir == - ]]; then bash $sb $what $name "$@" || true
    else PIPESHARD_SERVER=dist/$dir/pipeshard-server bash $sb $what $name "$@" || true; fi
    echo "$name: done at ${SECONDS} s"
}
s12fc() {
    s12prep
    export SMI=0 GGML_SCHED_TIMING=1
    row() { s12row "$@"; }
    row r2-4-fast - r2_4 --vram-budget 4GiB -lv 4
    row r2-4-base base r2_4 --vram-budget 4GiB -lv 4
    row r2-4-fast-t timing r2_4 --vram-budget 4GiB -lv 4
    row r2-4-base-t base-timing r2_4 --vram-budget 4GiB -lv 4
    row r2-4-bs - r2_4 --vram-budget 4GiB -lv 4 -bs
    row r2-4-bs-tk - r2_4 --vram-budget 4GiB -lv 4 -bs --samplers "top_k;temperature"
    row r2-1-fast - r2_1 --vram-budget 4GiB -lv 4
    GGML_SCHED_TIMING=0 ROUNDS=1 row r2-4-up-cpumoe - r2_4 --cpu-moe -ngl 99
    row r2-4-fast-b - r2_4 --vram-budget 4GiB -lv 4
    tar czf "$OUT/results.tgz" -C "$W" results
}
# s12fc2 (after zunstash, same carry): the four clients again, this build
# and main's alternating, four rounds each (round 1 as the prompts arrive,
# rounds 2-4 usually in one batch).
s12fc2() {
    s12prep
    export SMI=0 GGML_SCHED_TIMING=1 ROUNDS=4
    s12row r2-4-fast-c - r2_4 --vram-budget 4GiB -lv 4
    s12row r2-4-base-c base r2_4 --vram-budget 4GiB -lv 4
    s12row r2-4-fast-d - r2_4 --vram-budget 4GiB -lv 4
    s12row r2-4-base-d base r2_4 --vram-budget 4GiB -lv 4
    s12row r2-4-fast-e - r2_4 --vram-budget 4GiB -lv 4
    tar czf "$OUT/results.tgz" -C "$W" results
}
# s12fc3 (after zunstash, same carry): the fourth prompt sent LATE_S seconds
# after the other three (server-bench's LATE_S), this build and main's; rows
# named r2-4-*-lateSFX. With 0.3 s the first round still arrived 1+3 and the
# later rounds in one batch (the server was still saving the previous
# round's prompts when the four arrived); with 2 s the later rounds arrive
# 3+1 (the three together while the server saves, the fourth during their
# prompts).
# s12fc4 (after zunstash, same carry plus pst/: libllama.so.0 built with a
# few timers in llama_context::decode, process_ubatch and synchronize,
# measurement only): where a 4-token step's host time goes, this build.
s12fc4() {
    s12prep
    mkdir -p dist/pst && ln -sfn ../lib dist/pst/lib && cp dist/pipeshard-server dist/pst/
    xz -dc .whl/four-clients/pst/libllama.so.0.xz > dist/pst/libllama.so.0
    export SMI=0 GGML_SCHED_TIMING=1 ROUNDS=3
    s12row r2-4-fast-pst pst r2_4 --vram-budget 4GiB -lv 4
    tar czf "$OUT/results.tgz" -C "$W" results
}
s12fc3() {
    s12prep
    export SMI=0 GGML_SCHED_TIMING=1 ROUNDS=3 LATE_S=${LATE_S:-0.3}
    s12row r2-4-fast-late${SFX:-} - r2_4 --vram-budget 4GiB -lv 4
    s12row r2-4-base-late${SFX:-} base r2_4 --vram-budget 4GiB -lv 4
    tar czf "$OUT/results.tgz" -C "$W" results
}

# Session 12, issue 16 part 2 (branch prefill-overlap): where R1's streamed
# prefill at 2 GiB loses against full GPU. After zunstash, with dist/ from
# .whl/prefill-overlap carried. po_row: one `pipeshard bench` row (REPS
# repetitions, NGEN generated tokens: the plan is the same for 16 and 64).
po_row() { # NAME BUDGET POLICY [EXTRA...]
    local name=$1 budget=$2 policy=$3; shift 3
    timeout 200 $P bench -m "$W/r1.gguf" --vram-budget "$budget" --policies "$policy" -p 4096 -n "${NGEN:-16}" -r "${REPS:-5}" -t 16 \
        --profile "$RES/profile.yaml" -o "$RES/$name" "$@" > "$RES/$name.log" 2>&1 || echo "$name failed: $?"
    grep -E "TTFT|error|process VRAM" "$RES/$name.log" | sed -E "s/^.*(INFO|WARN|ERROR)[^ ]* //; s/^/$name: /" | grep -v "llama.cpp's prompt" || true
    grep -E "llama.cpp's prompt" "$RES/$name.log" | sed -E "s/^.*TTFT ([0-9.]+) s .llama.cpp's prompt time ([0-9.]+) s.*/\1 \2/" | tr '\n' ' ' | sed "s/^/$name TTFT, prompt time: /"; echo
}
po_up() { # NAME: upstream's pp4096 of R1 at ub 1024 and 2048
    LD_LIBRARY_PATH=$PWD/dist/upstream/bin timeout 120 dist/upstream/bin/llama-bench -m "$W/r1.gguf" -ngl 99 -fa 1 -t 16 \
        -p 4096 -n 0 -b 4096 -ub 1024,2048 -r 5 -o md > "$RES/$1.log" 2>&1 || echo "$1 failed: $?"
    grep -E "pp4096" "$RES/$1.log" || true
}
po_nsys() { # NAME BUDGET EXTRA...: a GPU timeline of R1's prompt (nsys, if the machine has it)
    local name=$1 budget=$2; shift 2
    local ns
    ns=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems*/*/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -n1 || true)
    [[ -n $ns ]] || { echo "no nsys"; ls /usr/local/cuda*/bin 2>/dev/null | tr '\n' ' '; return 0; }
    timeout 150 "$ns" profile -t cuda -o "$RES/$name" --force-overwrite true $P bench -m "$W/r1.gguf" --vram-budget "$budget" \
        --policies pipeshard -p 4096 -n 2 -r 2 -t 16 --profile "$RES/profile.yaml" -o "$RES/$name-out" "$@" > "$RES/$name.log" 2>&1 || echo "$name failed: $?"
    timeout 120 "$ns" stats -r cuda_gpu_trace -f csv -o "$RES/$name" "$RES/$name.nsys-rep" > "$RES/$name-stats.log" 2>&1 || echo "$name stats failed: $?"
    ls -la "$RES" | grep "$name"
    rm -f "$RES/$name.sqlite"
}
po1() {
    ZUPSTREAM=0 zprep
    mkdir -p dist/upstream/bin && tar xJf .whl/prefill-overlap/upbench.tar.xz -C dist/upstream/bin && cp dist/lib/libggml-cuda.so dist/lib/libggml-cpu.so dist/upstream/bin/
    po_up up1
    po_row fg1024 64GiB full-gpu --ub 1024
    po_row fg2048 64GiB full-gpu --ub 2048
    po_row p2g 2GiB pipeshard
    po_row big1024 64GiB pipeshard --plan-ubatch 1024
    local s b
    REPS=3
    for s in 2 3 6 8; do po_row "p2g-s$s" 2GiB pipeshard --stream-slots $s; done
    po_row p2g-ub2048 2GiB pipeshard --plan-ubatch 2048
    for b in 3GiB 4GiB 6GiB; do po_row "p$b" $b pipeshard; done
    po_nsys nsys-p2g 2GiB
    po_row p2g-again 2GiB pipeshard
}


# A GPU timeline without Nsight Systems: scripts/device/cupti-trace.cpp,
# built here against this machine's CUPTI and loaded through
# CUDA_INJECTION64_PATH; po_trace runs one po_row under it (the trace in
# $RES/NAME.csv.xz).
po_trace_build() {
    local h inc lib k m s
    h=$(ls /usr/local/cuda/extras/CUPTI/include/cupti_activity.h /usr/local/cuda/targets/*/include/cupti_activity.h \
        /usr/local/cuda/include/cupti_activity.h 2>/dev/null | head -n1 || true)
    [[ -n $h ]] || { echo "no CUPTI headers"; return 1; }
    inc=$(dirname "$h")
    lib=$(ls /usr/local/cuda/extras/CUPTI/lib64/libcupti.so /usr/local/cuda/targets/*/lib/libcupti.so /usr/local/cuda/lib64/libcupti.so 2>/dev/null | head -n1 || true)
    [[ -n $lib ]] || { echo "no libcupti"; return 1; }
    k=$(grep -hoE "CUpti_ActivityKernel[0-9]+;" "$inc"/cupti_activity*.h | tr -d ';' | sort -V | tail -n1)
    m=$(grep -hoE "CUpti_ActivityMemcpy[0-9]+;" "$inc"/cupti_activity*.h | tr -d ';' | sort -V | tail -n1)
    s=$(grep -hoE "CUpti_ActivityMemset[0-9]+;" "$inc"/cupti_activity*.h | tr -d ';' | sort -V | tail -n1)
    echo "CUPTI $inc $lib: $k $m $s"
    g++ -std=c++17 -shared -fPIC -O2 -I"$inc" -I/usr/local/cuda/include -DKREC="$k" -DMREC="$m" -DSREC="$s" \
        "${CUPTI_SRC:-scripts/device/cupti-trace.cpp}" -L"$(dirname "$lib")" -lcupti -Wl,-rpath,"$(dirname "$lib")" -o /root/libcupti-trace.so
}
po_trace() { # NAME BUDGET POLICY [EXTRA...]
    [[ -f /root/libcupti-trace.so ]] || return 0
    CUDA_INJECTION64_PATH=/root/libcupti-trace.so CUPTI_TRACE_OUT=$RES/$1.csv REPS=2 NGEN=2 po_row "$@"
    [[ -f $RES/$1.csv ]] && { wc -l "$RES/$1.csv"; xz -T8 -f "$RES/$1.csv"; }
}
po2() { # dist/ (this branch), dist-old/: the same with the libggml-base of .whl/prefill-overlap/old (without patch 0030)
    ZUPSTREAM=0 zprep
    rm -rf dist-old && cp -a dist dist-old && cp .whl/prefill-overlap/old/dist/lib/libggml-base.so.0.26.0 dist-old/lib/
    po_trace_build || true
    P=dist-old/pipeshard po_trace t-old-p2g 2GiB pipeshard
    po_trace t-p2g 2GiB pipeshard
    po_trace t-fg1024 64GiB full-gpu --ub 1024
    po_row p2g 2GiB pipeshard
    P=dist-old/pipeshard po_row old-p2g 2GiB pipeshard
    po_row fg1024 64GiB full-gpu --ub 1024
    po_row p2g-again 2GiB pipeshard
    REPS=3
    po_row p3GiB 3GiB pipeshard
    po_row p2g-ub2048 2GiB pipeshard --plan-ubatch 2048
    po_row p2g-s3 2GiB pipeshard --stream-slots 3
    po_row p2g-s6 2GiB pipeshard --stream-slots 6
}


# po3 (same setup as po2, this branch's patch 0030 in dist/): the traces and
# the scheduler's new layouts (GGML_SCHED_TIMING) with and without the
# patch, the full-GPU reference, and the sweep around the planner's choice
# for R1 at 2 GiB (ubatch, slots), then R1 at 3 and 4 GiB and R2 at 4 GiB.
po3() {
    ZUPSTREAM=0 zprep
    rm -rf dist-old && cp -a dist dist-old && cp .whl/prefill-overlap/old/dist/lib/libggml-base.so.0.26.0 dist-old/lib/
    po_trace_build || true
    GGML_SCHED_TIMING=1 PIPESHARD_LOG=info,llama.cpp=debug po_trace t-p2g 2GiB pipeshard
    { grep -E "re-reserved" "$RES/t-p2g.log" | sed -E "s/^.*ggml_backend_sched_alloc_splits: //; s/ in [0-9.]+ ms//" | sort | uniq -c | sort -rn | head -8; } || true
    po_row fg1024 64GiB full-gpu --ub 1024
    po_row p2g 2GiB pipeshard
    P=dist-old/pipeshard po_row old-p2g 2GiB pipeshard
    po_row p2g-again 2GiB pipeshard
    REPS=3
    local u s
    for u in 512 2048; do po_row "p2g-ub$u" 2GiB pipeshard --plan-ubatch $u; done
    for s in 3 6; do po_row "p2g-s$s" 2GiB pipeshard --stream-slots $s; done
    po_row p3g 3GiB pipeshard
    po_row p4g 4GiB pipeshard
    P=dist-old/pipeshard po_row old-p4g 4GiB pipeshard
    po_row fg2048 64GiB full-gpu --ub 2048
}


# po4 (dist/ with the final patch 0030 and cost model; .whl/prefill-overlap
# also carries upbench.tar.xz, session 10's pristine llama-bench): the
# full-GPU references first (upstream's llama-bench and bench's full-GPU
# row), the trace of R1 at 2 GiB, the planner's plan with and without the
# patch, the sweep around it, then R2 at 4 GiB against its full-GPU row.
po4() {
    ZUPSTREAM=0 zprep
    rm -rf dist-old && cp -a dist dist-old && cp .whl/prefill-overlap/old/dist/lib/libggml-base.so.0.26.0 dist-old/lib/
    mkdir -p dist/upstream/bin && tar xJf .whl/prefill-overlap/upbench.tar.xz -C dist/upstream/bin \
        && cp dist/lib/libggml-cuda.so dist/lib/libggml-cpu.so dist/upstream/bin/
    po_up up1
    po_trace_build || true
    GGML_SCHED_TIMING=1 PIPESHARD_LOG=info,llama.cpp=debug po_trace t-p2g 2GiB pipeshard
    po_row fg1024 64GiB full-gpu --ub 1024
    po_row fg2048 64GiB full-gpu --ub 2048
    po_row p2g 2GiB pipeshard
    P=dist-old/pipeshard po_row old-p2g 2GiB pipeshard
    po_row p2g-again 2GiB pipeshard
    REPS=3
    local u s
    for u in 2048 4096; do po_row "p2g-ub$u" 2GiB pipeshard --plan-ubatch $u; done
    for s in 2 3 6; do po_row "p2g-s$s" 2GiB pipeshard --stream-slots $s; done
    po_row p4g 4GiB pipeshard
    po_row p4g-ub1024 4GiB pipeshard --plan-ubatch 1024
    po_r2 r2-fg 64GiB full-gpu --ub 2048
    po_r2 r2-4g 4GiB pipeshard
    P=dist-old/pipeshard po_r2 old-r2-4g 4GiB pipeshard
}
po_r2() { # NAME BUDGET POLICY [EXTRA...]: po_row on R2
    local name=$1 budget=$2 policy=$3; shift 3
    timeout 200 $P bench -m "$W/r2.gguf" --vram-budget "$budget" --policies "$policy" -p 4096 -n "${NGEN:-16}" -r "${REPS:-3}" -t 16 \
        --profile "$RES/profile.yaml" -o "$RES/$name" "$@" > "$RES/$name.log" 2>&1 || echo "$name failed: $?"
    grep -E "TTFT|error|process VRAM" "$RES/$name.log" | sed -E "s/^.*(INFO|WARN|ERROR)[^ ]* //; s/^/$name: /" | grep -v "llama.cpp's prompt" || true
}


# po5 (as po4): R2 at 4 GiB with and without patch 0030, alternated.
po5() {
    ZUPSTREAM=0 zprep
    rm -rf dist-old && cp -a dist dist-old && cp .whl/prefill-overlap/old/dist/lib/libggml-base.so.0.26.0 dist-old/lib/
    local i
    for i in 1 2; do
        REPS=4 po_r2 "r2-4g-$i" 4GiB pipeshard
        REPS=4 P=dist-old/pipeshard po_r2 "old-r2-4g-$i" 4GiB pipeshard
    done
    for f in "$RES"/*r2-4g-*.log; do
        echo "$(basename "$f" .log): $(grep -E "llama.cpp's prompt" "$f" | sed -E "s/^.*TTFT ([0-9.]+) s .*/\1/" | tr '\n' ' ')"
    done
}


# po6 (as po4, the committed patch 0030: layouts in place with one device
# besides the CPU): R1 at 2 GiB with the scheduler's layout log, then twice
# more, against the full-GPU row.
po6() {
    ZUPSTREAM=0 zprep
    GGML_SCHED_TIMING=1 PIPESHARD_LOG=info,llama.cpp=debug po_row p2g-log 2GiB pipeshard
    { grep -E "re-reserved" "$RES/p2g-log.log" | sed -E "s/^.*ggml_backend_sched_alloc_splits: //; s/ in [0-9.]+ ms//" | sort | uniq -c; } || true
    po_row fg1024 64GiB full-gpu --ub 1024
    po_row p2g 2GiB pipeshard
}

# Session 12, moe-decode2 (after zunstash, with .whl/moe-decode2 carried: its
# dist/ is this branch's build from scripts/device/pack.sh without upstream/,
# the source tarball and libggml-cpu; dist/base/ holds main's pipeshard and
# its lib/libggml-base* only, the one library the builds differ in): R2 at
# 4 GiB decode, the base against the copy back of the CPU's experts queued
# without waiting for the GPU (patch 0025), with the scheduler's per-graph
# host timing; the hybrid shares 4, 6 and 7 forced; both builds' greedy text
# on one prompt.
zmd2_prep() {
    rm -rf dist && cp -a .whl/moe-decode2/dist dist
    cp /root/cudalib/*.so dist/lib/
    cp -an dist/lib/. dist/base/lib/   # base/lib holds only the base's libggml-base
    ZUPSTREAM=0 zprep
    cp dist/lib/libggml-cuda.so.stack dist/base/lib/ 2>/dev/null || true
}
zmd2() {
    zmd2_prep
    export PIPESHARD_LOG=info,llama.cpp=debug   # ggml's info lines (the timing)
    export GGML_SCHED_TIMING=1
    local k
    P=dist/base/pipeshard one r2-base r2 4GiB pipeshard --tg
    one r2-new r2 4GiB pipeshard --tg
    for k in ${MD2_SHARES:-4 6 7}; do
        one r2-new-k$k r2 4GiB pipeshard --tg --hybrid-experts $k
    done
    P=dist/base/pipeshard one r2-base-k6 r2 4GiB pipeshard --tg --hybrid-experts 6
    P=dist/base/pipeshard one r2-base2 r2 4GiB pipeshard --tg
    one r2-new2 r2 4GiB pipeshard --tg
    md2run r2-run-base dist/base/pipeshard
    md2run r2-run-new dist/pipeshard
    cmp "$RES/r2-run-base.out" "$RES/r2-run-new.out" && echo "run: same greedy text (base, new): $(wc -c < "$RES/r2-run-new.out") bytes"
    grep -h "sched_compute_splits: 1-token" "$RES"/r2-*.log | sed 's/.*us per graph over 32: //' | cut -c1-200 | tail -40
}
# zmd2b (same staging): the planner's own share after a cost model's
# change (hybrid_cpu_contention 1.08: share 4; that build only, not on the
# branch, which keeps 1.35) against the base's (5), with share 4 forced on
# the base and 5 and 3 forced on that build.
zmd2b() {
    zmd2_prep
    export PIPESHARD_LOG=info,llama.cpp=debug
    export GGML_SCHED_TIMING=1
    P=dist/base/pipeshard one r2-base r2 4GiB pipeshard --tg
    one r2-new r2 4GiB pipeshard --tg
    P=dist/base/pipeshard one r2-base-k4 r2 4GiB pipeshard --tg --hybrid-experts 4
    one r2-new-k5 r2 4GiB pipeshard --tg --hybrid-experts 5
    one r2-new-k3 r2 4GiB pipeshard --tg --hybrid-experts 3
    P=dist/base/pipeshard one r2-base2 r2 4GiB pipeshard --tg
    one r2-new2 r2 4GiB pipeshard --tg
    P=dist/base/pipeshard one r2-base-k4b r2 4GiB pipeshard --tg --hybrid-experts 4
}
# zmd2c (same staging): share 5 on both builds, interleaved, to tell the
# copy back queued without the wait (patch 0025) from the host's drift.
zmd2c() {
    zmd2_prep
    export PIPESHARD_LOG=info,llama.cpp=debug
    export GGML_SCHED_TIMING=1
    local i
    for i in 1 2; do
        P=dist/base/pipeshard one r2-base-k5-$i r2 4GiB pipeshard --tg --hybrid-experts 5
        one r2-new-k5-$i r2 4GiB pipeshard --tg --hybrid-experts 5
    done
}
md2run() { # NAME BINARY: the greedy text (stdout) of a fixed prompt, R2 at 4 GiB
    timeout 120 "$2" run -m "$W/r2.gguf" --vram-budget 4GiB --profile "$RES/profile.yaml" -c 4352 -t 16 --flash-attn on \
        -p "The history of the printing press begins with movable type" -n 64 --ignore-eos --temp 0 --json \
        > "$RES/$1.out" 2> "$RES/$1.err" || echo "$1 failed: $?"
    grep -E "^plan:|failed|^error" "$RES/$1.err" | sed "s/^/$1: /"
}


# Session 12 (lead): the merged build in one call, after zunstash (carry
# .stash), carrying dist/ and .whl/lead12/upbench.tar.xz: upstream's pristine
# llama-bench (libllama, libggml-base, common and llama-bench, built on the
# CPU machine from the same sdist as build-upstream-bench.sh does; the CUDA
# and CPU modules are pipeshard's, copied next to it by zprep). Issue 16
# part 2: upstream's full-GPU pp4096 for R1 and R2 (ub 512 to 4096), then
# pipeshard's rows in budget (R1 2 GiB, R2 4 GiB; --tg) and with no budget,
# then upstream again. Issue 14: R2 through the server at 4 GiB, four
# clients (four rounds: the first as the prompts arrive) and one client,
# and upstream's --cpu-moe -ngl 99 with four clients.
s12lead_up() { # NAME MODEL
    LD_LIBRARY_PATH=$PWD/dist/upstream/bin timeout 150 dist/upstream/bin/llama-bench -m "$W/$2.gguf" -ngl 99 -fa 1 -t 16 \
        -p 4096 -n 0 -b 4096 -ub 512,1024,2048,4096 -r 5 -o md > "$RES/$1.log" 2>&1 || echo "$1 failed: $?"
    grep -E "pp4096" "$RES/$1.log" | sed "s/^/$1: /" || true
}
s12lead() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    [[ -f .whl/lead12/upbench.tar.xz ]] && mkdir -p dist/upstream/bin && tar -C dist/upstream/bin -xJf .whl/lead12/upbench.tar.xz
    ZUPSTREAM=0 zprep
    local m budget
    for m in r1 r2; do
        budget=2GiB; [[ $m == r2 ]] && budget=4GiB
        s12lead_up "l-up-$m" $m
        parity_ps "l-$m-budget" $m $budget pipeshard --tg
        parity_ps "l-$m-full" $m 64GiB full-gpu --ub 2048
        s12lead_up "l-up2-$m" $m
        echo "$m done at ${SECONDS} s"
    done
    export SMI=0
    ROUNDS=4 bash scripts/device/server-bench.sh r2_4 l-r2-4 --vram-budget 4GiB || true
    bash scripts/device/server-bench.sh r2_1 l-r2-1 --vram-budget 4GiB || true
    ROUNDS=1 bash scripts/device/server-bench.sh r2_4 l-r2-4-up-cpumoe --cpu-moe -ngl 99 || true
    echo "server rows done at ${SECONDS} s"
    tar czf "$OUT/results.tgz" -C "$W" results
}


# s12diag (after zunstash; dist/ and .whl/lead12 carried): s12lead's four
# clients fell to 44 tok/s on the merged build (patches 0029 + 0030). The
# same build with a diagnostic libggml-base (.whl/lead12/diag: patch 0030's
# three parts each switched off by an environment variable, DIAG_NO_ROT,
# DIAG_NO_INPLACE, DIAG_NO_SKIP; not committed as a patch) finds the part.
s12diag() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep > /dev/null
    mkdir -p dist/diag && ln -sfn ../lib dist/diag/lib && cp dist/pipeshard-server dist/pipeshard dist/diag/
    cp .whl/lead12/diag/libggml-base.so.0 dist/diag/
    export SMI=0 GGML_SCHED_TIMING=1 PIPESHARD_SERVER=dist/diag/pipeshard-server
    local sb=scripts/device/server-bench.sh
    DIAG_NO_ROT=1 ROUNDS=3 bash $sb r2_4 d-r2-4-norot --vram-budget 4GiB -lv 4 || true
    ROUNDS=2 bash $sb r2_4 d-r2-4-all --vram-budget 4GiB -lv 4 || true
    DIAG_NO_ROT=1 DIAG_NO_INPLACE=1 DIAG_NO_SKIP=1 ROUNDS=3 bash $sb r2_4 d-r2-4-none --vram-budget 4GiB -lv 4 || true
    echo "server rows done at ${SECONDS} s"
    P=dist/diag/pipeshard DIAG_NO_ROT=1 REPS=3 po_row d-r1-norot 2GiB pipeshard
    P=dist/diag/pipeshard REPS=3 po_row d-r1-all 2GiB pipeshard
    echo "done at ${SECONDS} s"
    tar czf "$OUT/results.tgz" -C "$W" results
}


# s12final (after zunstash; dist/ and .whl/lead12 carried): the merged build
# with patch 0030's slot rotation left out of graphs with routed copies (what
# s12diag found): upstream's full-GPU pp4096 of R1 before and after
# pipeshard's R1 at 2 GiB; R2 through the server at 4 GiB, four clients (four
# rounds) and one client; upstream's --cpu-moe -ngl 99 with four clients.
s12final() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    [[ -f .whl/lead12/upbench.tar.xz ]] && mkdir -p dist/upstream/bin && tar -C dist/upstream/bin -xJf .whl/lead12/upbench.tar.xz
    ZUPSTREAM=0 zprep > /dev/null
    s12lead_up f-up-r1 r1
    parity_ps f-r1-budget r1 2GiB pipeshard --tg
    s12lead_up f-up2-r1 r1
    echo "r1 done at ${SECONDS} s"
    export SMI=0
    ROUNDS=4 bash scripts/device/server-bench.sh r2_4 f-r2-4 --vram-budget 4GiB || true
    bash scripts/device/server-bench.sh r2_1 f-r2-1 --vram-budget 4GiB || true
    ROUNDS=1 bash scripts/device/server-bench.sh r2_4 f-r2-4-up-cpumoe --cpu-moe -ngl 99 || true
    echo "done at ${SECONDS} s"
    tar czf "$OUT/results.tgz" -C "$W" results
}

# Session 13, issue 16 part 2 for R2 (branch r2-prefill): R2's prompt at
# 4 GiB (one ubatch of 4096 that streams 14.24 GiB) against upstream's
# full-GPU pp4096. After zunstash (carry .stash), carrying .whl/r2-prefill:
# dist/ (scripts/device/pack.sh without upstream/ and the source tarball),
# old/libllama.so.0.6.0.xz (the same build without patch 0032, for dist-old),
# upbench.tar.xz (session 12's pristine llama-bench, as s12lead), and this
# branch's scripts (cupti-trace.cpp with host API records, trace-prompt.py).
r2p_prep() {
    local d=.whl/r2-prefill
    rm -rf dist && cp -a $d/dist dist && cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    mkdir -p dist/upstream/bin && tar -C dist/upstream/bin -xJf $d/upbench.tar.xz
    ZUPSTREAM=0 zprep > /dev/null
    rm -rf dist-old && cp -a dist dist-old && xz -dc $d/old/libllama.so.0.6.0.xz > dist-old/lib/libllama.so.0.6.0
    cp $d/trace-prompt.py $d/trace-gaps.py "$RES/" 2>/dev/null || true
}
r2p_up() { # NAME MODEL: upstream's full-GPU pp4096 (ub 1024, 2048, 4096)
    LD_LIBRARY_PATH=$PWD/dist/upstream/bin timeout 150 dist/upstream/bin/llama-bench -m "$W/$2.gguf" -ngl 99 -fa 1 -t 16 \
        -p 4096 -n 0 -b 4096 -ub 1024,2048,4096 -r 5 -o md > "$RES/$1.log" 2>&1 || echo "$1 failed: $?"
    grep -E "pp4096" "$RES/$1.log" | sed "s/^/$1: /" || true
}
r2p_ttft() { # NAME...: the TTFT of each repetition
    local f
    for f in "$@"; do
        echo "$f: $(grep -E "llama.cpp's prompt" "$RES/$f.log" | sed -E "s/^.*TTFT ([0-9.]+) s .*/\1/" | tr '\n' ' ')"
    done
}
r2p_trace() { # NAME BUDGET POLICY [EXTRA...]: po_r2 under the CUPTI recorder, host API calls included
    [[ -f /root/libcupti-trace.so ]] || return 0
    CUDA_INJECTION64_PATH=/root/libcupti-trace.so CUPTI_TRACE_API=1 CUPTI_TRACE_OUT=$RES/$1.csv REPS=${TREPS:-4} NGEN=2 po_r2 "$@"
    if [[ -f $RES/$1.csv ]]; then
        timeout 120 python3 .whl/r2-prefill/trace-prompt.py "$RES/$1.csv" > "$RES/$1.prompt.txt" 2>&1 || true
        head -c 6000 "$RES/$1.prompt.txt"
        xz -T8 -f "$RES/$1.csv"
    fi
}
# r2p1: the traces (R2 at 4 GiB with and without patch 0032), then the rows:
# full GPU at ub 2048 and 4096 (with and without 0032), R2 at 4 GiB, slots
# 3 and 6, R1 at 2 GiB; upstream before and after.
r2p1() {
    r2p_prep
    r2p_up u1-r2 r2
    CUPTI_SRC=.whl/r2-prefill/cupti-trace.cpp po_trace_build || CUPTI_SRC=scripts/device/cupti-trace.cpp po_trace_build || true
    P=dist-old/pipeshard r2p_trace t-old-r2-4g 4GiB pipeshard
    r2p_trace t-r2-4g 4GiB pipeshard
    echo "traces done at ${SECONDS} s"
    REPS=5
    po_r2 r2-fg2048 64GiB full-gpu --ub 2048
    po_r2 r2-fg4096 64GiB full-gpu --ub 4096
    P=dist-old/pipeshard po_r2 old-r2-fg4096 64GiB full-gpu --ub 4096
    po_r2 r2-4g 4GiB pipeshard
    P=dist-old/pipeshard po_r2 old-r2-4g 4GiB pipeshard
    po_r2 r2-4g-again 4GiB pipeshard
    REPS=3 po_r2 r2-4g-s3 4GiB pipeshard --stream-slots 3
    REPS=3 po_r2 r2-4g-s6 4GiB pipeshard --stream-slots 6
    po_row r1-2g 2GiB pipeshard
    r2p_up u2-r2 r2
    r2p_ttft r2-fg2048 r2-fg4096 old-r2-fg4096 r2-4g old-r2-4g r2-4g-again r2-4g-s3 r2-4g-s6 r1-2g
    echo "done at ${SECONDS} s"
    tar czf "$OUT/results.tgz" -C "$W" results
}

# r2p2 (after zunstash, or in one call carrying .stash too; .whl/r2-prefill: dist.tar.xz, the
# branch's final build (patch 0032, the planner's spread order, the mask's
# new cost); prev/pipeshard.xz, r2p1's pipeshard (same libraries, the
# planner before those two changes); upbench.tar.xz): upstream's full-GPU
# pp4096 of R2 before and after; R2 at 4 GiB with both planners; R2 at 4 GiB
# and R1 at 2 GiB with decode (--tg); both R2 plans.
r2p2() {
    [[ -f /root/cudalib/libggml-cuda.so ]] || zunstash > /dev/null
    local d=.whl/r2-prefill
    rm -rf dist && mkdir dist && tar -C dist -xJf $d/dist.tar.xz
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    mkdir -p dist/upstream/bin && tar -C dist/upstream/bin -xJf $d/upbench.tar.xz
    ZUPSTREAM=0 zprep > /dev/null
    rm -rf dist-prev && mkdir dist-prev && ln -s ../dist/lib dist-prev/lib
    xz -dc $d/prev/pipeshard.xz > dist-prev/pipeshard && chmod +x dist-prev/pipeshard
    r2p_up f-up-r2 r2
    REPS=5 po_r2 f-r2-4g 4GiB pipeshard
    REPS=5 P=dist-prev/pipeshard po_r2 f-prev-r2-4g 4GiB pipeshard
    parity_ps f-r2-4g-tg r2 4GiB pipeshard --tg
    parity_ps f-r1-2g-tg r1 2GiB pipeshard --tg
    r2p_up f-up2-r2 r2
    r2p_ttft f-r2-4g f-prev-r2-4g f-r2-4g-tg f-r1-2g-tg
    grep -hE "tg64|decode" "$RES"/f-r2-4g-tg.log "$RES"/f-r1-2g-tg.log | grep -vE "TTFT" | sed -E "s/^.*INFO[^ ]* //" | tail -4
    $P plan -m "$W/r2.gguf" --vram-budget 4GiB -c 4352 --profile "$RES/profile.yaml" > "$RES/f-plan-r2.txt" 2>&1 || true
    dist-prev/pipeshard plan -m "$W/r2.gguf" --vram-budget 4GiB -c 4352 --profile "$RES/profile.yaml" > "$RES/f-prev-plan-r2.txt" 2>&1 || true
    grep -E "ubatch|exps" "$RES/f-plan-r2.txt" | head -12
    echo "done at ${SECONDS} s"
    tar czf "$OUT/results.tgz" -C "$W" results
}

# Session 13, branch clients13 (issue 14: four clients with a margin). After
# zunstash; .whl/clients13 carried (dist/: this branch's build with main's
# libggml-base; diag/libggml-base.so.0: the same with the prefetch of routed
# experts, GGML_SCHED_EXPERT_PREFETCH bit 0, the next run's first copies at
# the end of a run, bit 1, and DIAG_ROT_ROUTED=1 putting back patch 0030's slot
# rotation in graphs with routed copies).
c13prep() {
    # main's modules (zunstash), also when another call of this session left them on a warm machine
    echo "9aefa3957d0b2e5a11c91b469a051f01  /root/cudalib/libggml-cuda.so" | md5sum -c --quiet || exit 3
    rm -rf dist && cp -a .whl/clients13/dist dist
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep > /dev/null
    local v
    for v in diag final; do
        [[ -f .whl/clients13/$v/libggml-base.so.0 ]] || continue
        mkdir -p dist/$v && ln -sfn ../lib dist/$v/lib && cp dist/pipeshard-server dist/pipeshard dist/$v/
        cp .whl/clients13/$v/libggml-base.so.0 dist/$v/
    done
}
# c13row NAME DIR|- r2_4|r2_1 ARGS...: one server-bench row (server in
# dist/DIR/), unless the call is past C13_STOP_S.
c13row() {
    local name=$1 dir=$2 what=$3 sb=.whl/clients13/server-bench.sh; shift 3
    (( SECONDS < ${C13_STOP_S:-500} )) || { echo "$name: left out (${SECONDS} s)"; return 0; }
    if [[ $dir == - ]]; then bash $sb $what $name "$@" || true
    else PIPESHARD_SERVER=dist/$dir/pipeshard-server bash $sb $what $name "$@" || true; fi
    grep -h "4-token graphs\|1-token graphs" "$RES/$name.log" | tail -2 | cut -c1-420 || true
    grep -h decode_tok_s_total "$RES/$name.clients" || true
    echo "$name: done at ${SECONDS} s"
}
c13a() {
    c13prep
    export SMI=0 GGML_SCHED_TIMING=1 ROUNDS=3
    c13row c13a-base - r2_4 --vram-budget 4GiB -lv 4
    GGML_SCHED_EXPERT_PREFETCH=1 c13row c13a-p1 diag r2_4 --vram-budget 4GiB -lv 4
    GGML_SCHED_EXPERT_PREFETCH=3 c13row c13a-p3 diag r2_4 --vram-budget 4GiB -lv 4
    GGML_SCHED_EXPERT_PREFETCH=2 c13row c13a-p2 diag r2_4 --vram-budget 4GiB -lv 4
    ROUNDS=2 DIAG_ROT_ROUTED=1 c13row c13a-rot diag r2_4 --vram-budget 4GiB -lv 4
    ROUNDS=2 DIAG_ROT_ROUTED=1 GGML_CUDA_DISABLE_GRAPHS=1 c13row c13a-rot-nograph diag r2_4 --vram-budget 4GiB -lv 4
    c13row c13a-base2 - r2_4 --vram-budget 4GiB -lv 4
    ROUNDS=2 GGML_SCHED_EXPERT_PREFETCH=3 c13row c13a-1-p3 diag r2_1 --vram-budget 4GiB -lv 4
    ROUNDS=2 c13row c13a-1-base - r2_1 --vram-budget 4GiB -lv 4
    c13out c13a
}
# c13b (same carry; the diag library now also has GGML_SCHED_COPY_STREAMS=2:
# the copies of routed experts alternate between two copy streams): base and
# two streams interleaved, four clients and one client.
c13b() {
    c13prep
    export SMI=0 GGML_SCHED_TIMING=1 ROUNDS=3
    c13row c13b-base - r2_4 --vram-budget 4GiB -lv 4
    GGML_SCHED_COPY_STREAMS=2 c13row c13b-s2 diag r2_4 --vram-budget 4GiB -lv 4
    GGML_SCHED_COPY_STREAMS=2 GGML_SCHED_EXPERT_PREFETCH=1 c13row c13b-s2p1 diag r2_4 --vram-budget 4GiB -lv 4
    c13row c13b-base2 - r2_4 --vram-budget 4GiB -lv 4
    GGML_SCHED_COPY_STREAMS=2 c13row c13b-s2b diag r2_4 --vram-budget 4GiB -lv 4
    ROUNDS=2 GGML_SCHED_COPY_STREAMS=2 c13row c13b-1-s2 diag r2_1 --vram-budget 4GiB -lv 4
    ROUNDS=2 c13row c13b-1-base - r2_1 --vram-budget 4GiB -lv 4
    c13out c13b
}
# c13c (same carry, final/: the committed patch 0031, prefetch and two copy
# streams on by default): main's library and the final one interleaved.
c13c() {
    c13prep
    export SMI=0 GGML_SCHED_TIMING=1 ROUNDS=3
    c13row c13c-base - r2_4 --vram-budget 4GiB -lv 4
    c13row c13c-final final r2_4 --vram-budget 4GiB -lv 4
    c13row c13c-base2 - r2_4 --vram-budget 4GiB -lv 4
    c13row c13c-final2 final r2_4 --vram-budget 4GiB -lv 4
    ROUNDS=2 c13row c13c-1-final final r2_1 --vram-budget 4GiB -lv 4
    ROUNDS=2 c13row c13c-1-base - r2_1 --vram-budget 4GiB -lv 4
    c13out c13c
}
# c13out PREFIX: this call's rows and the machine, into $OUT (a warm machine's
# results folder may hold other calls' files).
c13out() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$RES/$1-machine.txt"
    lscpu | grep -E "Model name|^CPU\(s\)" >> "$RES/$1-machine.txt"
    tar czf "$OUT/$1.tgz" -C "$RES" $(cd "$RES" && ls | grep "^$1")
}

# Session 13, share-tune (issue 16 part 3: the planner's own choice of the
# CPU/GPU split, per host). After zunstash (carry .stash), a call carrying
# .whl/share-tune: dist.tar.xz (this branch's build, scripts/device/pack.sh
# without upstream/, the source tarball and libggml-cpu, xz-compressed) and
# upbench.tar.xz (upstream's pristine llama-bench, as s12lead). Per model:
# the cost model's static share (tuning off: the "before"), the share chosen
# at run time (the "after", twice), the forced shares around it (the sweep),
# then upstream's llama-bench tg64 @ d4096 fitted in the budget
# (--fit-target: the card's free memory less the budget) and on the full
# GPU. Then R2 through the server, one client: the share chosen from the
# first steps served.
st_row() { # NAME MODEL BUDGET [EXTRA...]: bench's decode with --tg
    local name=$1 model=$2 budget=$3; shift 3
    timeout 240 $P bench -m "$W/$model.gguf" --vram-budget "$budget" --policies pipeshard -p 4096 -n 64 -r 2 -t "${ST_T:-16}" --tg \
        --profile "$RES/profile.yaml" -o "$RES/$name" "$@" > "$RES/$name.log" 2>&1 || echo "$name failed: $?"
    grep -E "TTFT|tg64|decode split|error|process VRAM" "$RES/$name.log" | sed -E "s/^.*(INFO|WARN|ERROR)[^ ]* //; s/^/$name: /" | cut -c1-400 || true
}
st_trow() { # NAME MODEL BUDGET [EXTRA...]: st_row with the scheduler's timing lines (llama.cpp's debug level)
    GGML_SCHED_TIMING=1 PIPESHARD_LOG='warn,pipeshard=info,llama.cpp=debug' st_row "$@"
}
st_lossless() { # NAME MODEL BUDGET: both modes against the full-GPU placement, 32 greedy tokens
    timeout 200 $P lossless -m "$W/$2.gguf" --vram-budget "$3" --profile "$RES/profile.yaml" -n 32 -t 16 \
        > "$RES/$1.json" 2> "$RES/$1.log" && tail -3 "$RES/$1.log"
}
st_up() { # NAME MODEL BUDGET_MIB|full: upstream's tg64 @ d4096, fitted in the budget or on the full GPU
    local name=$1 model=$2 b=$3 fit=()
    if [[ $b != full ]]; then
        local free; free=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1)
        fit=(-fitt $((free - b)) -fitc 4160)
    fi
    # Its own pristine libllama/libggml-base next to it, never dist/lib's.
    export LD_LIBRARY_PATH=$PWD/dist/upstream/bin
    smi_peak "$name" timeout 200 dist/upstream/bin/llama-bench -m "$W/$model.gguf" \
        -ngl 99 -fa 1 -t 16 -p 0 -n 64 -d 4096 -r 2 "${fit[@]}" -o md
    unset LD_LIBRARY_PATH
    grep -E "tg64" "$RES/$name.log" | sed "s/^/$name: /" || true
}
st_tar() { tar czf "$OUT/results.tgz" -C "$W" results; }
# Each part runs only while the call's time allows (ST_LIMIT s in all; a
# call is stopped at 600 s), and the results are packed after each part.
st_time() { (( SECONDS < ${ST_LIMIT:-470} - $1 )); }
# ROW NAME-on-i 1 then ROW NAME-off-i 0 for i from FIRST to LAST, each pair
# while st_time MARGIN allows, packing the results after each pair.
st_ab() { # ROW NAME FIRST LAST MARGIN
    local row=$1 name=$2 first=$3 last=$4 margin=$5 i
    for ((i = first; i <= last; i++)); do
        st_time "$margin" || break
        $row "$name-on-$i" 1
        $row "$name-off-$i" 0
        st_tar
    done
}
st_prep() {
    rm -rf dist && mkdir dist && tar -xJf .whl/share-tune/dist.tar.xz --strip-components=1 -C dist
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    mkdir -p dist/upstream/bin && tar -C dist/upstream/bin -xJf .whl/share-tune/upbench.tar.xz
    ZUPSTREAM=0 zprep > /dev/null
    cat "$RES/machine.txt"
    echo "prepared at ${SECONDS} s"
}
s13tune() {
    st_prep
    local k f
    PIPESHARD_SPLIT_TUNE=0 st_row r2-before r2 4GiB
    st_row r2-after r2 4GiB
    for k in ${ST_K:-4 6}; do st_row r2-k$k r2 4GiB --hybrid-experts $k; done
    st_row r2-after2 r2 4GiB
    echo "r2 done at ${SECONDS} s"; st_tar
    PIPESHARD_SPLIT_TUNE=0 st_row r1-before r1 2GiB
    st_row r1-after r1 2GiB
    for f in ${ST_F:-0.70 0.80}; do st_row r1-f$f r1 2GiB --dense-split $f; done
    st_row r1-after2 r1 2GiB
    echo "r1 done at ${SECONDS} s"; st_tar
    if st_time 120; then
        st_up up-fit-r2 r2 4096
        st_up up-full-r2 r2 full
        st_up up-fit-r1 r1 2048
        st_up up-full-r1 r1 full
        echo "upstream done at ${SECONDS} s"; st_tar
    fi
    if st_time 60; then
        SMI=0 bash scripts/device/server-bench.sh r2_1 st-r2-1 --vram-budget 4GiB || true
        grep -h "decode split" "$RES"/st-r2-1*.log | cut -c1-400 || true
    fi
    echo "done at ${SECONDS} s"; st_tar
}
# On an H100 host (its committed profile, chosen by zprep), fewer rows, as
# the call's time allows; R2 with the model's share forced (no tuning, no
# rebuild of the graphs) beside the tuned row.
s13tune_h100() {
    st_prep
    PIPESHARD_SPLIT_TUNE=0 st_row r2-before r2 4GiB
    st_row r2-after r2 4GiB
    st_time 30 && st_row r2-k5 r2 4GiB --hybrid-experts 5
    echo "r2 done at ${SECONDS} s"; st_tar
    st_time 30 && PIPESHARD_SPLIT_TUNE=0 st_row r1-before r1 2GiB
    st_time 30 && st_row r1-after r1 2GiB
    echo "r1 done at ${SECONDS} s"; st_tar
    st_time 40 && st_row r2-k4 r2 4GiB --hybrid-experts 4
    st_time 40 && st_row r1-f0.63 r1 2GiB --dense-split 0.63
    if st_time 30; then
        st_up up-fit-r2 r2 4096
        st_up up-fit-r1 r1 2048
    fi
    echo "done at ${SECONDS} s"; st_tar
}

# Session 13 (lead): the merged build (patches 0031 and 0032, the decode split
# tuned at run time) in one call, after zunstash (carry .stash), carrying dist/
# and .whl/lead12/upbench.tar.xz (upstream's pristine llama-bench, as in
# s12lead). Issue 16: upstream's full-GPU pp4096 before and after pipeshard's
# rows for R1 (2 GiB) and R2 (4 GiB), in budget (--tg) and with a budget larger
# than the model. Issue 14: R2 through the server at 4 GiB, four clients (four
# rounds, the first as the prompts arrive), four clients without the prefetch
# of patch 0031 (what a model with less stable routing keeps), one client (three
# rounds: the server tunes the split on the first) with and without the
# run-time split, and upstream's --cpu-moe -ngl 99 with four clients.
s13final() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    [[ -f .whl/lead12/upbench.tar.xz ]] && mkdir -p dist/upstream/bin && tar -C dist/upstream/bin -xJf .whl/lead12/upbench.tar.xz
    ZUPSTREAM=0 zprep > /dev/null
    local m budget sb=scripts/device/server-bench.sh
    for m in r1 r2; do
        budget=2GiB; [[ $m == r2 ]] && budget=4GiB
        s12lead_up "l-up-$m" $m
        parity_ps "l-$m-budget" $m $budget pipeshard --tg
        parity_ps "l-$m-big" $m 64GiB pipeshard
        s12lead_up "l-up2-$m" $m
        echo "$m done at ${SECONDS} s"
    done
    export SMI=0
    ROUNDS=4 bash $sb r2_4 l-r2-4 --vram-budget 4GiB || true
    GGML_SCHED_EXPERT_PREFETCH=0 ROUNDS=3 bash $sb r2_4 l-r2-4-nopf --vram-budget 4GiB || true
    ROUNDS=3 bash $sb r2_1 l-r2-1 --vram-budget 4GiB || true
    PIPESHARD_SPLIT_TUNE=0 ROUNDS=3 bash $sb r2_1 l-r2-1-notune --vram-budget 4GiB || true
    ROUNDS=1 bash $sb r2_4 l-r2-4-up-cpumoe --cpu-moe -ngl 99 || true
    echo "done at ${SECONDS} s"
    tar czf "$OUT/results.tgz" -C "$W" results
}

# s13diag (after zunstash; dist/ and .whl/lead13 carried): s13final's four
# clients gave 45 tok/s on the merged build against the branches' 95-102.
# The same four clients with each branch's own pipeshard-server (main's
# libraries beside them) find the branch whose merge slows them.
s13diag() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep > /dev/null
    export SMI=0
    local v sb=scripts/device/server-bench.sh
    for v in c13 r2p st; do
        mkdir -p dist/$v && ln -sfn ../lib dist/$v/lib && cp .whl/lead13/$v/pipeshard-server dist/$v/
        PIPESHARD_SERVER=dist/$v/pipeshard-server ROUNDS=2 bash $sb r2_4 g-r2-4-$v --vram-budget 4GiB || true
    done
    ROUNDS=2 bash $sb r2_4 g-r2-4-main --vram-budget 4GiB || true
    echo "done at ${SECONDS} s"
    tar czf "$OUT/results.tgz" -C "$W" results
}

# s13check (after zunstash; dist/ and .whl/lead12/upbench.tar.xz carried):
# s13diag found r2-prefill's residency order (resident weights of equal value
# spread over the layers) behind the four clients' 45 tok/s; the merged build
# without it: upstream's full-GPU pp4096 before and after pipeshard's rows for
# R1 (2 GiB) and R2 (4 GiB), then R2 through the server, four clients and one.
s13check() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    [[ -f .whl/lead12/upbench.tar.xz ]] && mkdir -p dist/upstream/bin && tar -C dist/upstream/bin -xJf .whl/lead12/upbench.tar.xz
    ZUPSTREAM=0 zprep > /dev/null
    local m budget sb=scripts/device/server-bench.sh
    for m in r1 r2; do
        budget=2GiB; [[ $m == r2 ]] && budget=4GiB
        s12lead_up "k-up-$m" $m
        parity_ps "k-$m-budget" $m $budget pipeshard --tg
        s12lead_up "k-up2-$m" $m
        echo "$m done at ${SECONDS} s"
    done
    export SMI=0
    ROUNDS=4 bash $sb r2_4 k-r2-4 --vram-budget 4GiB || true
    ROUNDS=3 bash $sb r2_1 k-r2-1 --vram-budget 4GiB || true
    echo "done at ${SECONDS} s"
    tar czf "$OUT/results.tgz" -C "$W" results
}

# s13last (after zunstash; dist/ carried, the build of s13check): issue 14's
# rows in one call: R2 through the server at 4 GiB with four clients (four
# rounds), the same without patch 0031's prefetch (the second copy stream
# only: what a model with less stable routing keeps), and upstream's
# --cpu-moe -ngl 99 with four clients.
s13last() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep > /dev/null
    export SMI=0
    local sb=scripts/device/server-bench.sh
    ROUNDS=4 bash $sb r2_4 z-r2-4 --vram-budget 4GiB || true
    GGML_SCHED_EXPERT_PREFETCH=0 ROUNDS=3 bash $sb r2_4 z-r2-4-nopf --vram-budget 4GiB || true
    ROUNDS=2 bash $sb r2_4 z-r2-4-up-cpumoe --cpu-moe -ngl 99 || true
    echo "done at ${SECONDS} s"
    tar czf "$OUT/results.tgz" -C "$W" results
}

# s14tier (after zunstash; dist/ of this build and .whl/lead12 carried): the
# decode tier (patches 0033-0034, src/launch/decode.rs) against the same
# build with PIPESHARD_DECODE_TIER=0, rows interleaved, R1 at 2 GiB and R2
# at 4 GiB, bench's decode and --tg; upstream's tg64 @ d4096 on the full GPU
# and fitted in the budget in the same call; then `pipeshard run` on R1.
s14tier() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    [[ -f .whl/lead12/upbench.tar.xz ]] && mkdir -p dist/upstream/bin && tar -C dist/upstream/bin -xJf .whl/lead12/upbench.tar.xz
    ZUPSTREAM=0 zprep > /dev/null
    cat "$RES/machine.txt"
    echo "prepared at ${SECONDS} s"
    local ST_LIMIT=560
    st_row t-r1-on r1 2GiB; st_tar
    PIPESHARD_DECODE_TIER=0 st_row t-r1-off r1 2GiB; st_tar
    st_row t-r2-on r2 4GiB; st_tar
    PIPESHARD_DECODE_TIER=0 st_row t-r2-off r2 4GiB; st_tar
    echo "pairs done at ${SECONDS} s"
    st_time 60 && { st_up t-up-r1-full r1 full; st_tar; }
    st_time 60 && { st_up t-up-r2-full r2 full; st_tar; }
    st_time 60 && { st_row t-r2-on2 r2 4GiB; st_tar; }
    st_time 60 && { st_row t-r1-on2 r1 2GiB; st_tar; }
    st_time 50 && { timeout 60 $P run -m "$W/r1.gguf" --vram-budget 2GiB --profile "$RES/profile.yaml" -c 4352 -t 16 -fa on \
        -n 48 --ignore-eos -p "$(printf 'word %.0s' $(seq 1 600))" --json > "$RES/t-run-r1.out" 2> "$RES/t-run-r1.log" \
        || echo "run failed: $?"; grep -E "decode tier|decode split|peak_device|over" "$RES/t-run-r1.log" | cut -c1-300; st_tar; }
    st_time 60 && { st_up t-up-r1-fit r1 2048; st_tar; }
    st_time 60 && { st_up t-up-r2-fit r2 4096; st_tar; }
    echo "done at ${SECONDS} s"
    st_tar
}

# s14final (after zunstash; dist/ of the final build and .whl/lead12
# carried): the decode tier as planned now (it must pay for its switch over
# the workload's tokens: R1's does at 64, R2's does not), with and without
# it; R2 with 256 generated tokens, where its tier pays; `pipeshard run` on
# R1 with a 4096-token prompt; upstream's references. ST_LIMIT as s14tier.
s14row256() { # NAME MODEL BUDGET: bench's decode of 256 tokens at depth 4096
    local name=$1 model=$2 budget=$3
    timeout 240 $P bench -m "$W/$model.gguf" --vram-budget "$budget" --policies pipeshard -p 4096 -n 256 -r 2 -t 16 \
        --profile "$RES/profile.yaml" -o "$RES/$name" > "$RES/$name.log" 2>&1 || echo "$name failed: $?"
    grep -E "TTFT|decode tier|decode split|error|process VRAM" "$RES/$name.log" | sed -E "s/^.*(INFO|WARN|ERROR)[^ ]* //; s/^/$name: /" | cut -c1-400 || true
}
s14final() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    [[ -f .whl/lead12/upbench.tar.xz ]] && mkdir -p dist/upstream/bin && tar -C dist/upstream/bin -xJf .whl/lead12/upbench.tar.xz
    ZUPSTREAM=0 zprep > /dev/null
    cat "$RES/machine.txt"
    echo "prepared at ${SECONDS} s"
    local ST_LIMIT=${ST_LIMIT:-560}
    st_up f-up-r1-full r1 full; st_tar
    st_row f-r1-on r1 2GiB; st_tar
    PIPESHARD_DECODE_TIER=0 st_row f-r1-off r1 2GiB; st_tar
    st_row f-r2 r2 4GiB; st_tar
    st_time 60 && { s14row256 f-r2-256-on r2 4GiB; st_tar; }
    st_time 60 && { PIPESHARD_DECODE_TIER=0 s14row256 f-r2-256-off r2 4GiB; st_tar; }
    st_time 60 && { st_row f-r1-on2 r1 2GiB; st_tar; }
    st_time 50 && { timeout 60 $P run -m "$W/r1.gguf" --vram-budget 2GiB --profile "$RES/profile.yaml" -c 4352 -t 16 -fa on \
        -n 64 --ignore-eos -p "$(printf 'word %.0s' $(seq 1 4000))" --json > "$RES/f-run-r1.out" 2> "$RES/f-run-r1.log" \
        || echo "run failed: $?"; grep -E "decode tier|decode split" "$RES/f-run-r1.log" | cut -c1-300
        tail -1 "$RES/f-run-r1.log" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print("run:", {k: d["stats"][k] for k in d["stats"] if "per_s" in k or k in ("ttft_ms","generated_tokens","prompt_tokens")}, "peak", d.get("peak_device_bytes"), "loaded", d.get("loaded_memory"))' || true; st_tar; }
    st_time 60 && { st_up f-up-r2-full r2 full; st_tar; }
    st_time 60 && { st_up f-up-r1-fit r1 2048; st_tar; }
    st_time 60 && { st_up f-up-r2-fit r2 4096; st_tar; }
    echo "done at ${SECONDS} s"
    st_tar
}

# s14ab (after zunstash; dist/ with dist/decode_tier_gpu, the example, and
# .whl/lead12 carried): the decode tier against no tier in one process,
# alternating blocks of 16 timed steps at depth 4096 (examples/
# decode_tier_gpu.rs), R1 at 2 GiB planned for 64 generated tokens and R2 at
# 4 GiB planned for 256 (where its tier is planned); then `pipeshard run` on
# R1 with a ~4000-token prompt.
s14ab() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep > /dev/null
    cat "$RES/machine.txt"
    echo "prepared at ${SECONDS} s"
    local m n=0 f
    for m in "r1 2GiB 64" "r2 4GiB 256" "r1 2GiB 64" "r2 4GiB 256"; do
        set -- $m
        n=$((n + 1)); f="$RES/ab-$1-$n"
        timeout 150 dist/decode_tier_gpu "$W/$1.gguf" "$2" "$RES/profile.yaml" 8 "$3" > "$f.jsonl" 2> "$f.log" \
            || { echo "ab $1 failed: $?"; grep -v "^\s*$" "$f.log" | tail -3 | cut -c1-300; }
        tail -1 "$f.jsonl" || true
        st_tar
    done
    timeout 90 $P run -m "$W/r1.gguf" --vram-budget 2GiB --profile "$RES/profile.yaml" -c 4352 -t 16 -fa on \
        -n 64 --ignore-eos -p "$(printf 'word %.0s' $(seq 1 2000))" --json > "$RES/ab-run-r1.out" 2> "$RES/ab-run-r1.log" \
        || echo "run failed: $?"
    grep -E "decode tier|decode split|^error" "$RES/ab-run-r1.log" | cut -c1-300
    tail -1 "$RES/ab-run-r1.log" | cut -c1-2000
    echo "done at ${SECONDS} s"
    st_tar
}

# s14leak (after zunstash; dist/ with dist/decode_tier_gpu): where the
# device memory that grows with each enter/leave of the decode tier goes:
# R1 as in s14ab, with llama.cpp's own buffers beside the process's, then
# the same with ggml-cuda's CUDA graphs off.
s14leak() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep > /dev/null
    local f
    for f in leak-graphs leak-nographs; do
        if [[ $f == leak-nographs ]]; then export GGML_CUDA_DISABLE_GRAPHS=1; fi
        timeout 150 dist/decode_tier_gpu "$W/r1.gguf" 2GiB "$RES/profile.yaml" 8 64 > "$RES/$f.jsonl" 2> "$RES/$f.log" || echo "$f failed: $?"
        python3 -c "
import json
for l in open('$RES/$f.jsonl'):
    d=json.loads(l)
    if 'round' in d: print('$f', d['round'], d['tier'], round(d['step_ms'],2), d['units'], d['process_bytes']>>20, d['llama_bytes']>>20)
    elif 'summary' in d: print('$f', {k: d[k] for k in ('on_ms','off_ms','peak_bytes','over_budget')})
"
    done
    unset GGML_CUDA_DISABLE_GRAPHS
    st_tar
}

# s14build (fresh machine; dist/ of this build with its llama.cpp source and
# dist/decode_tier_gpu carried): build the CUDA and CPU modules with patch
# 0035, send them back in parts ($OUT, for .stash/cudalib), then s14leak's
# R1 alternation with the new module (the process's memory must stay flat)
# and R2's.
s14build() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$RES/machine.txt"
    ( time JOBS=16 bash dist/build-cuda.sh dist 90 --native-cpu ) > "$RES/build-cuda.log" 2>&1 \
        || { tail -30 "$RES/build-cuda.log"; exit 1; }
    tail -3 "$RES/build-cuda.log"
    zsave_modules
    echo "built at ${SECONDS} s"
    ZUPSTREAM=0 zprep > /dev/null
    local m n=0 f
    for m in "r1 2GiB 64" "r2 4GiB 256"; do
        set -- $m
        n=$((n + 1)); f="$RES/ab35-$1-$n"
        timeout 120 dist/decode_tier_gpu "$W/$1.gguf" "$2" "$RES/profile.yaml" 8 "$3" > "$f.jsonl" 2> "$f.log" || echo "$f failed: $?"
        python3 -c "
import json
for l in open('$f.jsonl'):
    d=json.loads(l)
    if 'round' in d: print('$1', d['round'], d['tier'], round(d['step_ms'],2), round(d['switch_ms'],1), d['units'], d['process_bytes']>>20, d['llama_bytes']>>20)
    elif 'summary' in d: print('$1', {k: d[k] for k in ('on_ms','off_ms','speedup','peak_bytes','over_budget')})
" || true
    done
    echo "done at ${SECONDS} s"
    st_tar
}

# s14last (after zunstash of patch 0035's modules; dist/ of the final
# build and .whl/lead12 carried): the session's reference rows on the final
# build. Upstream's tg64 @ d4096 on the full GPU and fitted in the budget;
# R1 at 2 GiB with and without the decode tier (interleaved), R2 at 4 GiB
# (its tier does not pay for 64 tokens, so none is planned), issue 14's
# server rows (patch 0035 changes what the server's tuner and its image path
# free), and `pipeshard run` on R1. s14last_h100: the same budget rows and
# the in-process A/B on an H100 host.
s14last() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    [[ -f .whl/lead12/upbench.tar.xz ]] && mkdir -p dist/upstream/bin && tar -C dist/upstream/bin -xJf .whl/lead12/upbench.tar.xz
    ZUPSTREAM=0 zprep > /dev/null
    cat "$RES/machine.txt"
    echo "prepared at ${SECONDS} s"
    local ST_LIMIT=${ST_LIMIT:-570} sb=scripts/device/server-bench.sh
    st_up l-up-r1-full r1 full; st_tar
    st_row l-r1-on r1 2GiB; st_tar
    PIPESHARD_DECODE_TIER=0 st_row l-r1-off r1 2GiB; st_tar
    st_row l-r1-on2 r1 2GiB; st_tar
    st_row l-r2 r2 4GiB; st_tar
    echo "rows done at ${SECONDS} s"
    export SMI=0
    st_time 150 && { ROUNDS=3 bash $sb r2_4 l-r2-4 --vram-budget 4GiB || true; st_tar; }
    st_time 110 && { ROUNDS=2 bash $sb r2_1 l-r2-1 --vram-budget 4GiB || true; st_tar; }
    st_time 50 && { st_up l-up-r2-full r2 full; st_tar; }
    st_time 50 && { st_up l-up-r1-fit r1 2048; st_tar; }
    st_time 50 && { st_up l-up-r2-fit r2 4096; st_tar; }
    st_time 40 && { timeout 60 $P run -m "$W/r1.gguf" --vram-budget 2GiB --profile "$RES/profile.yaml" -c 4352 -t 16 -fa on \
        -n 64 --ignore-eos -p "$(printf 'word %.0s' $(seq 1 2000))" --json > "$RES/l-run-r1.out" 2> "$RES/l-run-r1.log" \
        || echo "run failed: $?"; grep -E "decode tier|decode split|^error" "$RES/l-run-r1.log" | cut -c1-300; st_tar; }
    echo "done at ${SECONDS} s"
    st_tar
}
s14last_h100() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep > /dev/null
    cat "$RES/machine.txt"
    echo "prepared at ${SECONDS} s"
    local ST_LIMIT=${ST_LIMIT:-400} m n=0 f
    st_row h-r1-on r1 2GiB; st_tar
    PIPESHARD_DECODE_TIER=0 st_row h-r1-off r1 2GiB; st_tar
    st_row h-r2 r2 4GiB; st_tar
    for m in "r1 2GiB 64" "r2 4GiB 256"; do
        set -- $m
        n=$((n + 1)); f="$RES/h-ab-$1-$n"
        st_time 60 || break
        timeout 120 dist/decode_tier_gpu "$W/$1.gguf" "$2" "$RES/profile.yaml" 8 "$3" > "$f.jsonl" 2> "$f.log" || echo "$f failed: $?"
        tail -1 "$f.jsonl" || true
    done
    echo "done at ${SECONDS} s"
    st_tar
}

# s14h100b (the warm H100 of s14last_h100): R1's rows again, interleaved
# twice, since its first pair disagreed between bench's decode and --tg.
s14h100b() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep > /dev/null
    PIPESHARD_DECODE_TIER=0 st_row h2-r1-off r1 2GiB; st_tar
    st_row h2-r1-on r1 2GiB; st_tar
    PIPESHARD_DECODE_TIER=0 st_row h2-r1-off2 r1 2GiB; st_tar
    st_row h2-r1-on2 r1 2GiB; st_tar
    echo "done at ${SECONDS} s"
}

# s14exact (after zunstash; dist/ of the final build carried): --exact with
# the decode tier is still token for token the full-GPU result: `run` on R1
# with no budget and with --exact at 2 GiB (the tier entered after the
# prompt), the same greedy text; then `lossless` on R1 at 2 GiB.
s14exact() {
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep > /dev/null
    cat "$RES/machine.txt"
    local prompt; prompt="$(printf 'word %.0s' $(seq 1 2000))"
    timeout 90 $P run -m "$W/r1.gguf" -c 4352 -t 16 -fa on -n 48 --ignore-eos -p "$prompt" \
        > "$RES/x-full.txt" 2> "$RES/x-full.log" || echo "full failed: $?"
    timeout 90 $P run -m "$W/r1.gguf" --vram-budget 2GiB --exact --profile "$RES/profile.yaml" -c 4352 -t 16 -fa on \
        -n 48 --ignore-eos -p "$prompt" > "$RES/x-exact.txt" 2> "$RES/x-exact.log" || echo "exact failed: $?"
    grep -E "decode tier|^(prompt|decode):" "$RES/x-full.log" "$RES/x-exact.log" | sed -E 's/\x1b\[[0-9;]*m//g' | cut -c1-250
    if cmp -s "$RES/x-full.txt" "$RES/x-exact.txt"; then echo "exact == full GPU ($(wc -c < "$RES/x-full.txt") bytes)"; else echo "exact DIFFERS from full GPU"; fi
    timeout 150 $P lossless -m "$W/r1.gguf" --vram-budget 2GiB --profile "$RES/profile.yaml" > "$RES/x-lossless.log" 2>&1 || echo "lossless failed: $?"
    grep -v "^\s*$" "$RES/x-lossless.log" | sed -E 's/\x1b\[[0-9;]*m//g' | grep -v " INFO " | tail -12 | cut -c1-250
    echo "done at ${SECONDS} s"
    st_tar
}


# Session 15, issue 16 part 3 (R2's decode at 4 GiB): where a step's time
# goes. After zunstash (carry .stash), carrying dist and .whl/lead12.
s15prep() {
    [[ -f /root/cudalib/libggml-cuda.so ]] || zunstash > /dev/null
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    [[ -f .whl/lead12/upbench.tar.xz ]] && mkdir -p dist/upstream/bin && tar -C dist/upstream/bin -xJf .whl/lead12/upbench.tar.xz
    ZUPSTREAM=0 zprep > /dev/null
    cat "$RES/machine.txt"
    echo "prepared at ${SECONDS} s"
}
s15trace() { # NAME MODEL BUDGET TOKENS [EXTRA...]: bench's decode under the CUPTI recorder, host calls included
    local name=$1 model=$2 budget=$3 n=$4; shift 4
    [[ -f /root/libcupti-trace.so ]] || po_trace_build || return 0
    CUDA_INJECTION64_PATH=/root/libcupti-trace.so CUPTI_TRACE_API=1 CUPTI_TRACE_OUT=$RES/$name.csv GGML_SCHED_TIMING=1 \
        timeout 200 $P bench -m "$W/$model.gguf" --vram-budget "$budget" --policies pipeshard -p 4096 -n "$n" -r 1 -t 16 \
        --profile "$RES/profile.yaml" -o "$RES/$name" "$@" > "$RES/$name.log" 2>&1 || echo "$name failed: $?"
    grep -E "TTFT|error|process VRAM|1-token graphs" "$RES/$name.log" | sed -E "s/^.*(INFO|WARN|ERROR)[^ ]* //; s/^/$name: /" | cut -c1-400 || true
    if [[ -f $RES/$name.csv ]]; then
        timeout 120 python3 scripts/device/trace-decode.py "$RES/$name.csv" "$n" > "$RES/$name.decode.txt" 2>&1 || true
        head -c 9000 "$RES/$name.decode.txt"
        xz -T8 -f "$RES/$name.csv"
    fi
}
s15memcpy() {
    g++ -O2 -std=c++17 -I/usr/local/cuda/include scripts/device/memcpy-issue.cpp -L/usr/local/cuda/lib64 -lcudart \
        -Wl,-rpath,/usr/local/cuda/lib64 -o /root/memcpy-issue && /root/memcpy-issue 640 15 | tee "$RES/memcpy-issue.txt"
}
s15diag() {
    s15prep
    if [[ -z ${S15_SKIP:-} ]]; then
        s15memcpy || true
        GGML_SCHED_TIMING=1 st_row d-r2 r2 4GiB
        grep -E "1-token graphs" "$RES/d-r2.log" | tail -3 | cut -c1-400 || true
    fi
    s15trace t-r2 r2 4GiB 32 --split-tune false
    echo "done at ${SECONDS} s"
    st_tar
}

# s15ab (carry dist with the source tarball, and .whl/lead12): the CUDA
# module with patch 0036, saved to $OUT in parts; R2 at 4 GiB with the
# expert copies batched and not, interleaved; the greedy text of both.
s15build() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$RES/machine.txt"
    rm -f dist/lib/libggml-cuda.so
    ( time JOBS=16 bash dist/build-cuda.sh dist 90 --native-cpu ) > "$RES/build-cuda.log" 2>&1 \
        || { tail -30 "$RES/build-cuda.log"; exit 1; }
    tail -3 "$RES/build-cuda.log"
    zsave_modules
    mkdir -p /root/cudalib && cp dist/lib/libggml-cuda.so dist/lib/libggml-cpu.so /root/cudalib/
    echo "built at ${SECONDS} s"
}
s15row() { # NAME BATCH [EXTRA...]: st_row on R2 at 4 GiB with the scheduler's timing, batched copies on (1) or off (0)
    local name=$1 b=$2; shift 2
    GGML_SCHED_BATCH_COPIES=$b st_trow "$name" r2 4GiB "$@"
    grep -E "1-token graphs" "$RES/$name.log" | tail -2 | sed -E "s/^.*graphs over 32: //; s/^/$name: /" | cut -c1-330 || true
}
s15text() { # NAME BATCH [EXTRA...]: R2's greedy text at 4 GiB
    local name=$1 b=$2; shift 2
    GGML_SCHED_BATCH_COPIES=$b timeout 90 $P run -m "$W/r2.gguf" --vram-budget 4GiB --profile "$RES/profile.yaml" -c 4352 \
        -t 16 -fa on -n 48 --temp 0 --ignore-eos -p "The history of the printing press begins" "$@" > "$RES/$name.out" \
        2> "$RES/$name.log" || echo "$name failed: $?"
    grep -E "decode split|^error" "$RES/$name.log" | cut -c1-300 || true
}
s15ab() {
    [[ -n ${S15_NOBUILD:-} ]] || s15build
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep > /dev/null
    echo "prepared at ${SECONDS} s"
    local i
    for i in 1 2; do
        s15row b1-$i 1
        s15row b0-$i 0
        st_tar
    done
    s15text txt-b1 1
    s15text txt-b0 0
    cmp "$RES/txt-b1.out" "$RES/txt-b0.out" && echo "greedy text: identical ($(wc -c < "$RES/txt-b1.out") bytes)"
    echo "done at ${SECONDS} s"
    st_tar
}

# s15diag2 (after zunstash of the 0036 build): R2 at 4 GiB with the
# scheduler's timing at shares 5 and 6, then CUPTI traces of both.
s15diag2() {
    s15prep
    s15row k5 1 --hybrid-experts 5
    s15row k6 1 --hybrid-experts 6
    st_tar
    s15trace t-k5 r2 4GiB 16 --hybrid-experts 5
    s15trace t-k6 r2 4GiB 16 --hybrid-experts 6
    echo "done at ${SECONDS} s"
    st_tar
}

# s15diag3 (after zunstash of the 0036 build): R2 at 4 GiB, the planner's
# choice, with and without ggml-cuda's CUDA graphs; 256 tokens with and
# without the decode tier.
s15diag3() {
    s15prep
    local i
    for i in 1 2; do
        s15row g1-$i 1
        GGML_CUDA_DISABLE_GRAPHS=1 s15row g0-$i 1
        st_tar
    done
    s14row256 n256-tier r2 4GiB
    PIPESHARD_DECODE_TIER=0 s14row256 n256-notier r2 4GiB
    echo "done at ${SECONDS} s"
    st_tar
}

# s15omp (after zunstash of the 0036 build): the CPU's part of R2's
# experts at share 5 with OpenMP's threads spinning, and with fewer threads.
s15omp() {
    s15prep
    local i
    for i in 1 2; do
        s15row o-base-$i 1 --hybrid-experts 5
        OMP_WAIT_POLICY=active s15row o-active-$i 1 --hybrid-experts 5
        ST_T=12 s15row o-t12-$i 1 --hybrid-experts 5
        st_tar
    done
    echo "done at ${SECONDS} s"
    st_tar
}

# s15p37 (after zunstash of the 0036 build; carry dist and .whl/s15): R2 at
# 4 GiB with patch 0037 (dist) and without it (dist-old: 0036's
# libggml-base), interleaved; the planner's choice, then share 6; the greedy
# text of both.
s15p37() {
    s15prep
    rm -rf dist-old && cp -a dist dist-old && cp .whl/s15/libggml-base-0036.so dist-old/lib/libggml-base.so.0.26.0
    local i
    for i in 1 2; do
        s15row n-$i 1
        P=dist-old/pipeshard s15row o-$i 1
        st_tar
    done
    s15row n-k6 1 --hybrid-experts 6
    P=dist-old/pipeshard s15row o-k6 1 --hybrid-experts 6
    s15text txt-new 1
    P=dist-old/pipeshard s15text txt-old 1
    cmp "$RES/txt-new.out" "$RES/txt-old.out" && echo "greedy text: identical ($(wc -c < "$RES/txt-new.out") bytes)"
    echo "done at ${SECONDS} s"
    st_tar
}

# s15slots (after zunstash of the 0036 build; carry dist): R2 at 4 GiB with
# patch 0037 and more stream slots (more lookahead for the link, fewer
# resident experts), at share 6 and at the planner's choice.
s15slots() {
    s15prep
    s15row s4-k6 1 --hybrid-experts 6
    s15row s6-k6 1 --hybrid-experts 6 --stream-slots 6
    s15row s8-k6 1 --hybrid-experts 6 --stream-slots 8
    st_tar
    s15row s6 1 --stream-slots 6
    s15row s4 1
    echo "done at ${SECONDS} s"
    st_tar
}

# s15trace6 (after zunstash of the 0036 build; carry dist): CUPTI traces of
# R2 at 4 GiB with patch 0037 at shares 6 and 5.
s15trace6() {
    s15prep
    s15trace t6-k6 r2 4GiB 16 --hybrid-experts 6
    s15trace t6-k5 r2 4GiB 16 --hybrid-experts 5
    echo "done at ${SECONDS} s"
    st_tar
}

# s15final (after zunstash of the 0036 build; carry dist, .whl/lead12 and
# .whl/s15): the final build (patches 0036 and 0037) against the same
# binaries as session 14 ran them (dist-old: 0036's libggml-base with the
# batched copies off, i.e. neither patch), interleaved; R1 at 2 GiB; the
# greedy text at a fixed share; upstream's tg64 full GPU and fitted; the
# server's four clients on R2.
s15final() {
    s15prep
    rm -rf dist-old && cp -a dist dist-old && cp .whl/s15/libggml-base-0036.so dist-old/lib/libggml-base.so.0.26.0
    local ST_LIMIT=${ST_LIMIT:-570} i
    for i in 1 2; do
        s15row f-r2-new-$i 1
        P=dist-old/pipeshard s15row f-r2-old-$i 0
        st_tar
    done
    st_row f-r1 r1 2GiB; st_tar
    s15text f-txt-new 1 --hybrid-experts 5
    P=dist-old/pipeshard s15text f-txt-old 0 --hybrid-experts 5
    cmp "$RES/f-txt-new.out" "$RES/f-txt-old.out" && echo "greedy text at share 5: identical ($(wc -c < "$RES/f-txt-new.out") bytes)"
    echo "rows done at ${SECONDS} s"
    st_time 40 && { st_up f-up-r2-full r2 full; st_tar; }
    st_time 40 && { st_up f-up-r1-full r1 full; st_tar; }
    st_time 50 && { st_up f-up-r2-fit r2 4096; st_tar; }
    st_time 50 && { st_up f-up-r1-fit r1 2048; st_tar; }
    export SMI=0
    st_time 120 && { ROUNDS=2 bash scripts/device/server-bench.sh r2_4 f-srv-r2-4 --vram-budget 4GiB || true; st_tar; }
    echo "done at ${SECONDS} s"
    st_tar
}

# s15rebuild (carry dist with the source tarball): the CUDA module with the
# final patch 0036 (a failed batch falls back to single copies), saved to
# $OUT in parts; one R2 row and the greedy text with and without batches.
s15rebuild() {
    s15build
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep > /dev/null
    echo "prepared at ${SECONDS} s"
    s15row r-r2 1
    s15text r-txt-b1 1 --hybrid-experts 5
    s15text r-txt-b0 0 --hybrid-experts 5
    cmp "$RES/r-txt-b1.out" "$RES/r-txt-b0.out" && echo "greedy text at share 5: identical ($(wc -c < "$RES/r-txt-b1.out") bytes)"
    echo "done at ${SECONDS} s"
    st_tar
}

# s15half (after zunstash; carry dist): R2 at 4 GiB with the half-step
# share in the run-time tuner (every other hybrid layer one expert more).
# That build was not merged: its diff is in
# bench/results/session15/c12-half-h200/half-step-not-merged.diff.
s15half() {
    s15prep
    local i
    for i in 1 2 3; do s15row h-r2-$i 1; st_tar; done
    echo "done at ${SECONDS} s"
    st_tar
}

# s15srv (after zunstash; carry dist): R2's four clients through the server
# at 4 GiB (three rounds), then upstream's own MoE placement (--cpu-moe -ngl
# 99, no budget) in the same server, on one host.
s15srv() {
    s15prep
    export SMI=0
    ROUNDS=3 bash scripts/device/server-bench.sh r2_4 v-r2-4 --vram-budget 4GiB || true
    st_tar
    ROUNDS=2 bash scripts/device/server-bench.sh r2_4 v-r2-4-up-cpumoe --cpu-moe -ngl 99 || true
    echo "done at ${SECONDS} s"
    st_tar
}

# s15check (after zunstash; carry dist): the review's build of patches 0036
# and 0037 (the batch held by the caller, one prefetch loop): R2 rows and
# the greedy text with batches on and off.
s15check() {
    s15prep
    s15row k-r2-1 1
    s15row k-r2-2 1
    s15text k-txt-b1 1 --hybrid-experts 5
    s15text k-txt-b0 0 --hybrid-experts 5
    cmp "$RES/k-txt-b1.out" "$RES/k-txt-b0.out" && echo "greedy text at share 5: identical ($(wc -c < "$RES/k-txt-b1.out") bytes)"
    echo "done at ${SECONDS} s"
    st_tar
}

# Session 16, issue 16 part 3 (R2's decode at 4 GiB): the CPU's share of a
# layer. s16build (carry dist with both source tarballs and cpu-experts):
# the CUDA and native CPU modules and upstream's pristine llama-bench, saved
# to $OUT (modules in parts, upbench.tar.xz); then the CPU's expert graph
# alone (scripts/device/cpu-experts.c) at 16 and 8 threads, and R2 at 4 GiB
# with the scheduler's timing at the planner's choice.
s16micro() { # NAME THREADS GAP_US
    timeout 120 dist/cpu-experts dist/lib/libggml-cpu.so "$2" "${S16_ITERS:-300}" "$3" > "$RES/$1.txt" 2>&1 || echo "$1 failed: $?"
    cat "$RES/$1.txt"
}
s16build() {
    ZUPSTREAM=1 zprep
    zsave_modules
    tar -C dist/upstream/bin --exclude=libggml-cuda.so --exclude=libggml-cpu.so -cJf "$OUT/upbench.tar.xz" .
    mkdir -p /root/cudalib && cp dist/lib/libggml-cuda.so dist/lib/libggml-cpu.so /root/cudalib/
    echo "built at ${SECONDS} s"
    s16micro m-t16-g150 16 150
    s16micro m-t8-g150 8 150
    s16micro m-t16-g0 16 0
    st_tar
    st_time 100 && s15row b-r2 1
    echo "done at ${SECONDS} s"
    st_tar
}

# s16d2h (no carry): what reading a layer's router results back costs the
# host, copy by copy against one kernel (scripts/device/d2h-latency.cu).
s16d2h() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$RES/machine.txt"
    PATH=$PATH:/usr/local/cuda/bin nvcc -O2 -std=c++17 -arch=sm_90 scripts/device/d2h-latency.cu -o /root/d2h-latency \
        && /root/d2h-latency 2000 | tee "$RES/d2h-latency.txt"
    st_tar
}

# s16ab (carry .stash and .whl/s16: dist.tar.xz, this branch's build
# without upstream/, the source tarball, the server and the CPU module;
# upbench.tar.xz from s16build): R2 at 4 GiB with patch 0038's batched reads
# on and off (GGML_SCHED_BATCH_READS=0), interleaved, at the planner's choice
# and at 5 and 6 GPU experts; the greedy text of both; upstream's tg64.
s16prep_dist() {
    mkdir -p dist && tar -xJf .whl/s16/dist.tar.xz -C dist
    cp scripts/device/build-upstream-bench.sh dist/
}
s16prep() {
    [[ -x dist/pipeshard ]] || s16prep_dist
    [[ -f /root/cudalib/libggml-cuda.so ]] || zunstash > /dev/null
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    [[ -x dist/upstream/bin/llama-bench ]] || { mkdir -p dist/upstream/bin && tar -C dist/upstream/bin -xJf .whl/s16/upbench.tar.xz; }
    ZUPSTREAM=0 zprep > /dev/null
    cat "$RES/machine.txt"
    echo "prepared at ${SECONDS} s"
}
s16row() { # NAME READS [EXTRA...]: s15row with patch 0038's batched reads on (1) or off (0)
    local name=$1 r=$2; shift 2
    GGML_SCHED_BATCH_READS=$r s15row "$name" 1 "$@"
}
s16ab() {
    s16prep
    local ST_LIMIT=${ST_LIMIT:-560} i k
    st_ab s16row a 1 3 0
    for k in 5 6; do
        for i in 1 2; do
            s16row k$k-on-$i 1 --hybrid-experts $k
            s16row k$k-off-$i 0 --hybrid-experts $k
        done
        st_tar
    done
    GGML_SCHED_BATCH_READS=1 s15text txt-on 1 --hybrid-experts 5
    GGML_SCHED_BATCH_READS=0 s15text txt-off 1 --hybrid-experts 5
    cmp "$RES/txt-on.out" "$RES/txt-off.out" && echo "greedy text at share 5: identical ($(wc -c < "$RES/txt-on.out") bytes)"
    echo "rows done at ${SECONDS} s"
    st_time 40 && { st_up up-r2-full r2 full; st_tar; }
    st_time 50 && { st_up up-r2-fit r2 4096; st_tar; }
    echo "done at ${SECONDS} s"
    st_tar
}

# s16final (carry .stash and .whl/s16, which also holds pristine.tar.gz,
# pack.sh's upstream source): upstream's pristine llama-bench built here
# (16 jobs), then on one host R2 at 4 GiB with patch 0038's batched reads on
# and off, interleaved, at the planner's choice; R1 at 2 GiB; upstream's
# tg64 @ d4096 on the full GPU and fitted in each budget; more R2 pairs
# while the call's time allows.
s16final() {
    mkdir -p dist/upstream && cp .whl/s16/pristine.tar.gz dist/upstream/llama.cpp-pristine.tar.gz
    s16prep_dist
    ( time JOBS=16 bash scripts/device/build-upstream-bench.sh dist ) > "$RES/build-upstream.log" 2>&1 \
        || { tail -20 "$RES/build-upstream.log"; exit 1; }
    tail -3 "$RES/build-upstream.log"
    s16prep
    local ST_LIMIT=${ST_LIMIT:-570}
    export ST_LIMIT
    st_ab s16row f-r2 1 3 0
    st_row f-r1 r1 2GiB; st_tar
    st_up f-up-r2-full r2 full; st_tar
    st_up f-up-r1-full r1 full; st_tar
    st_up f-up-r2-fit r2 4096; st_tar
    st_up f-up-r1-fit r1 2048; st_tar
    st_ab s16row f-r2 4 6 40
    echo "done at ${SECONDS} s"
    st_tar
}

# s16h100 (carry as s16final, on an H100 host): s16final's rows in 330 s.
s16h100() {
    ST_LIMIT=330 s16final
}
# s16bind (carry as s16ab): R2 at 4 GiB with OpenMP's threads bound to cores
# (OMP_PROC_BIND=close OMP_PLACES=cores) and not, interleaved.
s16bind() {
    s16prep
    local i
    for i in 1 2 3; do
        OMP_PROC_BIND=close OMP_PLACES=cores s16row b-bind-$i 1
        s16row b-free-$i 1
        st_tar
    done
    echo "done at ${SECONDS} s"
    st_tar
}

# s16srv (carry .stash and .whl/s16, whose dist.tar.xz then holds the
# server too): R2's four clients through pipeshard-server at 4 GiB (two
# rounds after the first), patch 0038's batched reads on, then off.
s16srv() {
    s16prep
    export SMI=0
    ROUNDS=3 bash scripts/device/server-bench.sh r2_4 v-r2-4-on --vram-budget 4GiB || true
    st_tar
    GGML_SCHED_BATCH_READS=0 ROUNDS=3 bash scripts/device/server-bench.sh r2_4 v-r2-4-off --vram-budget 4GiB || true
    echo "done at ${SECONDS} s"
    st_tar
}

# s16streams (carry as s16ab): R2 at 4 GiB with the routed experts' copies
# on one copy stream (GGML_SCHED_COPY_STREAMS=1) and on two (the default),
# interleaved: with batched copies (patch 0036), is the second stream still
# worth its extra batch call at each prefetch?
s16streams() {
    s16prep
    local i
    for i in 1 2 3 4; do
        GGML_SCHED_COPY_STREAMS=1 s16row s1-$i 1
        s16row s2-$i 1
        st_tar
    done
    echo "done at ${SECONDS} s"
    st_tar
}


# s17micro (carry .whl/s17micro: micro.tar.xz = cpu-experts, libggml, libggml-base
# and the stashed CPU module): the CPU's share of a hybrid MoE layer with the
# experts in a plain host buffer (as patch 0006 computes them) against the CPU
# module's repacking buffer type (Q4_0 interleaved 8x8), alone and beside
# pinned host-to-device copies (scripts/device/h2d-load.py) as the link's.
s17micro() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$RES/machine.txt"
    lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|MHz" | tee -a "$RES/machine.txt"
    mkdir -p /root/m && tar -xJf .whl/s17micro/micro.tar.xz -C /root/m && xz -df /root/m/libggml-cpu.so.xz
    local t g m
    for t in 16 8; do
        for m in plain repack; do
            g=150; S16_ITERS=300 s17m "m-t$t-$m" $t $g $m
        done
    done
    python3 scripts/device/h2d-load.py 20 > "$RES/h2d.txt" 2>&1 &
    sleep 3
    for m in plain repack plain repack; do
        s17m "m-t16-$m-h2d" 16 150 $m
    done
    wait
    cat "$RES/h2d.txt"
    st_tar
}
s17m() { # NAME THREADS GAP_US plain|repack
    timeout 120 /root/m/cpu-experts /root/m/libggml-cpu.so "$2" "${S16_ITERS:-300}" "$3" "$4" > "$RES/$1.txt" 2>&1 || echo "$1 failed: $?"
    echo "== $1"; grep -E "^(moe|mmid)|experts in" "$RES/$1.txt"
}


# s17ab (carry .stash and .whl/s17: dist.tar.xz, this branch's build without
# upstream/, the source tarball and the CPU module; pristine.tar.gz, the
# sdist's llama.cpp for upstream's llama-bench): R2 at 4 GiB with patch
# 0039's repacked CPU copies of the expert weights on and off
# (PIPESHARD_CPU_COPIES), interleaved, at the planner's and tuner's choice,
# then at forced shares with the copies.
s17prep() { # [WHL]: dist/ from WHL/dist.tar.xz and WHL/pristine.tar.gz (default .whl/s17)
    local whl=${1:-.whl/s17}
    if [[ ! -x dist/pipeshard ]]; then
        mkdir -p dist/upstream && tar -xJf "$whl/dist.tar.xz" -C dist
        cp "$whl/pristine.tar.gz" dist/upstream/llama.cpp-pristine.tar.gz
        cp scripts/device/build-upstream-bench.sh dist/
    fi
    [[ -f /root/cudalib/libggml-cuda.so ]] || zunstash > /dev/null
    cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    ZUPSTREAM=0 zprep > /dev/null
    cat "$RES/machine.txt"
    echo "prepared at ${SECONDS} s"
}
s17row() { # NAME COPIES [EXTRA...]: s15row (batched copies on) with patch 0039's CPU copies on (1) or off (0)
    local name=$1 c=$2; shift 2
    PIPESHARD_CPU_COPIES=$c s15row "$name" 1 "$@"
    grep -E "make_cpu_weight_copies" "$RES/$name.log" | head -1 | sed -E "s/^.*make_cpu_weight_copies: /$name: /" || true
}
s17ab() {
    s17prep
    local ST_LIMIT=${ST_LIMIT:-570} k
    export ST_LIMIT
    st_ab s17row a 1 3 80
    for k in 4 5 6; do
        st_time 40 || break
        s17row k$k-on 1 --hybrid-experts $k
        st_tar
    done
    echo "done at ${SECONDS} s"
    st_tar
}


# s17env (carry .stash, .whl/s17 and .whl/s17micro): the CPU's part of R2's
# decode in situ against alone. The micro benchmark first (patch 0039's
# repacked experts and the plain ones, 16 threads), then R2 at 4 GiB with
# the copies under OpenMP's wait policies and with 15 threads.
s17env() {
    s17prep
    mkdir -p /root/m && tar -xJf .whl/s17micro/micro.tar.xz -C /root/m && xz -df /root/m/libggml-cpu.so.xz
    S16_ITERS=300 s17m m-t16-repack 16 150 repack
    S16_ITERS=300 s17m m-t16-plain 16 150 plain
    local ST_LIMIT=${ST_LIMIT:-570} i
    export ST_LIMIT
    for i in 1 2; do
        st_time 60 || break
        s17row e-on-$i 1
        OMP_WAIT_POLICY=active s17row e-active-$i 1
        ST_T=15 s17row e-t15-$i 1
        OMP_WAIT_POLICY=passive s17row e-passive-$i 1
        s17row e-off-$i 0
        st_tar
    done
    echo "done at ${SECONDS} s"
    st_tar
}


# s17thp (carry .stash, .whl/s17 and .whl/s17micro, whose
# libllama-nothp.so.xz is patch 0039 before it asked for huge pages): the
# kernel's transparent huge pages setting; the micro benchmark with the
# experts in 4 KiB pages and in huge pages (madvise); R2 at 4 GiB with
# the copies in huge pages (dist/) and in 4 KiB pages (dist-b/, the same
# build with the earlier libllama), and without copies, interleaved.
s17thp() {
    s17prep
    grep -H . /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag | tee -a "$RES/machine.txt"
    rm -rf dist-b && cp -a dist dist-b
    xz -dc .whl/s17micro/libllama-nothp.so.xz > dist-b/lib/libllama.so.0.6.0
    mkdir -p /root/m && tar -xJf .whl/s17micro/micro.tar.xz -C /root/m && xz -df /root/m/libggml-cpu.so.xz
    local m
    for m in repack repack-thp plain plain-thp; do
        S16_ITERS=300 s17m m-t16-$m 16 150 $m
    done
    local ST_LIMIT=${ST_LIMIT:-570} i
    export ST_LIMIT
    for i in 1 2 3; do
        st_time 70 || break
        ( sleep 20; grep -E "AnonHugePages" /proc/meminfo | sed "s/^/during t-thp-$i: /" ) &
        s17row t-thp-$i 1
        wait
        P=dist-b/pipeshard s17row t-4k-$i 1
        s17row t-off-$i 0
        st_tar
    done
    echo "done at ${SECONDS} s"
    st_tar
}


# s17dma (carry .stash, .whl/s17 and .whl/s17micro): the CPU's part of a
# hybrid layer alone and beside the link's traffic without a spinning core
# (scripts/device/h2d-load.cu waits blocking), at 16 and 15 threads; R2 at
# 4 GiB with the copies, the memory sampler at its 20 ms and at 1 s, and
# with OpenMP's active wait.
s17dma() {
    s17prep
    PATH=$PATH:/usr/local/cuda/bin nvcc -O2 scripts/device/h2d-load.cu -o /root/h2d-load
    mkdir -p /root/m && tar -xJf .whl/s17micro/micro.tar.xz -C /root/m && xz -df /root/m/libggml-cpu.so.xz
    local t
    for t in 16 15; do
        S16_ITERS=300 s17m m-t$t-repack $t 150 repack
        /root/h2d-load 12 > "$RES/h2d-t$t.txt" &
        sleep 1
        S16_ITERS=300 s17m m-t$t-repack-dma $t 150 repack
        S16_ITERS=300 s17m m-t$t-plain-dma $t 150 plain
        wait
        cat "$RES/h2d-t$t.txt"
    done
    local ST_LIMIT=${ST_LIMIT:-570} i
    export ST_LIMIT
    for i in 1 2; do
        st_time 60 || break
        s17row d-on-$i 1
        PIPESHARD_MEMORY_SAMPLE_MS=1000 s17row d-s1000-$i 1
        OMP_WAIT_POLICY=active PIPESHARD_MEMORY_SAMPLE_MS=1000 s17row d-active-$i 1
        st_tar
    done
    echo "done at ${SECONDS} s"
    st_tar
}


# s17fa and s17fb (carry .stash and .whl/s17; run on the H200, back to back):
# the session's figures beside upstream's on one host. s17fa builds
# upstream's llama-bench from the pristine sdist, then R2 at 4 GiB with
# patch 0039's copies on and off, interleaved, and upstream's R2 rows.
# s17fb: R1 at 2 GiB with the copies on and off, both against the full-GPU
# placement (`lossless`, 32 tokens), and upstream's R1 rows.
s17upstream() {
    [[ -x dist/upstream/bin/llama-bench ]] && return
    ( time JOBS=16 bash scripts/device/build-upstream-bench.sh dist ) > "$RES/build-upstream.log" 2>&1 \
        || { tail -20 "$RES/build-upstream.log"; exit 1; }
    tail -3 "$RES/build-upstream.log"
    cp dist/lib/libggml-cuda.so dist/lib/libggml-cpu.so dist/upstream/bin/
}
s17fa() {
    s17prep
    s17upstream
    local ST_LIMIT=${ST_LIMIT:-575}
    export ST_LIMIT
    st_ab s17row f-r2 1 3 150
    st_up f-up-r2-fit r2 4096; st_tar
    st_up f-up-r2-full r2 full; st_tar
    echo "done at ${SECONDS} s"
    st_tar
}
s17fb() {
    s17prep
    s17upstream
    local ST_LIMIT=${ST_LIMIT:-575} i c
    export ST_LIMIT
    for i in 1 2; do
        for c in 1 0; do
            st_time 100 || break
            PIPESHARD_CPU_COPIES=$c st_trow f-r1-c$c-$i r1 2GiB
            grep -E "make_cpu_weight_copies" "$RES/f-r1-c$c-$i.log" | head -1 | sed -E "s/^.*make_cpu_weight_copies: /f-r1-c$c-$i: /" || true
        done
        st_tar
    done
    for c in 1 0; do
        st_time 90 && PIPESHARD_CPU_COPIES=$c timeout 150 $P lossless -m "$W/r1.gguf" --vram-budget 2GiB \
            --profile "$RES/profile.yaml" -n 32 -t 16 > "$RES/lossless-r1-c$c.json" 2> "$RES/lossless-r1-c$c.log" \
            && tail -2 "$RES/lossless-r1-c$c.log"
    done
    st_tar
    st_time 50 && { st_up f-up-r1-fit r1 2048; st_tar; }
    st_time 50 && { st_up f-up-r1-full r1 full; st_tar; }
    echo "done at ${SECONDS} s"
    st_tar
}


# s17bw (carry .stash, .whl/s17 and .whl/s17micro): what host memory gives
# the CPU and the link together. scripts/device/host-bw.c reads it with 16
# and 8 threads, alone and beside scripts/device/h2d-load.cu's pinned
# copies (blocking waits, no spinning core); the CPU's part of an R2 layer
# (patch 0039's repacked experts) alone and beside them; one R2 row.
s17bw() {
    s17prep
    gcc -O2 -mavx2 -fopenmp scripts/device/host-bw.c -o /root/host-bw
    PATH=$PATH:/usr/local/cuda/bin nvcc -O2 scripts/device/h2d-load.cu -o /root/h2d-load
    mkdir -p /root/m && tar -xJf .whl/s17micro/micro.tar.xz -C /root/m && xz -df /root/m/libggml-cpu.so.xz
    {
        /root/host-bw 16 8 5
        /root/host-bw 8 8 5
        /root/h2d-load 5
        /root/h2d-load 12 & sleep 1; /root/host-bw 16 8 5; /root/host-bw 8 8 5; wait
    } 2>&1 | tee "$RES/host-bw.txt"
    S16_ITERS=300 s17m m-t16-repack 16 150 repack
    /root/h2d-load 8 > "$RES/h2d-m.txt" & sleep 1
    S16_ITERS=300 s17m m-t16-repack-dma 16 150 repack
    wait; cat "$RES/h2d-m.txt"
    st_tar
    s17row b-r2-on 1
    echo "done at ${SECONDS} s"
    st_tar
}


# s17fc (carry .stash and .whl/s17, the session's final build): R2 at 4 GiB
# with the copies on and off, R1 at 2 GiB with them, and both modes of R2
# against the full-GPU placement with the copies (`lossless`, 32 tokens).
s17fc() {
    s17prep
    local ST_LIMIT=${ST_LIMIT:-575}
    export ST_LIMIT
    st_ab s17row c-r2 1 2 100
    st_time 80 && { PIPESHARD_CPU_COPIES=1 st_row c-r1-on r1 2GiB; st_tar; }
    st_time 120 && st_lossless lossless-r2 r2 4GiB
    echo "done at ${SECONDS} s"
    st_tar
}

# Session 18 (carry .stash and .whl/s18: this branch's build, packed as
# .whl/s17 was): patch 0040's expert cache. s18row runs s17row (the CPU
# copies on) with the cache on (1) or off (0); s18a checks both modes of R2
# against the full-GPU placement with the cache (`lossless`, 32 tokens),
# then runs R2 at 4 GiB with the cache on and off, interleaved.
s18prep() { s17prep .whl/s18; }
s18row() { # NAME CACHE [EXTRA...]: s17row with the expert cache on (1) or off (0)
    local name=$1 c=$2; shift 2
    GGML_SCHED_EXPERT_CACHE=$c s17row "$name" 1 "$@"
    grep -E "ggml_backend_sched_cache_place" "$RES/$name.log" | tail -1 | sed -E "s/^.*cache_place: /$name: /" || true
}
s18a() {
    s18prep
    local ST_LIMIT=${ST_LIMIT:-575}
    export ST_LIMIT
    s18row a-r2-first 1; st_tar
    st_time 150 && { st_lossless lossless-r2 r2 4GiB; st_tar; }
    st_ab s18row a-r2 1 3 90
    echo "done at ${SECONDS} s"
    st_tar
}

# s18b: the reference session of the final build on one host. R2 at 4 GiB
# and R1 at 2 GiB as the planner chooses (cache and copies on), upstream's
# llama-bench built and run beside them (fit in the budget, full GPU); the
# server with four clients (decode steps of four tokens: more experts than
# a region holds, so the routed splits stream through the slots) and one;
# R2 sampled at temperature 1 (varied tokens, less repeated routing) with
# the cache on and off.
s18run() { # NAME [EXTRA...]: `run` on R2 at 4 GiB, 64 tokens after a short prompt, into NAME.out and NAME.log
    local name=$1; shift
    timeout 120 $P run -m "$W/r2.gguf" --vram-budget 4GiB --profile "$RES/profile.yaml" -c 4352 -t 16 -fa on -n 64 \
        --ignore-eos -p "The history of the printing press begins" "$@" > "$RES/$name.out" 2> "$RES/$name.log" \
        || echo "$name failed: $?"
}
s18text() { # NAME CACHE [EXTRA...]: s18run sampled at temperature 1 (seed 7), with the cache on (1) or off (0)
    local name=$1 c=$2; shift 2
    GGML_SCHED_EXPERT_CACHE=$c GGML_SCHED_TIMING=1 PIPESHARD_LOG='warn,pipeshard=info,llama.cpp=debug' \
        s18run "$name" --temp 1 --seed 7 "$@"
    grep -E "decode split|tok/s|1-token graphs" "$RES/$name.log" | sed -E "s/^.*(INFO|DEBUG)[^ ]* //; s/^.*graphs over 32: //; s/^/$name: /" \
        | cut -c1-420 | tail -4 || true
}
s18b() {
    s18prep
    s17upstream
    local ST_LIMIT=${ST_LIMIT:-580} i sb=scripts/device/server-bench.sh
    export ST_LIMIT
    for i in 1 2 3; do st_time 60 && s18row b-r2-$i 1; done; st_tar
    st_time 60 && { st_up b-up-r2-fit r2 4096; st_tar; }
    st_time 60 && { st_up b-up-r2-full r2 full; st_tar; }
    for i in 1 2; do
        st_time 60 && st_trow b-r1-$i r1 2GiB
    done
    st_tar
    st_time 60 && { st_up b-up-r1-fit r1 2048; st_tar; }
    st_time 60 && { st_up b-up-r1-full r1 full; st_tar; }
    st_time 60 && { s18text b-t1-on 1; s18text b-t1-off 0; st_tar; }
    st_time 70 && { SMI=0 ROUNDS=2 bash $sb r2_4 b-srv-r2-4 --vram-budget 4GiB > "$RES/b-srv-r2-4.txt" 2>&1 || true;
        tail -12 "$RES/b-srv-r2-4.txt"; st_tar; }
    st_time 50 && { SMI=0 ROUNDS=2 bash $sb r2_1 b-srv-r2-1 --vram-budget 4GiB > "$RES/b-srv-r2-1.txt" 2>&1 || true;
        tail -8 "$RES/b-srv-r2-1.txt"; st_tar; }
    echo "done at ${SECONDS} s"
    st_tar
}

# s18c: the same build on another host (an H100): R2 at 4 GiB with the
# cache on and off, interleaved; R2 with --exact (GPU-only math) with the
# cache on and off; R1 at 2 GiB; both modes of R2 against the full-GPU
# placement.
s18c() {
    s18prep
    local ST_LIMIT=${ST_LIMIT:-580}
    export ST_LIMIT
    st_ab s18row c-r2 1 2 200
    st_time 120 && { s18row c-r2-exact-on 1 --exact; s18row c-r2-exact-off 0 --exact; st_tar; }
    st_time 80 && { st_trow c-r1 r1 2GiB; st_tar; }
    st_time 100 && { st_lossless lossless-r2 r2 4GiB; st_tar; }
    st_ab s18row c-r2 3 4 60
    echo "done at ${SECONDS} s"
    st_tar
}

# s18d: the reference session of the final build (the tuner times every
# expert count) on one H200 host: R2 at 4 GiB as the planner chooses, with
# the cache off between (interleaved), upstream's llama-bench beside it
# (fit in the budget, full GPU), R1 at 2 GiB and upstream's R1, both modes
# of R2 against the full-GPU placement, R2 with --exact, cache on and off.
# s18e: the same on another host (an H100), without upstream.
s18exact() {
    st_time 90 && { s18row $1-r2-exact-on 1 --exact; s18row $1-r2-exact-off 0 --exact; st_tar
        grep -hE "not the expert cache" "$RES/$1-r2-exact-on.log" | tail -1 | sed -E "s/^.*cache_layout: /$1-exact: /" || true; }
}
# The rest of a reference session, after its R2 rows: upstream's R2 rows
# (fit in the budget, full GPU), R1 at 2 GiB twice, upstream's R1 rows, and
# both modes of R2 against the full-GPU placement.
st_ups() { # PREFIX MODEL BUDGET_MIB: upstream's MODEL fitted in the budget, then on the full GPU, each while time allows
    st_time 60 && { st_up "$1-up-$2-fit" "$2" "$3"; st_tar; }
    st_time 60 && { st_up "$1-up-$2-full" "$2" full; st_tar; }
}
st_refs() { # PREFIX
    local p=$1 i
    st_ups $p r2 4096
    for i in 1 2; do
        st_time 60 && st_trow $p-r1-$i r1 2GiB
    done
    st_tar
    st_ups $p r1 2048
    st_time 80 && { st_lossless lossless-r2 r2 4GiB; st_tar; }
}
s18d() {
    s18prep
    s17upstream
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    s18row d-r2-1 1; s18row d-r2-off-1 0; s18row d-r2-2 1; s18row d-r2-off-2 0; s18row d-r2-3 1; st_tar
    st_refs d
    s18exact d
    echo "done at ${SECONDS} s"
    st_tar
}
s18e() {
    s18prep
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    st_ab s18row e-r2 1 2 200
    s18exact e
    st_time 60 && { st_trow e-r1 r1 2GiB; st_tar; }
    st_ab s18row e-r2 3 4 60
    echo "done at ${SECONDS} s"
    st_tar
}

# s18f: does the cache change any result? R2 at 4 GiB sampled at
# temperature 1 (seed 7) and greedy, with the cache on and off, each twice,
# at a forced share (5 GPU experts) and at the tuner's.
s18f() {
    s18prep
    local c i
    for i in 1 2; do
        for c in 1 0; do
            s18text f-t1-c$c-$i $c --hybrid-experts 5
            s18text f-t1-tuned-c$c-$i $c
        done
    done
    md5sum "$RES"/f-*.out
    st_tar
}

# s18g: R2's greedy text at one forced share (5 GPU experts) with the cache
# on and off. (Calls c8 and c9 also ran `lossless --hybrid-experts 5`, which
# lossless refuses: its --exact half cannot split experts.)
s18g() {
    s18prep
    local c
    for c in 1 0; do
        GGML_SCHED_EXPERT_CACHE=$c s18run g-greedy-c$c --hybrid-experts 5
    done
    md5sum "$RES"/g-*.out
    st_tar
}
# s18h: R2's greedy text at 5 GPU experts with the cache on and off, with
# ggml-cuda's fusion off, and with its CUDA graphs off: which of them makes
# the two paths' texts differ (s18g).
s18h() {
    s18prep
    local c v
    for v in GGML_CUDA_DISABLE_FUSION GGML_CUDA_DISABLE_GRAPHS; do
        for c in 1 0; do
            export "$v=1"
            GGML_SCHED_EXPERT_CACHE=$c s18run h-$v-c$c --hybrid-experts 5
            unset "$v"
        done
    done
    md5sum "$RES"/h-*.out
    st_tar
}

# s18i (not run in session 18: no device time was left): which of the two
# texts of s18g is the slots' own: R2's greedy text at 5 GPU experts with the
# cache off and patch 0031's prefetch off (every expert copied once its ids
# are known), and with batched copies off too.
s18i() {
    s18prep
    GGML_SCHED_EXPERT_CACHE=0 GGML_SCHED_EXPERT_PREFETCH=0 s18run i-nopf --hybrid-experts 5
    GGML_SCHED_EXPERT_CACHE=0 GGML_SCHED_EXPERT_PREFETCH=0 GGML_SCHED_BATCH_COPIES=0 s18run i-nopf-nobatch --hybrid-experts 5
    md5sum "$RES"/i-*.out
    st_tar
}

# Session 19 (carry .stash and .whl/s19, this branch's build packed as
# .whl/s18 was): why the texts with and without the expert cache differ
# (session 18, s18g). R2's greedy text at 5 GPU experts: with the cache on
# and off, with its directories emptied before every graph (=2: every
# expert copied, into the same regions), on the slots without patch 0031's
# prefetch, and without batched copies too; then with the cache on and off
# under GGML_SCHED_EXPERT_VERIFY=1, which checks the bytes of every expert a
# routed MUL_MAT_ID reads on the device against the expert the router chose.
s19prep() { s17prep .whl/s19; }
s19text() { # NAME [ENV=V...]: s18run's greedy text at 5 GPU experts, the checks' warnings beside it
    local name=$1; shift
    ( export "$@"; s18run "$name" --hybrid-experts 5 )
    grep -hE "verify_experts|holds other bytes" "$RES/$name.log" | sed -E "s/^.*(WARN)[^ ]* //; s/^/$name: /" | head -12 || true
}
s19texts() { # PREFIX N: s19text with the cache on, off, and on under the checks; the checks' last N counts
    s19text $1-c1 GGML_SCHED_EXPERT_CACHE=1
    s19text $1-c0 GGML_SCHED_EXPERT_CACHE=0
    s19text $1-c1-verify GGML_SCHED_EXPERT_CACHE=1 GGML_SCHED_EXPERT_VERIFY=1
    grep -hE "verify_regions.*checked" "$RES/$1-c1-verify.log" | sed -E "s/^.*(WARN)[^ ]* //" | tail -$2 || true
}
s19a() {
    s19prep
    s19text a-c1 GGML_SCHED_EXPERT_CACHE=1
    s19text a-c0 GGML_SCHED_EXPERT_CACHE=0
    s19text a-c2 GGML_SCHED_EXPERT_CACHE=2
    s19text a-nopf GGML_SCHED_EXPERT_CACHE=0 GGML_SCHED_EXPERT_PREFETCH=0
    s19text a-nopf-nobatch GGML_SCHED_EXPERT_CACHE=0 GGML_SCHED_EXPERT_PREFETCH=0 GGML_SCHED_BATCH_COPIES=0
    st_tar
    s19text a-c1-verify GGML_SCHED_EXPERT_CACHE=1 GGML_SCHED_EXPERT_VERIFY=1
    s19text a-c0-verify GGML_SCHED_EXPERT_CACHE=0 GGML_SCHED_EXPERT_VERIFY=1
    md5sum "$RES"/a-*.out
    echo "done at ${SECONDS} s"
    st_tar
}

# s19b: the cache's text again under GGML_SCHED_EXPERT_VERIFY=1, which now
# also checks every position of every directory before and after each graph,
# names the expert a wrong position holds, and logs the copies; with the
# scheduler's placement lines (GGML_SCHED_TIMING=1, llama.cpp's debug level).
s19b() {
    s19prep
    s19text b-c1-verify GGML_SCHED_EXPERT_CACHE=1 GGML_SCHED_EXPERT_VERIFY=1 GGML_SCHED_TIMING=1 \
        PIPESHARD_LOG=warn,pipeshard=info,llama.cpp=debug
    grep -hE "verify_regions" "$RES/b-c1-verify.log" | sed -E "s/^.*(WARN)[^ ]* //" | head -20 || true
    grep -hE "cache_place|cache_layout" "$RES/b-c1-verify.log" | sed -E "s/^.*(INFO|DEBUG)[^ ]* //" | sort | uniq -c | head || true
    md5sum "$RES"/b-*.out
    st_tar
}

# s19c: the fix (each region keeps the padding ggml-cuda's kernels clear
# after it). R2's greedy text at 5 GPU experts with the cache on, off, and
# on under the checks; sampled at temperature 1 with the cache on and off;
# both modes against the full-GPU placement; R2 at 4 GiB as the planner
# chooses, the cache on and off, interleaved.
s19c() {
    s19prep
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    s19texts c 2
    s18text c-t1-on 1 --hybrid-experts 5
    s18text c-t1-off 0 --hybrid-experts 5
    md5sum "$RES"/c-*.out
    st_tar
    st_time 150 && { st_lossless lossless-r2 r2 4GiB; st_tar; }
    st_ab s18row c-r2 1 3 75
    echo "done at ${SECONDS} s"
    st_tar
}

# s19d: the reference session of the final build (the padding fix, and the
# experts found placed before the misses) on one H200 host: R2's greedy text
# at 5 GPU experts with the cache on, off and on under the checks; R2 at
# 4 GiB as the planner chooses, the cache on and off, interleaved;
# upstream's llama-bench built and run beside it (fit in the budget, full
# GPU); R1 at 2 GiB and upstream's R1; both modes of R2 against the
# full-GPU placement.
s19d() {
    s19prep
    s17upstream
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    s19texts d 1
    md5sum "$RES"/d-*.out; st_tar
    s18row d-r2-1 1; s18row d-r2-off-1 0; s18row d-r2-2 1; s18row d-r2-off-2 0; s18row d-r2-3 1; st_tar
    st_refs d
    echo "done at ${SECONDS} s"
    st_tar
}

# s19e: the final build on an H100 host: R2's greedy text at 5 GPU experts
# with the cache on and off; R2 at 4 GiB as the planner chooses, the cache
# on and off, interleaved; R1 at 2 GiB.
s19e() {
    s19prep
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    s19text e-c1 GGML_SCHED_EXPERT_CACHE=1
    s19text e-c0 GGML_SCHED_EXPERT_CACHE=0
    md5sum "$RES"/e-*.out; st_tar
    s18row e-r2-1 1; s18row e-r2-off-1 0; s18row e-r2-2 1; s18row e-r2-off-2 0; st_tar
    st_time 60 && { s18row e-r2-3 1; st_tar; }
    st_time 60 && { st_trow e-r1 r1 2GiB; st_tar; }
    echo "done at ${SECONDS} s"
    st_tar
}

# s19f: the final patch (the checks' message for an id that points outside
# its region) on any host: s19texts.
s19f() {
    s19prep
    s19texts f 1
    md5sum "$RES"/f-*.out
    st_tar
}

# s19g: after the review (one function empties a directory, for a new
# placement and for GGML_SCHED_EXPERT_CACHE=2): s19texts, and the text with
# the directories emptied before every graph.
s19g() {
    s19prep
    s19texts g 1
    s19text g-c2 GGML_SCHED_EXPERT_CACHE=2
    md5sum "$RES"/g-*.out
    st_tar
}


# Session 20 (carry .stash and .whl/s19): R1's CPU part. s20a times the CPU's
# rows of a row split alone (scripts/device/dense-rows.c: patch 0017's two
# graphs per layer, and one graph per layer with a column split of down),
# alone and beside scripts/device/h2d-load.cu's pinned copies, then R1 at 2
# GiB at forced shares with the scheduler's timing, and with OpenMP's and
# the thread count's variants.
s20micro() { # the CPU module, dense-rows and h2d-load into /root/m
    mkdir -p /root/m/inc && tar -xzf dist/upstream/llama.cpp-pristine.tar.gz -C /root/m/inc --wildcards '*ggml/include/*'
    local inc; inc=$(dirname "$(find /root/m/inc -name ggml.h -path '*ggml/include/*' | head -1)")
    gcc -O2 -I"$inc" scripts/device/dense-rows.c -Ldist/lib -lggml -lggml-base -lm -Wl,-rpath,$PWD/dist/lib -o /root/m/dense-rows
    PATH=$PATH:/usr/local/cuda/bin nvcc -O2 scripts/device/h2d-load.cu -o /root/m/h2d-load
}
s20dr() { # NAME THREADS plain|repack SHARE: dense-rows, 20 tokens, 60 us between graphs
    timeout 120 /root/m/dense-rows dist/lib/libggml-cpu.so "$2" 20 60 "$3" "$4" > "$RES/$1.txt" 2> /dev/null || echo "$1 failed: $?"
    echo "== $1"; grep -E "^(rows|cols)" "$RES/$1.txt" || true
}
s20r1() { # NAME SHARE|- [EXTRA...]: R1 at 2 GiB at a forced row share (-: the tuner's), the scheduler's timing
    local name=$1 f=$2 share=(); shift 2
    [[ $f == - ]] || share=(--dense-split "$f")
    st_trow "$name" r1 2GiB "${share[@]}" "$@"
    grep -E "0-token graphs" "$RES/$name.log" | tail -2 | sed -E "s/^.*graphs over 32: //; s/;.*$//; s/^/$name: /" || true
}
s20a() {
    s19prep
    s20micro
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    s20dr m-t16-repack-42 16 repack 0.42
    s20dr m-t16-plain-42 16 plain 0.42
    s20dr m-t15-repack-42 15 repack 0.42
    s20dr m-t16-repack-100 16 repack 1.0
    /root/m/h2d-load 50 > "$RES/h2d-m.txt" & sleep 1
    s20dr m-t16-repack-42-dma 16 repack 0.42
    s20dr m-t15-repack-42-dma 15 repack 0.42
    s20dr m-t16-repack-50-dma 16 repack 0.50
    s20dr m-t16-plain-42-dma 16 plain 0.42
    wait; cat "$RES/h2d-m.txt"
    st_tar
    s20r1 a-f58 0.58
    s20r1 a-f50 0.50
    OMP_WAIT_POLICY=active s20r1 a-f58-active 0.58
    OMP_PROC_BIND=close OMP_PLACES=cores s20r1 a-f58-bind 0.58
    ST_T=15 s20r1 a-f58-t15 0.58
    st_time 40 && s20r1 a-f54 0.54
    echo "done at ${SECONDS} s"
    st_tar
}

s20prep() { s17prep .whl/s20; }
# s20c (carry .stash and .whl/s20): what slows the CPU's splits in R1's
# decode against dense-rows alone: OpenMP's spinning, the memory sampler's
# NVML queries, thread binding, 15 threads; then the best at lower shares.
s20c() {
    s20prep
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    export GOMP_SPINCOUNT=20000000
    s20r1 c-f58-spin 0.58
    PIPESHARD_MEMORY_SAMPLE_MS=1000 s20r1 c-f58-s1000 0.58
    OMP_PROC_BIND=close OMP_PLACES=cores s20r1 c-f58-bind 0.58
    ST_T=15 s20r1 c-f58-t15 0.58
    export PIPESHARD_MEMORY_SAMPLE_MS=1000 OMP_PROC_BIND=close OMP_PLACES=cores
    s20r1 c-f58-all 0.58
    s20r1 c-f54-all 0.54
    s20r1 c-f50-all 0.50
    st_time 40 && s20r1 c-f62-all 0.62
    st_time 40 && s20r1 c-tuned-all -
    echo "done at ${SECONDS} s"
    st_tar
}

# s20d (carry .stash and .whl/s20): R1's decode at 58% and 50% of the rows on
# the GPU under the CUPTI recorder (s15trace), to see why 50% waits longer;
# s20h: the same at 50% (call h, with patch 0041's first form).
s20traces() { # PREFIX SHARE...: s15trace of R1 at 2 GiB at each share (PREFIX-fNN), OpenMP spinning
    s20prep
    export GOMP_SPINCOUNT=20000000
    local p=$1 f; shift
    for f in "$@"; do s15trace "$p-f${f#0.}" r1 2GiB 16 --dense-split "$f"; done
    echo "done at ${SECONDS} s"
    st_tar
}
s20d() { s20traces t 0.58 0.50; }
s20h() { s20traces h 0.50; }

# s20e (carry .stash and .whl/s20): R1 at forced shares with 6 and 8
# streaming slots (the link's lookahead), OpenMP spinning between splits.
s20e() {
    s20prep
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT GOMP_SPINCOUNT=20000000
    s20r1 e-s6-f54 0.54 --stream-slots 6
    s20r1 e-s8-f54 0.54 --stream-slots 8
    s20r1 e-s8-f50 0.50 --stream-slots 8
    s20r1 e-s6-f58 0.58 --stream-slots 6
    s20r1 e-s4-f58 0.58
    s20r1 e-s8-f58 0.58 --stream-slots 8
    st_time 40 && s20r1 e-s6-f50 0.50 --stream-slots 6
    st_time 40 && s20r1 e-s12-f50 0.50 --stream-slots 12
    echo "done at ${SECONDS} s"
    st_tar
}

# s20f (carry .stash and .whl/s20): R1's default mode against the full GPU
# (`lossless`, 32 tokens) at 50% and 58% of the rows on the GPU, and the
# timing at 50% with the CPU's products copied synchronously.
s20f() {
    s20prep
    export GOMP_SPINCOUNT=20000000
    local f
    for f in 0.50 0.58; do
        timeout 200 $P lossless -m "$W/r1.gguf" --vram-budget 2GiB --profile "$RES/profile.yaml" -n 32 -t 16 \
            --dense-split $f > "$RES/f-lossless-$f.json" 2> "$RES/f-lossless-$f.log" || echo "lossless $f failed: $?"
        tail -3 "$RES/f-lossless-$f.log"
    done
    GGML_SCHED_SYNC_HOST_COPIES=1 s20r1 f-f50-sync 0.50
    CUDA_DEVICE_MAX_CONNECTIONS=32 s20r1 f-f50-conn 0.50
    echo "done at ${SECONDS} s"
    st_tar
}

# s20g (carry .stash and .whl/s20, patch 0041): R1 at forced shares with the
# late refill on and off (GGML_SCHED_LATE_REFILL), then the tuner's choice.
s20g() {
    s20prep
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT GOMP_SPINCOUNT=20000000
    local f
    for f in 0.50 0.54 0.58; do
        s20r1 g-f${f#0.}-late $f
        GGML_SCHED_LATE_REFILL=0 s20r1 g-f${f#0.}-now $f
    done
    s20r1 g-f46-late 0.46
    s20r1 g-tuned-late -
    st_time 40 && GGML_SCHED_LATE_REFILL=0 s20r1 g-tuned-now -
    echo "done at ${SECONDS} s"
    st_tar
}


# s20i (carry .stash and .whl/s20): what host memory gives the CPU beside
# the link when the link reads DRAM as the streamed weights do: h2d-load
# over 4 GiB of host memory against its usual 64 MiB, beside host-bw (16
# threads) and dense-rows (the CPU's rows at 42% and 50%).
s20i() {
    s20prep
    s20micro
    gcc -O2 -mavx2 -fopenmp scripts/device/host-bw.c -o /root/m/host-bw
    {
        /root/m/host-bw 16 8 4
        /root/m/h2d-load 4
        /root/m/h2d-load 4 4096
        for mib in 64 4096; do
            /root/m/h2d-load 14 $mib & sleep 3; /root/m/host-bw 16 8 4; wait
        done
    } 2>&1 | tee "$RES/i-host-bw.txt"
    s20irows
}
s20irows() { # dense-rows beside h2d-load over 64 MiB and 4 GiB of host memory
    local mib
    for mib in 64 4096; do
        /root/m/h2d-load 40 $mib > "$RES/i-h2d-$mib.txt" & sleep 3
        s20dr i-t16-repack-42-dma$mib 16 repack 0.42
        s20dr i-t16-repack-50-dma$mib 16 repack 0.50
        wait; cat "$RES/i-h2d-$mib.txt"
    done
    echo "done at ${SECONDS} s"
    st_tar
}

s20j() { s20prep; s20micro; s20irows; }
# s20k (carry .stash and .whl/s20: the final build, patch 0041 and the
# workers' spin): the reference session. Upstream's llama-bench built here;
# R2 at 4 GiB and R1 at 2 GiB twice each, then once with libgomp's default
# spin (GOMP_SPINCOUNT=300000) and once with the refill at once
# (GGML_SCHED_LATE_REFILL=0); upstream's rows, fitted and full GPU. Call k
# ran a build that set GOMP_SPINCOUNT=20000000 itself where it was unset
# (since removed): with today's build the first rows spin as the third does.
s20k() {
    s20prep
    s17upstream
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    s18row k-r2-1 1; s18row k-r2-2 1
    GOMP_SPINCOUNT=300000 s18row k-r2-nospin 1
    GGML_SCHED_LATE_REFILL=0 s18row k-r2-early 1
    st_tar
    s20r1 k-r1-1 -; s20r1 k-r1-2 -
    GOMP_SPINCOUNT=300000 s20r1 k-r1-nospin -
    GGML_SCHED_LATE_REFILL=0 s20r1 k-r1-early -
    st_tar
    st_ups k r1 2048
    st_ups k r2 4096
    echo "done at ${SECONDS} s"
    st_tar
}

# s20l (carry .stash and .whl/s20): patch 0041's refill late (1) and at
# once (0, GGML_SCHED_LATE_REFILL=0), interleaved, R2 at 4 GiB three times
# each and R1 at 2 GiB twice each, with libgomp's default spin.
s20lrow() { # NAME LATE MODEL: R2 (s18row) or R1 (s20r1, the tuner's share)
    if [[ $3 == r2 ]]; then GGML_SCHED_LATE_REFILL=$2 s18row "$1" 1; else GGML_SCHED_LATE_REFILL=$2 s20r1 "$1" -; fi
}
s20l() {
    s20prep
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT GOMP_SPINCOUNT=300000
    local i
    for i in 1 2 3; do
        st_time 90 || break
        s20lrow l-r2-late-$i 1 r2; s20lrow l-r2-now-$i 0 r2; st_tar
    done
    for i in 1 2; do
        st_time 60 || break
        s20lrow l-r1-late-$i 1 r1; s20lrow l-r1-now-$i 0 r1; st_tar
    done
    echo "done at ${SECONDS} s"
    st_tar
}

# s20m (carry .stash and .whl/s20: patch 0041 refilling before a routed or
# cached split's ids): the refill late and at once, interleaved: R2 at 4
# GiB twice each, R1 at 2 GiB at 54% and at the tuner's share.
s20m() {
    s20prep
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    local i
    for i in 1 2; do
        s20lrow m-r2-late-$i 1 r2; s20lrow m-r2-now-$i 0 r2; st_tar
    done
    s20r1 m-r1-f54-late 0.54; GGML_SCHED_LATE_REFILL=0 s20r1 m-r1-f54-now 0.54; st_tar
    st_time 50 && s20lrow m-r1-late 1 r1
    st_time 50 && s20lrow m-r1-now 0 r1
    echo "done at ${SECONDS} s"
    st_tar
}

# s20n (carry .stash and .whl/s20: the final build): the reference session
# of the final build, upstream's llama-bench built and measured in the same
# lease: R2 at 4 GiB and R1 at 2 GiB twice each, upstream fitted and on the
# full GPU.
s20n() {
    s20prep
    s17upstream
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    s18row n-r2-1 1; s20r1 n-r1-1 -; s18row n-r2-2 1; s20r1 n-r1-2 -; st_tar
    st_ups n r1 2048
    st_ups n r2 4096
    echo "done at ${SECONDS} s"
    st_tar
}

# s20o (carry .stash and .whl/s20: the final build): the same on an H100
# host, without upstream: R2 at 4 GiB twice, R1 at 2 GiB once.
s20o() {
    s20prep
    s18row o-r2-1 1; s20r1 o-r1-1 -; s18row o-r2-2 1
    echo "done at ${SECONDS} s"
    st_tar
}


# Session 21: patch 0042's 512-bit VNNI GEMV for repacked Q4_0. .whl/s21
# holds the CPU module built here from the patched tree with the hosts'
# features (AVX512, VBMI, VNNI, BF16, AVX-VNNI); the stash's is the same
# features without the patch. s21mod puts one in dist/lib.
s21mod() { # old|new
    mkdir -p /root/m
    [[ -f /root/m/cpu-old.so ]] || cp /root/cudalib/libggml-cpu.so /root/m/cpu-old.so
    [[ -f /root/m/cpu-new.so ]] || xz -dc .whl/s21/libggml-cpu.so.xz > /root/m/cpu-new.so
    cp "/root/m/cpu-$1.so" dist/lib/libggml-cpu.so
}
s21prep() { s17prep .whl/s21; } # this session's build (calls e-p)
s21drpair() { # PREFIX: the new module's rows at 42% alone (PREFIX-new-42), then beside h2d-load over 4 GiB (PREFIX-new-42-dma, h2d-PREFIX.txt)
    s21dr "$1-new-42" new 0.42
    /root/m/h2d-load 15 4096 > "$RES/h2d-$1.txt" & sleep 1
    s21dr "$1-new-42-dma" new 0.42
    wait; cat "$RES/h2d-$1.txt"
}
s21dr() { # NAME old|new SHARE: s20dr with that module (16 threads, repacked)
    timeout 120 /root/m/dense-rows "/root/m/cpu-$2.so" 16 20 60 repack "$3" > "$RES/$1.txt" 2> /dev/null || echo "$1 failed: $?"
    echo "== $1"; grep -E "^(check|rows|cols)" "$RES/$1.txt" || true
}
# s21a (carry .stash, .whl/s20 and .whl/s21): the CPU's part alone and
# beside the link with each module, then R1 at 2 GiB (the tuner's share)
# and R2 at 4 GiB with each, interleaved.
s21a() {
    s20prep
    s20micro
    s21mod new
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    s21dr a-old-42 old 0.42; s21dr a-new-42 new 0.42
    /root/m/h2d-load 30 4096 > "$RES/h2d-a.txt" & sleep 1
    s21dr a-old-42-dma old 0.42; s21dr a-new-42-dma new 0.42; s21dr a-new-30-dma new 0.30
    wait; cat "$RES/h2d-a.txt"
    st_tar
    s21mod new; s20r1 a-r1-new-1 -
    s21mod old; s20r1 a-r1-old-1 -
    s21mod new; s20r1 a-r1-new-2 -
    st_tar
    st_time 70 && { s21mod new; s18row a-r2-new-1 1; }
    st_time 70 && { s21mod old; s18row a-r2-old-1 1; }
    echo "done at ${SECONDS} s"
    st_tar
}


# s21b (carry .stash, .whl/s20 and .whl/s21: the new module reading the
# prefetch distance in blocks from GGML_Q4_PF, an experiment that this
# tree no longer builds; patch 0042 prefetches 32 blocks ahead): host memory
# alone, then dense-rows with the new module at each distance, alone and
# beside the link, and R1 at 2 GiB with and without a prefetch.
s21pf() { # NAME PF [THREADS]: dense-rows with the new module, 42%, at that prefetch distance
    GGML_Q4_PF=$2 timeout 120 /root/m/dense-rows /root/m/cpu-new.so "${3:-16}" 20 60 repack 0.42 > "$RES/$1.txt" 2> /dev/null || echo "$1 failed: $?"
    echo "== $1"; grep -E "^(check|rows|cols)" "$RES/$1.txt" || true
}
s21b() {
    s20prep
    s20micro
    gcc -O2 -mavx2 -fopenmp scripts/device/host-bw.c -o /root/m/host-bw
    s21mod new
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    /root/m/host-bw 16 8 4 | tee "$RES/b-host-bw.txt"
    local pf
    for pf in 0 16 32 64; do s21pf b-pf$pf $pf; done
    s21pf b-pf32-t8 32 8
    /root/m/h2d-load 45 4096 > "$RES/h2d-b.txt" & sleep 1
    for pf in 0 16 32 64; do s21pf b-pf$pf-dma $pf; done
    wait; cat "$RES/h2d-b.txt"
    st_tar
    GGML_Q4_PF=32 s20r1 b-r1-pf32-1 -
    GGML_Q4_PF=0 s20r1 b-r1-pf0-1 -
    GGML_Q4_PF=32 s20r1 b-r1-pf32-2 -
    st_time 70 && GGML_Q4_PF=32 s20r1 b-r1-pf32-f50 0.50
    echo "done at ${SECONDS} s"
    st_tar
}


# s21c (carry .stash, .whl/s20 and .whl/s21: the final new module): the
# host's NUMA and SMT layout and huge-page setting, then R1 at 2 GiB at a
# forced 53% with the new module under thread and OpenMP variants (what
# keeps the CPU's part at ~47 GB/s in the step against ~62 beside the link
# alone).
s21c() {
    s20prep
    s21mod new
    { lscpu | grep -iE "numa|socket|core|thread|mhz|cache"; lscpu -e; cat /sys/kernel/mm/transparent_hugepage/enabled; } > "$RES/c-cpu.txt" 2>&1 || true
    grep -iE "numa node|socket|per core" "$RES/c-cpu.txt" || true
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    s20r1 c-f53 0.53
    ST_T=15 s20r1 c-f53-t15 0.53
    OMP_WAIT_POLICY=active s20r1 c-f53-active 0.53
    PIPESHARD_MEMORY_SAMPLE_MS=60000 s20r1 c-f53-nosampler 0.53
    st_tar
    st_time 60 && ST_T=14 s20r1 c-f53-t14 0.53
    st_time 60 && ST_T=8 s20r1 c-f53-t8 0.53
    st_time 60 && s20r1 c-f53-2 0.53
    echo "done at ${SECONDS} s"
    st_tar
}


# s21d (as s21c): R1 at 2 GiB at forced shares below the tuner's reach
# (its climb from the cost model's 73% stops after 5 probes, at 53%), with
# the new module and the old.
s21d() {
    s20prep
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    s21mod new; s20r1 d-new-f48 0.48
    s21mod new; s20r1 d-new-f43 0.43
    s21mod old; s20r1 d-old-f48 0.48
    st_tar
    st_time 60 && { s21mod new; s20r1 d-new-f48-2 0.48; }
    st_time 60 && { s21mod old; s20r1 d-old-f53 0.53; }
    st_time 60 && { s21mod new; s20r1 d-new-f45 0.45; }
    echo "done at ${SECONDS} s"
    st_tar
}


# s21e (carry .stash and .whl/s21: this session's build, with the row
# climb of 10 probes and half steps, and the new module reading a prefetch
# distance in blocks from GGML_Q4_PF, the experiment of s21b): R1 at 2 GiB at the
# tuner's share with the new module and no prefetch, 16 or 32 blocks ahead,
# interleaved, then with the old module.
s21e() {
    s21prep
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    local i pf
    s21mod new
    for i in 1 2; do
        for pf in 0 16 32; do
            st_time 60 && GGML_Q4_PF=$pf s20r1 e-new-pf$pf-$i -
        done
        st_tar
    done
    st_time 60 && { s21mod old; s20r1 e-old-1 -; }
    echo "done at ${SECONDS} s"
    st_tar
}


# s21f and s21k (carry .stash and .whl/s21: the final build and module):
# the reference sessions, on two H200 hosts. Upstream's llama-bench is
# built here with the stash's CPU module (the release's kernels); R2 at 4
# GiB and R1 at 2 GiB with the new module twice and the old once,
# interleaved; upstream fitted and on the full GPU; the final module's rows
# alone and beside the link.
s21ref() { # PREFIX
    local x=$1
    s21prep
    s17upstream
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    s21mod new; s18row "$x-r2-new-1" 1; s20r1 "$x-r1-new-1" -
    s21mod old; s18row "$x-r2-old-1" 1; s20r1 "$x-r1-old-1" -
    st_tar
    s21mod new; s18row "$x-r2-new-2" 1; s20r1 "$x-r1-new-2" -
    st_tar
    st_ups "$x" r1 2048
    st_ups "$x" r2 4096
    if st_time 60; then
        s20micro
        s21drpair "$x"
    fi
    echo "done at ${SECONDS} s"
    st_tar
}
s21f() { s21ref f; }
s21k() { s21ref k; }

# s21g (carry .stash and .whl/s21, on an H100 host): R1 at 2 GiB and R2 at
# 4 GiB with the new module, R1 with the old.
s21g() {
    s21prep
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    s21mod new; s20r1 g-r1-new-1 -; s18row g-r2-new-1 1
    s21mod old; s20r1 g-r1-old-1 -
    st_tar
    st_time 70 && { s21mod new; s20r1 g-r1-new-2 -; }
    st_time 70 && { s21mod old; s18row g-r2-old-1 1; }
    echo "done at ${SECONDS} s"
    st_tar
}


# s21h and s21i (carry .stash and .whl/s21: this session's build with
# experiment 0043, not landed: bench/results/session21/i-h200-swiglu-cpu-
# first/experiment-0043.patch; without it both rows run the same build):
# R1 at 2 GiB at the tuner's share with the SwiGLU on each side (h: the
# GPU's rows of up and gate before the CPU's, one wait per layer; i: after
# them, as patch 0017 orders them) and without it (LLAMA_ROW_SPLIT_FUSED=0),
# interleaved; then both modes of R1 against the full-GPU placement.
s21ab() { # PREFIX
    s21prep
    s21mod new
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    local i
    for i in 1 2; do
        st_time 60 && s20r1 "$1-r1-fused-$i" -
        st_time 60 && LLAMA_ROW_SPLIT_FUSED=0 s20r1 "$1-r1-two-$i" -
        st_tar
    done
    st_time 120 && st_lossless "$1-lossless-r1" r1 2GiB
    echo "done at ${SECONDS} s"
    st_tar
}
s21h() { s21ab h; }
s21i() { s21ab i; }


# s21j (as s21g, on the same H100 host): the CPU's rows with each module,
# alone and beside the link; then R2 and R1 again with each, interleaved.
s21j() {
    s21prep
    s20micro
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    s21mod new
    s21dr j-old-42 old 0.42; s21dr j-new-42 new 0.42
    /root/m/h2d-load 30 4096 > "$RES/h2d-j.txt" & sleep 1
    s21dr j-old-42-dma old 0.42; s21dr j-new-42-dma new 0.42
    wait; cat "$RES/h2d-j.txt"
    st_tar
    s21mod old; s18row j-r2-old-1 1
    s21mod new; s18row j-r2-new-1 1
    st_tar
    st_time 60 && { s21mod old; s20r1 j-r1-old-1 -; }
    st_time 60 && { s21mod new; s20r1 j-r1-new-1 -; }
    st_time 60 && { s21mod new; s18row j-r2-new-2 1; }
    echo "done at ${SECONDS} s"
    st_tar
}


# s21l (carry .stash and .whl/s21: the final build and module): a third
# H200 host, without upstream: R1 at 2 GiB with the new module three times
# and the old once, R2 at 4 GiB with the new once.
s21l() {
    s21prep
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    s21mod new; s20r1 l-r1-new-1 -
    s21mod old; s20r1 l-r1-old-1 -
    s21mod new; s20r1 l-r1-new-2 -
    st_tar
    st_time 70 && { s21mod new; s18row l-r2-new-1 1; }
    st_time 60 && { s21mod new; s20r1 l-r1-new-3 -; }
    echo "done at ${SECONDS} s"
    st_tar
}


# s21m (carry .stash and .whl/s21, on an H100 host): where R1's step goes
# there with the new module: forced 44%, 49% and 54% with the scheduler's
# timing, 49% with the refill at once (GGML_SCHED_LATE_REFILL=0), and the
# tuner's share; the CPU's rows alone and beside the link.
s21m() {
    s21prep
    s20micro
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    s21mod new
    s21drpair m
    s20r1 m-r1-f49 0.49
    s20r1 m-r1-f44 0.44
    s20r1 m-r1-f54 0.54
    st_tar
    st_time 60 && GGML_SCHED_LATE_REFILL=0 s20r1 m-r1-f49-early 0.49
    st_time 60 && s20r1 m-r1-tuned -
    echo "done at ${SECONDS} s"
    st_tar
}


# s21n (as s21m, on the same H100 host): more streaming slots, where the
# link lags at 44-49% there: forced 49% and 44% with 6 and 8 slots, and the
# tuner's share with 6 and 8.
s21n() {
    s21prep
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    s21mod new
    s20r1 n-r1-f49-s6 0.49 --stream-slots 6
    s20r1 n-r1-f49-s8 0.49 --stream-slots 8
    s20r1 n-r1-f44-s8 0.44 --stream-slots 8
    st_tar
    st_time 60 && s20r1 n-r1-tuned-s8 - --stream-slots 8
    st_time 60 && s20r1 n-r1-tuned-s6 - --stream-slots 6
    echo "done at ${SECONDS} s"
    st_tar
}


# s21o (carry .stash and .whl/s21, on an H100 host): CUPTI traces of R1 at
# 2 GiB at 49% and 44% of the rows on the GPU with the new module, to see
# why the link copies less in the step there than on H200 hosts.
s21o() {
    s21prep
    s21mod new
    local f
    for f in 0.49 0.44; do s15trace "o-f${f#0.}" r1 2GiB 16 --dense-split "$f"; done
    echo "done at ${SECONDS} s"
    st_tar
}


# s21p (carry .stash and .whl/s21, on an H100 host): host memory shared by
# the CPU and the link, each side's rate measured while the other runs for
# all of its time: host-bw and h2d-load alone, h2d-load inside host-bw,
# host-bw inside h2d-load, and h2d-load inside dense-rows (new module).
s21p() {
    s21prep
    s20micro
    s21mod new
    gcc -O2 -mavx2 -fopenmp scripts/device/host-bw.c -o /root/m/host-bw
    {
        echo "== alone"; /root/m/host-bw 16 8 4; /root/m/h2d-load 4 4096
        echo "== h2d-load inside host-bw"; /root/m/host-bw 16 8 10 & sleep 3; /root/m/h2d-load 4 4096; wait
        echo "== host-bw inside h2d-load"; /root/m/h2d-load 10 4096 & sleep 3; /root/m/host-bw 16 8 4; wait
        echo "== h2d-load inside dense-rows"
        timeout 120 /root/m/dense-rows /root/m/cpu-new.so 16 400 60 repack 0.60 2> /dev/null | grep -E "^(rows|cols)" &
        sleep 15; /root/m/h2d-load 3 4096; wait
    } 2>&1 | tee "$RES/p-host-memory.txt"
    echo "done at ${SECONDS} s"
    st_tar
}


# Session 22 (carry .stash and .whl/s22): .whl/s22 holds the call's build
# and its CPU module, built here with the GPU hosts' AVX-512 features.
# s22a-s22e ran builds this tree no longer makes (bench/results/session22
# names them): experiment 0043 (the CPU's threads reading ahead a CPU
# split's weight rows while the host waits for its inputs; off with
# GGML_SCHED_CPU_PREFETCH=0) in all five, experiment 0044 (more, smaller
# streaming slots in decode) in s22d. In later builds those variables do
# nothing.
s22prep() { s22prep_from .whl/s22; }
s22r1() { # NAME on|off SHARE|- [EXTRA...]: s20r1 with patch 0043's read-ahead on or off (GGML_SCHED_CPU_PREFETCH=0)
    local name=$1 p=$2; shift 2
    if [[ $p == off ]]; then GGML_SCHED_CPU_PREFETCH=0 s20r1 "$name" "$@"; else s20r1 "$name" "$@"; fi
}
# s22a: R1 at 2 GiB with the read-ahead off and on, interleaved, at a
# forced 40% and at the tuner's share; two other read-ahead sizes; R2 at
# 4 GiB with it on.
s22a() {
    s22prep
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    s22r1 a-off-40 off 0.40; s22r1 a-on-40 on 0.40
    s22r1 a-off-t off -; s22r1 a-on-t on -
    st_tar
    s22r1 a-off-40b off 0.40; s22r1 a-on-40b on 0.40
    st_tar
    st_time 60 && GGML_CPU_PREFETCH_KB=512 s22r1 a-on-40-512 on 0.40
    st_time 60 && GGML_CPU_PREFETCH_KB=2048 s22r1 a-on-40-2048 on 0.40
    st_time 60 && s18row a-r2-on 1
    echo "done at ${SECONDS} s"
    st_tar
}

# s22b (carry .stash and .whl/s22; the build with the search that climbs
# from the fastest share measured): R1 at 2 GiB at the tuner's share with
# the read-ahead off and on, interleaved, twice; R2 at 4 GiB.
s22b() {
    s22prep
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    s22r1 b-off-t off -; s22r1 b-on-t on -
    st_tar
    s22r1 b-off-t2 off -; s22r1 b-on-t2 on -
    st_tar
    st_time 60 && s18row b-r2-on 1
    st_time 60 && s22r1 b-on-t3 on -
    echo "done at ${SECONDS} s"
    st_tar
}

# s22ref PREFIX (carry .stash and .whl/s22; the build whose search walks
# across plateaus): R1 at 2 GiB at the tuner's share with the read-ahead on
# and off, interleaved, twice; R2 at 4 GiB; upstream's llama-bench from the
# same release (the stash's CPU module), fitted in each budget and on the
# full GPU.
s22ref() {
    local x=$1
    s17prep .whl/s22
    s17upstream
    xz -dc .whl/s22/libggml-cpu.so.xz > dist/lib/libggml-cpu.so
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    s22r1 "$x-r1-on-1" on -; s22r1 "$x-r1-off-1" off -; s18row "$x-r2-on-1" 1
    st_tar
    s22r1 "$x-r1-on-2" on -; s22r1 "$x-r1-off-2" off -
    st_tar
    st_ups "$x" r1 2048
    st_ups "$x" r2 4096
    st_time 40 && s22r1 "$x-r1-on-3" on -
    st_time 40 && s18row "$x-r2-on-2" 1
    echo "done at ${SECONDS} s"
    st_tar
}
s22c() { s22ref c; }

# s22d (carry .stash and .whl/s22; the build with patch 0044): R1 at 2 GiB
# with the decode layout's slots resized (default) and not
# (GGML_SCHED_STREAM_SLOTS_RESIZE=0), interleaved, at the tuner's share and
# at a forced 40%; R2 at 4 GiB.
s22d() {
    s22prep
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    s22r1 d-rs-t on -; GGML_SCHED_STREAM_SLOTS_RESIZE=0 s22r1 d-fixed-t on -
    st_tar
    s22r1 d-rs-40 on 0.40; GGML_SCHED_STREAM_SLOTS_RESIZE=0 s22r1 d-fixed-40 on 0.40
    st_tar
    s22r1 d-rs-t2 on -; GGML_SCHED_STREAM_SLOTS_RESIZE=0 s22r1 d-fixed-t2 on -
    st_tar
    st_time 60 && s18row d-r2 1
    st_time 50 && s22r1 d-rs-50 on 0.50
    st_time 50 && GGML_SCHED_STREAM_SLOTS_RESIZE=0 s22r1 d-fixed-50 on 0.50
    echo "done at ${SECONDS} s"
    st_tar
}

# s22e (carry .stash and .whl/s22; the build without experiment 0044, on an
# H100 host): R1 at 2 GiB with patch 0043's read-ahead on and off,
# interleaved, three times at a forced 40% and once at the tuner's share.
s22e() {
    s22prep
    local ST_LIMIT=${ST_LIMIT:-585} i
    export ST_LIMIT
    for i in 1 2 3; do
        st_time 50 && s22r1 "e-on-40-$i" on 0.40
        st_time 50 && s22r1 "e-off-40-$i" off 0.40
        st_tar
    done
    st_time 50 && s22r1 e-off-t off -
    st_time 50 && s22r1 e-on-t on -
    echo "done at ${SECONDS} s"
    st_tar
}

# s22f (carry .stash and .whl/s22: the final build, patches 0001-0042 and
# the search that walks across plateaus; on an H200 host): the reference
# call, s22ref's rows with this build, where GGML_SCHED_CPU_PREFETCH no
# longer does anything (experiment 0043 is not in it).
s22f() { s22ref f; }
# s22g (the same build, on an H100 host): R1 at 2 GiB at the tuner's share
# three times, R2 at 4 GiB twice.
s22g() {
    s22prep
    local ST_LIMIT=${ST_LIMIT:-585} i
    export ST_LIMIT
    for i in 1 2 3; do
        st_time 50 && s20r1 "g-r1-$i" -
        st_tar
    done
    st_time 50 && s18row g-r2-1 1
    st_time 50 && s18row g-r2-2 1
    echo "done at ${SECONDS} s"
    st_tar
}

# s22h (carry .stash and .whl/s22, the final build; an H200 host): R1 from
# saved plans (`run --plan`, used as is, not tuned; `bench` takes no
# plan), the planner's own at 2 GiB rewritten by plan-shares.py: every
# split weight at 40% on the GPU (h-all-40), against ffn_down streamed
# whole in decode and the GPU computing 5-20% of ffn_up's and ffn_gate's
# rows (h-dw-N): one CPU split per layer instead of two. A prompt of ~4k
# tokens, then 64 tokens.
s22run() { # NAME PLAN
    timeout 120 $P run -m "$W/r1.gguf" --plan "$2" -f "$W/prompt-4k.txt" -n 64 --ignore-eos -c 4352 -t 16 --fa on \
        > "$RES/$1.out" 2> "$RES/$1.log" || echo "$1 failed: $?"
    grep -E "^(prompt|decode):" "$RES/$1.out" "$RES/$1.log" 2>/dev/null | sed "s/^[^:]*:/$1: /" | head -2 || true
}
s22plans() { # "ALL..." "DOWN..." (percent, two digits): the prompt, the planner's plan and its rewrites p-all-N, p-dw-N
    local s
    python3 -c "print('The quick brown fox jumps over the lazy dog. ' * 227)" > "$W/prompt-4k.txt"
    $P plan -m "$W/r1.gguf" --vram-budget 2GiB -c 4352 -t 16 --profile "$RES/profile.yaml" --format json > "$W/plan-r1.json"
    for s in $1; do
        python3 scripts/device/plan-shares.py "$W/plan-r1.json" "0.$s" all > "$W/p-all-$s.json"
    done
    for s in $2; do
        python3 scripts/device/plan-shares.py "$W/plan-r1.json" "0.$s" down-whole > "$W/p-dw-$s.json"
    done
    cp "$W"/p-*.json "$RES/"
}
s22h() {
    s22prep
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    s22plans "40" "05 10 15 20"
    s22run h-all-40 "$W/p-all-40.json"
    s22run h-dw-10 "$W/p-dw-10.json"
    s22run h-dw-15 "$W/p-dw-15.json"
    st_tar
    s22run h-all-40b "$W/p-all-40.json"
    s22run h-dw-05 "$W/p-dw-05.json"
    s22run h-dw-20 "$W/p-dw-20.json"
    st_tar
    st_time 40 && s22run h-dw-10b "$W/p-dw-10.json"
    st_time 40 && s22run h-all-40c "$W/p-all-40.json"
    st_time 40 && s22run h-dw-15b "$W/p-dw-15.json"
    echo "done at ${SECONDS} s"
    st_tar
}

# s22i (the same build, on an H100 host): s22h's plans, interleaved.
s22i() {
    s22prep
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    s22plans "40 45" "05 10 15"
    local r
    for r in 1 2 3; do
        s22run "i-all-40-$r" "$W/p-all-40.json"
        s22run "i-dw-05-$r" "$W/p-dw-05.json"
        s22run "i-dw-10-$r" "$W/p-dw-10.json"
        s22run "i-all-45-$r" "$W/p-all-45.json"
        s22run "i-dw-15-$r" "$W/p-dw-15.json"
        st_tar
    done
    echo "done at ${SECONDS} s"
    st_tar
}

# s22j PREFIX (carry .stash and .whl/s22, or the folder WHL names: the build whose row search also
# tries ffn_down streamed whole; calls j and k ran it with the plateau walk
# within 2%, the final build walks within 5%): R1 at 2 GiB at the tuner's
# choice four times, R2 at 4 GiB once; with upstream where UP=1 (the
# reference call).
s22j() {
    local x=$1 whl=${WHL:-.whl/s22}
    s17prep "$whl"
    [[ ${UP:-0} == 1 ]] && s17upstream
    xz -dc "$whl/libggml-cpu.so.xz" > dist/lib/libggml-cpu.so
    local ST_LIMIT=${ST_LIMIT:-585} i
    export ST_LIMIT
    for i in 1 2 3; do
        st_time 50 && s20r1 "$x-r1-$i" -
        st_tar
    done
    st_time 50 && s18row "$x-r2-1" 1
    if [[ ${UP:-0} == 1 ]]; then
        st_ups "$x" r1 2048
        st_ups "$x" r2 4096
    fi
    st_time 50 && s20r1 "$x-r1-4" -
    echo "done at ${SECONDS} s"
    st_tar
}

# Session 23 (carry .whl/s23: dist.tar.xz, scripts/device/pack.sh's dist
# without upstream/ and the CPU module, with patch 0043, the row split of
# weights outside the feed-forward in slot-sized parts; pristine.tar.gz,
# the sdist's llama.cpp). No CUDA module was left from earlier sessions:
# the first call (s23a) builds it with a CPU module for the host's AVX-512
# features and upstream's llama-bench (zprep), keeps the modules in
# /root/cudalib for the next calls on the same warm machine, and sends them
# back in parts ($OUT), so that a later fresh machine takes them from
# .stash/cudalib (carried) instead of building again.
s22prep_from() { # WHL: s22prep's dist from WHL
    s17prep "$1"
    xz -dc "$1/libggml-cpu.so.xz" > dist/lib/libggml-cpu.so
}
s23prep() { # (WHL: the build's folder, default .whl/s23)
    local whl=${WHL:-.whl/s23}
    if [[ ! -x dist/pipeshard ]]; then
        mkdir -p dist/upstream && tar -xJf "$whl/dist.tar.xz" -C dist
        [[ -f $whl/pristine.tar.gz ]] && cp "$whl/pristine.tar.gz" dist/upstream/llama.cpp-pristine.tar.gz
    fi
    [[ -f /root/cudalib/libggml-cuda.so ]] && cp /root/cudalib/libggml-cuda.so /root/cudalib/libggml-cpu.so dist/lib/
    if [[ -f .stash/upbench.tar.xz && ! -x dist/upstream/bin/llama-bench ]]; then
        tar -xJf .stash/upbench.tar.xz -C dist/upstream
    fi
    zprep
    mkdir -p /root/cudalib && cp dist/lib/libggml-cuda.so dist/lib/libggml-cpu.so /root/cudalib/
    cat "$RES/machine.txt"
    echo "prepared at ${SECONDS} s"
}
s23run() { # NAME PLAN: s22run with the scheduler's timing, its last line
    GGML_SCHED_TIMING=1 PIPESHARD_LOG='warn,pipeshard=info,llama.cpp=debug' s22run "$@"
    grep -E "0-token graphs" "$RES/$1.log" | tail -1 | sed -E "s/^.*graphs over 32: //; s/;.*$//; s/^/$1: /" || true
}
s23plans() { # NAME=SHARE:MODE[:OPTS]...: the prompt, the planner's plan and its rewrites $W/p-NAME.json
    local spec name rest share mode opts
    python3 -c "print('The quick brown fox jumps over the lazy dog. ' * 227)" > "$W/prompt-4k.txt"
    $P plan -m "$W/r1.gguf" --vram-budget 2GiB -c 4352 -t 16 --profile "$RES/profile.yaml" --format json > "$W/plan-r1.json"
    for spec in "$@"; do
        name=${spec%%=*}; rest=${spec#*=}
        share=${rest%%:*}; rest=${rest#*:}
        mode=${rest%%:*}; opts=
        [[ $rest == *:* ]] && opts=${rest#*:}
        python3 scripts/device/plan-shares.py "$W/plan-r1.json" "$share" "$mode" ${opts//,/ } > "$W/p-$name.json"
    done
    cp "$W"/p-*.json "$W/plan-r1.json" "$RES/"
}
# s23a (a fresh H200 host): the modules and upstream's llama-bench built
# (zprep), sent back; then R1 at 2 GiB from saved plans (`run --plan`, not
# tuned), interleaved while time allows: ffn_down streamed whole with 5% of
# up and gate on the GPU and attention streamed, the output projection on
# the CPU alone (o00) against 20% and 30% of its rows on the GPU.
s23a() {
    s23prep
    zsave_modules
    tar -C dist/upstream -cJf "$OUT/upbench.tar.xz" --exclude=bin/libggml-cuda.so --exclude=bin/libggml-cpu.so bin
    local ST_LIMIT=${ST_LIMIT:-585} r n
    export ST_LIMIT
    local names=(dw05-at-o00 dw05-at-o30 dw05-at-o20)
    s23plans dw05-at-o00=0.05:down-whole:--attn-stream,--output,0 dw05-at-o30=0.05:down-whole:--attn-stream,--output,0.30 \
        dw05-at-o20=0.05:down-whole:--attn-stream,--output,0.20
    for r in 1 2 3; do
        for n in "${names[@]}"; do
            st_time 25 && s23run "a-$n-$r" "$W/p-$n.json"
        done
        st_tar
    done
    echo "done at ${SECONDS} s"
    st_tar
}
# s23b PREFIX (the same warm machine, or a fresh one carrying .stash with
# s23a's modules in .stash/cudalib and its upbench.tar.xz): R1 at 2 GiB at the tuner's choice (bench), R2 at 4 GiB,
# upstream's rows (fit in the budget, full GPU) of both, R1 again.
s23b() {
    local x=$1 i
    s23prep
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    for i in 1 2 3; do
        st_time 45 && s20r1 "$x-r1-$i" -
        st_tar
    done
    st_time 45 && s18row "$x-r2-1" 1
    st_ups "$x" r1 2048
    st_ups "$x" r2 4096
    for i in 4 5 6; do
        st_time 45 && s20r1 "$x-r1-$i" -
    done
    echo "done at ${SECONDS} s"
    st_tar
}
# s23c PREFIX (a fresh H200 host; carry .stash with s23a's modules and
# upstream's llama-bench, and .whl/s23c: the final build, whose row search
# measures up to 8 settings with ffn_down whole, packed without the source
# tarballs): the output projection on the CPU alone and split at the
# planner's share (saved plans, interleaved twice), then s23b's rows.
s23c() {
    WHL=.whl/s23c s23prep
    local ST_LIMIT=${ST_LIMIT:-585} r n
    export ST_LIMIT
    s23plans dw05-o00=0.05:down-whole:--output,0 dw05-o31=0.05:down-whole
    for r in 1 2; do
        for n in dw05-o00 dw05-o31; do
            st_time 25 && s23run "$1-$n-$r" "$W/p-$n.json"
        done
    done
    st_tar
    WHL=.whl/s23c s23b "$1"
}

# s23d PREFIX (a fresh H200 host, carrying as s23c): R1 at 2 GiB at the
# tuner's choice with the committed H200 profile and with its
# host_read_bw_with_link read as the CPU's and the link's reads together
# (the CPU's 92 GB/s beside 55 GB/s of copies: 147 GB/s), interleaved; the
# planner's row share with each first.
s23d() {
    WHL=.whl/s23c s23prep
    local ST_LIMIT=${ST_LIMIT:-585} r
    export ST_LIMIT
    cp "$RES/profile.yaml" "$RES/profile-committed.yaml"
    sed 's/^host_read_bw_with_link: .*/host_read_bw_with_link: 147000000000.0/' "$RES/profile-committed.yaml" > "$RES/profile-147.yaml"
    for r in committed 147; do
        $P plan -m "$W/r1.gguf" --vram-budget 2GiB -c 4352 -t 16 --profile "$RES/profile-$r.yaml" > "$RES/plan-r1-$r.txt" 2>&1
        grep -E "row split|predicted|decode" "$RES/plan-r1-$r.txt" | head -4 | sed "s/^/$r: /"
    done
    for r in 1 2; do
        cp "$RES/profile-committed.yaml" "$RES/profile.yaml"
        st_time 40 && s20r1 "$1-r1-committed-$r" -
        cp "$RES/profile-147.yaml" "$RES/profile.yaml"
        st_time 40 && s20r1 "$1-r1-147-$r" -
        st_tar
    done
    cp "$RES/profile-committed.yaml" "$RES/profile.yaml"
    echo "done at ${SECONDS} s"
    st_tar
}

# s23e PREFIX (a fresh H200 host; carry .stash and .whl/s23e, the final
# build: the finalists compared by the median of their three probes): R1 at
# 2 GiB at the tuner's choice while time allows.
s23e() {
    WHL=.whl/s23e s23prep
    local ST_LIMIT=${ST_LIMIT:-585} i
    export ST_LIMIT
    for i in 1 2 3 4; do
        st_time 30 && s20r1 "$1-r1-$i" -
        st_tar
    done
    echo "done at ${SECONDS} s"
}

# Session 24 (carry .whl/s24: scripts/device/pack.sh's dist without upstream/,
# and session 23's native CPU module and upstream's llama-bench from .stash):
# experiment 0044, the device split after a CPU split queued before the CPU
# computes (behind a gate in pinned memory) and a CPU split's inputs read
# with one wait; not kept: its diff is
# bench/results/session24/experiment-0044-handover-ahead.patch, and a build
# without it runs s24a's rows alike (its variables do nothing). s24prep
# builds the CUDA module only (the native CPU module is session 23's: the
# experiment does not touch it) and writes R1.
s24prep() {
    if [[ ! -x dist/pipeshard ]]; then
        mkdir -p dist/upstream && tar -xJf "${WHL:-.whl/s24}/dist.tar.xz" -C dist
    fi
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$RES/machine.txt"
    lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$RES/machine.txt"
    if [[ ! -f dist/lib/libggml-cuda.so ]]; then
        ( time JOBS=16 bash dist/build-cuda.sh dist 90 ) > "$RES/build-cuda.log" 2>&1 \
            || { tail -30 "$RES/build-cuda.log"; exit 1; }
        tail -3 "$RES/build-cuda.log"
        xz -dc "${WHL:-.whl/s24}/libggml-cpu.so.xz" > dist/lib/libggml-cpu.so
    fi
    if [[ -f ${WHL:-.whl/s24}/upbench.tar.xz && ! -x dist/upstream/bin/llama-bench ]]; then
        tar -xJf "${WHL:-.whl/s24}/upbench.tar.xz" -C dist/upstream
        cp dist/lib/libggml-cuda.so dist/lib/libggml-cpu.so dist/upstream/bin/
    fi
    [[ -f $W/r1.gguf ]] || $P synth --arch llama3.1-8b --quant q4_0 -o "$W/r1.gguf" > /dev/null
    [[ -f $RES/profile.yaml ]] || cp profiles/intel-r-xeon-r-processor__nvidia-h200__t16.yaml "$RES/profile.yaml"
    echo "prepared at ${SECONDS} s"
}
# s24run NAME PLAN: R1 from a saved plan (not tuned), 64 tokens after a 4k
# prompt, the scheduler's timing; its decode line and the timing's last line
s24run() {
    GGML_SCHED_TIMING=1 PIPESHARD_LOG='warn,pipeshard=info,llama.cpp=debug' timeout 75 $P run -m "$W/r1.gguf" \
        --plan "$2" -f "$W/prompt-4k.txt" -n 64 --ignore-eos -c 4352 -t 16 --fa on \
        > "$RES/$1.out" 2> "$RES/$1.log" || echo "$1 failed: $?"
    grep -E "^decode:" "$RES/$1.log" | sed "s/^/$1: /" | head -1 || true
    grep -E "0-token graphs" "$RES/$1.log" | tail -1 | sed -E "s/^.*graphs over 32: //; s/; before.*queued ahead/, ahead/; s/^/$1: /" || true
}
# s24text NAME: the generated text of a run
s24text() { md5sum < "$RES/$1.out" | sed "s/ .*/  $1/"; }
# s24a PREFIX (a fresh H200 host): saved plans (ffn_down whole, 7.5% of up
# and gate), patch 0044 on, off (GGML_SCHED_EARLY_LAUNCH=0
# GGML_SCHED_EARLY_READS=0), and on with GGML_CUDA_GRAPH_OPT=1,
# interleaved; the texts compared; then R1 at the tuner's choice.
s24a() {
    s24prep
    local ST_LIMIT=${ST_LIMIT:-585} r x=$1
    export ST_LIMIT
    s23plans dw075=0.075:down-whole
    for r in 1 2 3; do
        st_time 40 && s24run "$x-on-$r" "$W/p-dw075.json"
        st_time 40 && GGML_SCHED_EARLY_LAUNCH=0 GGML_SCHED_EARLY_READS=0 s24run "$x-off-$r" "$W/p-dw075.json"
        st_time 40 && GGML_CUDA_GRAPH_OPT=1 s24run "$x-gopt-$r" "$W/p-dw075.json"
        st_tar
    done
    for r in on-1 off-1 gopt-1 on-2 off-2; do [[ -f $RES/$x-$r.out ]] && s24text "$x-$r"; done
    for r in 1 2; do
        st_time 45 && s20r1 "$x-r1-$r" -
        st_tar
    done
    echo "done at ${SECONDS} s"
    st_tar
}

# s24c PREFIX (a fresh H200 host; carry .stash, session 23's CUDA and native
# CPU modules and upstream's llama-bench, which patch 0044 not being kept
# leaves current, and .whl/s24c: the final build, whose decode search
# prefers ffn_down whole within the margin and may keep 2.5% of up and
# gate): R1 from saved plans with ffn_down whole at 2.5%, 5% and 7.5% of up
# and gate, interleaved twice; R1 at the tuner's choice three times;
# upstream's R1 rows (fit in 2 GiB, full GPU).
s24c() {
    zprep_r1
    local ST_LIMIT=${ST_LIMIT:-585} r x=$1
    export ST_LIMIT
    s23plans dw025=0.025:down-whole dw05=0.05:down-whole dw075=0.075:down-whole
    s24rounds "$x" 2 40 dw025 dw05 dw075
    for r in 1 2 3; do
        st_time 50 && s20r1 "$x-r1-$r" -
        st_tar
    done
    st_ups "$x" r1 2048
    echo "done at ${SECONDS} s"
    st_tar
}
# s24d PREFIX (a fresh H200 host, carrying as s24c): R1 at the tuner's
# choice while time allows, R2 at 4 GiB twice, upstream's R2 rows.
s24d() {
    zprep_r1
    local ST_LIMIT=${ST_LIMIT:-585} r x=$1
    export ST_LIMIT
    $P synth --arch qwen3-30b-a3b --quant q4_0 -o "$W/r2.gguf" > /dev/null
    echo "R2 written at ${SECONDS} s"
    for r in 1 2 3; do
        st_time 50 && s20r1 "$x-r1-$r" -
        st_tar
    done
    st_time 45 && s18row "$x-r2-1" 1
    st_time 45 && s18row "$x-r2-2" 1
    st_tar
    st_ups "$x" r2 4096
    echo "done at ${SECONDS} s"
    st_tar
}
# s24f PREFIX (a fresh H200 host, carrying as s24c): R1 from saved plans,
# ffn_down whole with 5% of up and gate, the output projection's GPU share
# at the planner's 30.6%, 20% and 10%, interleaved while time allows.
s24f() {
    zprep_r1
    local ST_LIMIT=${ST_LIMIT:-585}
    export ST_LIMIT
    s23plans dw05-o31=0.05:down-whole dw05-o20=0.05:down-whole:--output,0.20 dw05-o10=0.05:down-whole:--output,0.10
    s24rounds "$1" 3 30 dw05-o31 dw05-o20 dw05-o10
    echo "done at ${SECONDS} s"
    st_tar
}
# s24rounds PREFIX ROUNDS MARGIN NAME...: s24run of the saved plans
# $W/p-NAME.json in turn, ROUNDS times, each while st_time MARGIN allows
s24rounds() {
    local x=$1 rounds=$2 margin=$3 r n
    shift 3
    for ((r = 1; r <= rounds; r++)); do
        for n in "$@"; do
            st_time "$margin" && s24run "$x-$n-$r" "$W/p-$n.json"
        done
        st_tar
    done
}
# The final build from WHL (default .whl/s24c) with the stashed modules and
# upstream's llama-bench (no build, no R2: its model takes a while to
# write), R1, the committed profile. With CPU=own the build's own CPU module
# stays (one built on the dev machine for these hosts' CPU features).
zprep_r1() {
    local whl=${1:-.whl/s24c} cpu=${2:-stash}
    mkdir -p dist/upstream && tar -xJf "$whl/dist.tar.xz" -C dist
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$RES/machine.txt"
    lscpu | grep -E "Model name|^CPU\(s\)|L2 cache|L3 cache" | tee -a "$RES/machine.txt"
    grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^avx512(f|bw|vl|_vnni|_bf16|vbmi)$|^avx_vnni$' | tr '\n' ' ' | tee -a "$RES/machine.txt"
    echo | tee -a "$RES/machine.txt"
    cat .stash/cudalib/libggml-cuda.so.xz.* | xz -d > dist/lib/libggml-cuda.so
    [[ $cpu == own ]] || xz -dc .stash/cudalib/libggml-cpu.so.xz > dist/lib/libggml-cpu.so
    bash scripts/device/cuda-stack.sh dist
    tar -xJf .stash/upbench.tar.xz -C dist/upstream
    cp dist/lib/libggml-cuda.so dist/lib/libggml-cpu.so dist/upstream/bin/
    $P synth --arch llama3.1-8b --quant q4_0 -o "$W/r1.gguf" > /dev/null
    cp profiles/intel-r-xeon-r-processor__nvidia-h200__t16.yaml "$RES/profile.yaml"
    echo "prepared at ${SECONDS} s"
}

# s25variants PREFIX ROUNDS VARIANT...: s24run of each VARIANT
# (NAME:PLAN[:VAR=VALUE...], the saved plan $W/p-PLAN.json with those
# variables set) in turn, ROUNDS times, each while 40 s are left; then the
# md5 of each variant's first text
s25variants() {
    local x=$1 rounds=$2 r v name plan vars
    shift 2
    for ((r = 1; r <= rounds; r++)); do
        for v in "$@"; do
            IFS=: read -r name plan vars <<< "$v"
            # shellcheck disable=SC2086
            st_time 40 && ( [[ -z $vars ]] || export ${vars//:/ }; s24run "$x-$name-$r" "$W/p-$plan.json" )
        done
        st_tar
    done
    for v in "$@"; do
        name=${v%%:*}
        [[ -f $RES/$x-$name-1.out ]] && s24text "$x-$name-1"
    done
}
# s25prep WHL: zprep_r1 with WHL's own CPU module, and the call's time
# limit (ST_LIMIT, 585 s unless set)
s25prep() {
    export ST_LIMIT=${ST_LIMIT:-585}
    zprep_r1 "$1" own
}
# s25r2 PREFIX N: R2 written, at 4 GiB N times, then upstream's R2 rows,
# each while time allows
s25r2() {
    local x=$1 n=$2 r
    st_time 120 && $P synth --arch qwen3-30b-a3b --quant q4_0 -o "$W/r2.gguf" > /dev/null
    for ((r = 1; r <= n; r++)); do
        st_time 60 && s18row "$x-r2-$r" 1
        st_tar
    done
    st_time 100 && st_ups "$x" r2 4096
}
# s25a PREFIX (a fresh H200 host; carry .stash, session 23's CUDA module and
# upstream's llama-bench, and .whl/s25a: the build with patch 0044 (the
# CPU's threads read their first weights while the scheduler waits for a
# CPU split's inputs) and its CPU module built on the dev machine with these
# hosts' AVX-512 features): saved plans (ffn_down whole, 5% and 10% of up
# and gate) with the reads ahead on and off (GGML_SCHED_CPU_PREFETCH=0),
# interleaved, the texts compared; R1 at the tuner's choice, on and off;
# upstream's R1 rows.
s25a() {
    s25prep .whl/s25a
    local r x=$1
    s23plans dw05=0.05:down-whole dw10=0.10:down-whole
    s25variants "$x" 3 on05:dw05 off05:dw05:GGML_SCHED_CPU_PREFETCH=0 on10:dw10 off10:dw10:GGML_SCHED_CPU_PREFETCH=0
    for r in 1 2; do
        st_time 50 && s20r1 "$x-r1-on-$r" -
        st_time 50 && GGML_SCHED_CPU_PREFETCH=0 s20r1 "$x-r1-off-$r" -
        st_tar
    done
    echo "done at ${SECONDS} s"
    st_tar
}
# s25b PREFIX (a fresh H200 host; carry .stash and .whl/s25b: patch 0044
# with the reads ahead going on past each thread's first chunks, to the
# chunks left, GGML_CPU_PREFETCH_REST=0 stopping after the first chunks
# in that build only):
# saved plan (ffn_down whole, 5%) with the reads ahead whole, first chunks
# only, and off, interleaved; R1 at the tuner's choice three times, once
# off; upstream's R1 rows; R2 at 4 GiB and upstream's R2 rows while time
# allows.
s25b() {
    s25prep .whl/s25b
    local r x=$1
    s23plans dw05=0.05:down-whole
    s25variants "$x" 3 all:dw05 first:dw05:GGML_CPU_PREFETCH_REST=0 off:dw05:GGML_SCHED_CPU_PREFETCH=0
    for r in 1 2 3; do
        st_time 50 && s20r1 "$x-r1-on-$r" -
        st_tar
    done
    st_time 50 && GGML_SCHED_CPU_PREFETCH=0 s20r1 "$x-r1-off-1" -
    st_ups "$x" r1 2048
    st_tar
    s25r2 "$x" 1
    echo "done at ${SECONDS} s"
    st_tar
}
# s25c PREFIX (a fresh H200 host; carry .stash and .whl/s25c: patch 0044
# and the decode tier listing units beyond the freed memory, which the
# launch takes as far as the room it measures under the budget allows):
# saved plans (ffn_down whole, 5%) with the decode tier as listed and cut
# to its planned units (the tier as before), interleaved; R1 at the
# tuner's choice while time allows; upstream's R1 rows.
s25c() {
    s25prep .whl/s25c
    local r x=$1
    s23plans dw05=0.05:down-whole
    python3 -c "
import json, sys
p = json.load(open(sys.argv[1]))
t = p['decode_tier']
t['units'] = t['units'][:len(t['units']) - t['beyond']]
t['beyond'] = 0
json.dump(p, open(sys.argv[2], 'w'))" "$W/p-dw05.json" "$W/p-dw05cut.json"
    s25variants "$x" 3 tier:dw05 cut:dw05cut
    grep -h "decode tier:" "$RES/$x-tier-1.log" "$RES/$x-cut-1.log" | sed -E "s/^.*INFO[^ ]* //" | head -4
    st_ups "$x" r1 2048
    for r in 1 2 3 4 5; do
        st_time 50 && s20r1 "$x-r1-$r" -
        st_tar
    done
    echo "done at ${SECONDS} s"
    st_tar
}
# s25d PREFIX (a fresh H200 host; carry .stash and .whl/s25d: the final
# build, patch 0044 reading ahead to the chunks left, and the decode tier
# planned as before plus the units beyond, taken as far as the room
# measured allows): R1 at the tuner's choice five times, upstream's R1
# rows, R2 at 4 GiB twice, upstream's R2 rows, each while time allows.
s25d() {
    s25prep .whl/s25d
    local r x=$1
    $P plan -m "$W/r1.gguf" --vram-budget 2GiB -c 4352 -t 16 --profile "$RES/profile.yaml" > "$RES/plan-r1.txt"
    for r in 1 2 3 4 5; do
        st_time 50 && s20r1 "$x-r1-$r" -
        st_tar
    done
    st_ups "$x" r1 2048
    st_tar
    s25r2 "$x" 2
    echo "done at ${SECONDS} s"
    st_tar
}
# s25e PREFIX (another fresh H200 host, carrying as s25d): R1 at the
# tuner's choice four times, twice more without the reads ahead
# (GGML_SCHED_CPU_PREFETCH=0), interleaved; upstream's R1 rows.
s25e() {
    s25prep .whl/s25d
    local r x=$1
    for r in 1 2; do
        st_time 50 && s20r1 "$x-r1-$r" -
        st_time 50 && GGML_SCHED_CPU_PREFETCH=0 s20r1 "$x-r1-off-$r" -
        st_time 50 && s20r1 "$x-r1-$((r + 2))" -
        st_tar
    done
    st_ups "$x" r1 2048
    echo "done at ${SECONDS} s"
    st_tar
}

"$@"
