#!/usr/bin/env bash
# Record the largest per-thread stack any kernel of DIST/lib/libggml-cuda.so
# needs (cuobjdump's STACK) in DIST/lib/libggml-cuda.so.stack. pipeshard
# sets the CUDA context's stack to it at start-up instead of CUDA's 1 KiB
# default, which the driver backs with local memory for every resident
# thread (about 200 MiB less device memory on an H200); without the file it
# leaves CUDA's default.
#
#   cuda-stack.sh DIST
set -euo pipefail
DIST=$(cd "${1:?usage: cuda-stack.sh DIST}" && pwd)
SO=$DIST/lib/libggml-cuda.so
CUOBJDUMP=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1 || true)
[[ -n $CUOBJDUMP && -f $SO ]] || { echo "cuda-stack: no cuobjdump or no $SO; CUDA's default stack stays" >&2; exit 0; }
max=$("$CUOBJDUMP" -res-usage "$SO" 2>/dev/null | grep -o 'STACK:[0-9]*' | cut -d: -f2 | sort -n | tail -1)
[[ -n $max ]] || { echo "cuda-stack: cuobjdump listed no kernels" >&2; exit 0; }
echo "$max" > "$SO.stack"
echo "cuda-stack: the largest kernel stack is $max bytes per thread ($SO.stack)"
