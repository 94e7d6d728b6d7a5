# Sourced by reference.sh and server-bench.sh (from the repository root):
# committed_profile THREADS prints this GPU's profile under profiles/ for
# THREADS CPU threads, or nothing where none is committed.
committed_profile() {
    local gpu
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-' | sed 's/^nvidia-//')
    ls profiles/*"$gpu"*t"$1".yaml 2>/dev/null | head -1 || true
}
