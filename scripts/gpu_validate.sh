#!/usr/bin/env bash
# The GPU validation of issue 8 in three steps, each under 10 minutes on a 16-core H100 machine
# (docs/CUDA.md "Validating on a GPU", docs/BENCHMARKS.md). Outputs go to ${OUT:-gpu_out}/.
#   scripts/gpu_validate.sh build   configure + build (CUDA, Release), report the GPU
#   scripts/gpu_validate.sh test    ctest -L gpu (op consistency, flash, bf16, model, resume, NCCL)
#   scripts/gpu_validate.sh bench   training MFU (124M, 350M) and the attention TFLOP/s table
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
case "${1:-}" in
build)
    nvidia-smi | tee "$OUT/nvidia-smi.txt"
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCTX_CUDA=ON > "$OUT/configure.txt" 2>&1
    cmake --build build -j "$(nproc)" 2>&1 | tail -20 | tee "$OUT/build.txt"
    ;;
test)
    (cd build && ctest -L gpu -j 4 --output-on-failure --timeout 600) 2>&1 | tee "$OUT/ctest_gpu.txt" | tail -40
    ;;
bench)
    B=./build/ctxengine
    {
        $B bench --config gpt2-124m --device cuda --precision bf16 --steps 20 --warmup 3
        $B bench --config gpt2-124m --device cuda --precision fp32 --steps 10 --warmup 2
        $B bench --config gpt2-350m --device cuda --precision bf16 --steps 10 --warmup 3
        for pe in rope alibi kerple_log; do
            $B bench --config gpt2-124m --device cuda --precision bf16 --pe $pe --steps 10 --warmup 2
        done
        $B bench --config gpt2-124m --device cuda --precision bf16 --attention materialised --steps 10
    } 2>&1 | tee "$OUT/bench_train.txt" | grep -E "config=|tokens_per_s=|mfu=|error"
    $B bench attention --device cuda --head-dim 64,128 --T 1024,2048,4096,8192,16384 \
        --pe none,rope,alibi,kerple_log 2>&1 | tee "$OUT/bench_attention.txt"
    ;;
*)
    sed -n 2,7p "$0"
    exit 2
    ;;
esac
