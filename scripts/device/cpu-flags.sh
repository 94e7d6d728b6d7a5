# Sourced by build-cuda.sh and gemv-bench.sh: cpu_flags, the cmake flags of
# ggml's CPU backend for this machine's CPU, its features by name.
# GGML_NATIVE is not allowed with loadable backends, and would also turn on
# AMX, which some hosts report without enabling it.
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { [[ " $flags " == *" $1 "* ]]; }
cpu_flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
has avx512f && cpu_flags+=(-DGGML_AVX512=ON)
has avx512vbmi && cpu_flags+=(-DGGML_AVX512_VBMI=ON)
has avx512_vnni && cpu_flags+=(-DGGML_AVX512_VNNI=ON)
has avx512_bf16 && cpu_flags+=(-DGGML_AVX512_BF16=ON)
has avx_vnni && cpu_flags+=(-DGGML_AVX_VNNI=ON)
