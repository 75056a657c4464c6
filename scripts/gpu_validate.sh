#!/usr/bin/env bash
# GPU validation from the self-contained bundle (docs/CUDA.md "The GPU bundle"): one command on
# the GPU machine, nothing to build or install there.
#
#   bash <bundle>/gpu_validate.sh [all|quick|tests|bench|profile|sanitize [TOOL]] (default: all)
#
#   all       GPU report, the gpu test executables, end-to-end recipes, the benchmarks
#   quick     one device call's worth (~4 minutes on an H100): the tests, then the numbers that
#             track issue 17 (GPT-2 124M bf16 at B 8 and 64, its A/Bs with
#             CTX_BF16_ACTIVATIONS=0 and CTX_MLP_GELU=kernel and its `bench --profile`;
#             attention at D 64 / 128 for none, alibi and kerple_log at T 1k / 4k / 16k; the
#             same and GPT-2 with CTX_FLASH_BACKWARD=atomic; attention with CTX_FLASH_FORWARD_MTILES=1; the wgmma
#             kernels (CTX_FLASH_FORWARD / DQ / DKV=wgmma) in attention and GPT-2, the wgmma
#             kernels with a producer warpgroup (CTX_FLASH_WGMMA_PIPELINE=producer; and with
#             its tiles by TMA, CTX_FLASH_WGMMA_LOADS=tma), the
#             one-kernel backward on wgmma at D 64 / 128 (CTX_FLASH_BACKWARD=atomic with
#             CTX_FLASH_DKV=wgmma; and its producer form at D 128); the SDPA peer),
#             racecheck of the flash full-tile cases (both backwards) and of the producer
#             kernels, synccheck of the producer kernels (named barriers), memcheck of the bf16
#             activation kernels, the atomic-dq backward, the one-launch AdamW and the forward's
#             edge cases, ncu of the forward at D 64 / 128, T 4k (tensor pipe, shared-memory
#             wavefronts) and of the backward kernels at D 64 / T 1k (time, instructions, stalls),
#             ncu of the wgmma kernels at D 64 / T 1k and D 128 / T 4k (and of the producer
#             kernels, by cp.async and by TMA, at D 128 / T 4k)
#   tests     GPU report, tests and recipes only
#   bench     GPU report, benchmarks only
#   profile   GPU report, Nsight Compute metrics of the tensor-core flash kernels (forward, dq,
#             dk/dv at head dim 128, T 4096, and at GPT-2's 64, T 1024: time, registers,
#             occupancy, tensor-pipe use, local memory, stall reasons), `bench --profile` of
#             GPT-2 124M in bf16 (each op's share), and GPT-2 124M bf16 A/B: the default against
#             CTX_CUBLASLT=0, CTX_BF16_ACTIVATIONS=0, CTX_MLP_GELU=kernel and
#             CTX_LM_HEAD_CHUNK_MIB=64 / 1024
#   sanitize  the gpu test executables under compute-sanitizer (TOOL: memcheck (default),
#             racecheck, synccheck, initcheck); CTX_SANITIZE_FILTER=gtest-filter narrows them
#
# Everything goes to $OUT (default ./gpu_validate_out): summary.txt, one log per step, the tests'
# gtest XML. Every step has its own timeout, capped by what is left of CTX_VALIDATE_BUDGET_S
# (default 450 s, so the whole run stays under 8 minutes; in `all` (`quick`) the tests get at most
# CTX_TESTS_BUDGET_S of it, default 240 s (120 s)); a step that fails or times out is
# recorded and the run goes on; steps that no longer fit are recorded as skipped. A test
# executable that skips every test while nvidia-smi lists a GPU is ALLSKIP (not ok). Exit code 0
# only when every step passed. Run from the repository, it uses $BUNDLE (default
# build-gpu-bundle/, made by scripts/gpu_bundle.sh). CTX_VALIDATE_PACK=1 packs logs/ and tests/
# into $OUT/logs.tar.gz at the end (the device tool brings back at most 8 files). Back on the
# build machine, scripts/gpu_digest.py OUT puts the numbers side by side.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -x "$here/bin/ctxengine" && -f "$here/run.sh" ]]; then
    BUNDLE=$here
else
    BUNDLE=${BUNDLE:-$here/../build-gpu-bundle}
fi
if [[ ! -f "$BUNDLE/run.sh" ]]; then
    echo "gpu_validate: no bundle at $BUNDLE (make one with: bash scripts/gpu_bundle.sh)" >&2
    exit 2
fi
BUNDLE=$(cd "$BUNDLE" && pwd)
mode=${1:-all}
case "$mode" in
all | quick | tests | bench | profile | sanitize) ;;
*) sed -n "2,/^set -uo pipefail/{/^set /!p}" "$0"; exit 2 ;;
esac

OUT=${OUT:-$PWD/gpu_validate_out}
mkdir -p "$OUT/tests" "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
# shellcheck source=gpu_bundle_run.sh
source "$BUNDLE/run.sh"
RUN="$BUNDLE/run.sh"

START=$(date +%s)
BUDGET=${CTX_VALIDATE_BUDGET_S:-450}
SUMMARY="$OUT/summary.txt"
GPU_SEEN=""  # set when nvidia-smi lists a GPU
: >"$SUMMARY"
failures=0

# Seconds left before DEADLINE (the end of the budget, or of the current phase in `all`, so
# slow tests cannot starve the benchmarks).
DEADLINE=$((START + BUDGET))
left() { echo $((DEADLINE - $(date +%s))); }

# step NAME LIMIT_S CMD...: runs CMD under `timeout` (LIMIT_S, or what is left of the budget if
# less) with stdout+stderr in logs/NAME.log, records one summary line, never stops the run.
step() {
    local name=$1 limit=$2
    shift 2
    local log="$OUT/logs/$name.log" avail t0 rc status note
    avail=$(($(left) - 5))
    if ((avail < 10)); then
        printf '%-34s %-8s %5s  %s\n' "$name" skipped - "out of time (budget ${BUDGET}s)" | tee -a "$SUMMARY"
        failures=$((failures + 1))
        return
    fi
    ((limit > avail)) && limit=$avail
    t0=$(date +%s)
    { echo "\$ $*"; echo "# timeout ${limit}s, $(date -u +%FT%TZ)"; } >"$log"
    timeout -k 10 "$limit" "$@" >>"$log" 2>&1
    rc=$?
    case $rc in
    0) status=ok ;;
    124 | 137) status=TIMEOUT ;;
    *) status="FAIL($rc)" ;;
    esac
    # A GPU is there but a test executable skipped everything: the backend could not use it.
    if [[ $status == ok && -n "$GPU_SEEN" ]] && grep -q "^\[  PASSED  \] 0 tests" "$log" &&
       grep -q "^\[  SKIPPED \]" "$log"; then
        status=ALLSKIP
    fi
    [[ $status == ok ]] || failures=$((failures + 1))
    note=$(step_note "$log")
    printf '%-34s %-8s %4ss  %s\n' "$name" "$status" $(($(date +%s) - t0)) "$note" | tee -a "$SUMMARY"
}

# The line worth reading from a step's log: gtest totals, MFU, the last error.
step_note() {
    local log=$1 n
    if grep -q "^\[==========\]" "$log"; then
        n=$(grep -E "^\[  (PASSED|SKIPPED|FAILED) +\] [0-9]+ test" "$log" | sed -E 's/^\[ *([A-Z]+) *\] ([0-9]+).*/\2 \1/' | paste -sd, -)
        echo "gtest: ${n:-no totals}"
    elif grep -q "^mfu=" "$log"; then
        grep -E "^(tokens_per_s|mfu)=" "$log" | paste -sd' ' - | cut -c1-90
    else
        grep -iE "error|fail|not found|cannot" "$log" | tail -1 | cut -c1-90
    fi
}

# The gpu test executables, the most basic first.
gpu_tests() {
    # the wgmma layout check first: a second, and what the next kernels are to be built on
    local t order=(test_ops_gpu_wgmma test_ops_gpu_consistency test_ops_gpu_flash test_ops_gpu_bf16
                   test_ops_gpu_vocab_parallel test_gpu_model
                   test_gpu_resume test_gpu_nccl)
    for t in "${order[@]}"; do [[ -x "$BUNDLE/tests/$t" ]] && echo "$t"; done
    for t in "$BUNDLE"/tests/*; do
        t=$(basename "$t")
        [[ -x "$BUNDLE/tests/$t" && " ${order[*]} " != *" $t "* ]] && echo "$t"
    done
}

report() {
    nvidia-smi -L 2>/dev/null | grep -q "^GPU " && GPU_SEEN=1
    {
        echo "date: $(date -u +%FT%TZ)  host: $(hostname)  mode: $mode  budget: ${BUDGET}s"
        echo "bundle: $BUNDLE"
        [[ -f "$BUNDLE/BUNDLE_INFO.txt" ]] && sed 's/^/  /' "$BUNDLE/BUNDLE_INFO.txt"
        echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
        [[ -n "${CTX_MISSING_LIBS:-}" ]] && echo "MISSING LIBRARIES: $CTX_MISSING_LIBS"
        if command -v nvidia-smi >/dev/null; then
            nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,clocks.max.sm \
                --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
        else
            echo "gpu: nvidia-smi not found"
        fi
    } | tee "$OUT/environment.txt" >>"$SUMMARY"
    cat "$OUT/environment.txt"
    step nvidia-smi 30 nvidia-smi
    step bundle-libs 60 "$RUN" --libs
    step ctxengine-version 30 "$RUN" ctxengine --version
}

tests() {
    # a failing wgmma layout check leaves its operands and result here (tests/test_ops_gpu_wgmma)
    export CTX_WGMMA_DUMP_DIR="$OUT/tests/wgmma-dumps"
    mkdir -p "$CTX_WGMMA_DUMP_DIR"
    local t
    for t in $(gpu_tests); do
        step "$t" "${CTX_TEST_TIMEOUT_S:-150}" "$RUN" "$t" --gtest_output="xml:$OUT/tests/$t.xml"
    done
    step recipe-smoke-cuda-fp32 60 "$RUN" ctxengine --device cuda "$BUNDLE/recipes/smoke.lua"
    step recipe-smoke-cuda-bf16 60 "$RUN" ctxengine --device cuda --precision bf16 "$BUNDLE/recipes/smoke.lua"
}

bench() {
    local B=("$RUN" ctxengine bench)
    # The goals first (docs/BENCHMARKS.md): bf16 MFU, tensor-core attention at head dim 128;
    # then the rest while time is left.
    step bench-gpt2-124m-bf16 90 "${B[@]}" --config gpt2-124m --device cuda --precision bf16 --steps 20 --warmup 3
    step bench-gpt2-124m-bf16-b64 60 "${B[@]}" --config gpt2-124m --device cuda --precision bf16 \
        --batch 64 --steps 10 --warmup 2
    step bench-attention-d128-bf16 60 "${B[@]}" attention --device cuda --precision bf16 \
        --head-dim 128 --T 1024,2048,4096,8192,16384 --pe none,rope,alibi,kerple_log,t5_bias --steps 5 --repeats 2
    step bench-attention-d64-bf16 60 "${B[@]}" attention --device cuda --precision bf16 \
        --head-dim 64 --T 1024,2048,4096,8192,16384 --pe none,rope,alibi,kerple_log,t5_bias --steps 5 --repeats 2
    step bench-attention-d128 120 "${B[@]}" attention --device cuda --head-dim 128 \
        --T 1024,2048,4096,8192,16384 --pe none,rope,alibi,kerple_log --steps 5 --repeats 2
    step bench-gpt2-124m-fp32 90 "${B[@]}" --config gpt2-124m --device cuda --precision fp32 --steps 10 --warmup 2
    step bench-attention-d64 120 "${B[@]}" attention --device cuda --head-dim 64 \
        --T 1024,2048,4096,8192,16384 --pe none,rope,alibi,kerple_log --steps 5 --repeats 2
    local peer="$BUNDLE/benchmarks/sdpa_peer.py" py
    if [[ -f "$peer" ]]; then
        for py in "${CTX_PYTHON:-}" python3 python; do
            [[ -n "$py" ]] && "$py" -c "import torch" 2>/dev/null && break
            py=""
        done
        if [[ -n "$py" ]]; then
            step bench-attention-sdpa-peer 90 "$py" "$peer" --device cuda --head-dim 64,128 --T 1024,2048,4096,8192,16384 --steps 3 --repeats 1
        else
            printf '%-34s %-8s %5s  %s\n' bench-attention-sdpa-peer skipped - "no python with torch" | tee -a "$SUMMARY"
        fi
    fi
    step bench-gpt2-350m-bf16 90 "${B[@]}" --config gpt2-350m --device cuda --precision bf16 --steps 10 --warmup 3
    step bench-gpt2-124m-bf16-materialised 60 "${B[@]}" --config gpt2-124m --device cuda --precision bf16 \
        --attention materialised --steps 10 --warmup 2
}

# Why the kernels are as fast as they are: what the next change should aim at (docs/CUDA.md).
profile() {
    local ncu stall stalls="" m
    ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu \
          2>/dev/null | head -1 || true)
    for stall in barrier long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait \
                 not_selected selected lg_throttle dispatch_stall no_instruction branch_resolving; do
        stalls+=",smsp__average_warps_issue_stalled_${stall}_per_issue_active.ratio"
    done
    m="gpu__time_duration.sum,launch__registers_per_thread,launch__occupancy_limit_registers"
    m+=",launch__occupancy_limit_shared_mem,sm__warps_active.avg.pct_of_peak_sustained_active"
    m+=",sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
    m+=",sm__inst_executed.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum"
    m+=",l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"
    # instructions executed: with the no_instruction stalls, what showed the dq kernel's code
    # size (2026-11-28) to be its limit
    m+=",dram__bytes.sum,sm__inst_executed.sum$stalls"
    if [[ -z "$ncu" ]]; then
        printf '%-34s %-8s %5s  %s\n' profile-flash-tc-ncu skipped - "ncu not found" | tee -a "$SUMMARY"
        failures=$((failures + 1))
    else
        step profile-flash-tc-ncu 150 "$RUN" "$ncu" -k regex:flash_tc --launch-count 3 \
            --metrics "$m" "$BUNDLE/bin/ctxengine" bench attention --device cuda --precision bf16 \
            --head-dim 128 --T 4096 --pe none --steps 1 --repeats 1 --warmup 0
        # GPT-2's attention (head dim 64, T 1024), whose backward is most of its cost
        step profile-flash-tc-ncu-d64 150 "$RUN" "$ncu" -k regex:flash_tc --launch-count 3 \
            --metrics "$m" "$BUNDLE/bin/ctxengine" bench attention --device cuda --precision bf16 \
            --head-dim 64 --T 1024 --pe none --steps 1 --repeats 1 --warmup 0
    fi
    step profile-gpt2-124m-bf16 120 "$RUN" ctxengine bench --config gpt2-124m --device cuda \
        --precision bf16 --steps 5 --warmup 2 --profile
    # A/B of the choices with a switch: cuBLASLt epilogues off; the head's chunk budget
    local ab=(--config gpt2-124m --device cuda --precision bf16 --steps 10 --warmup 3)
    step ab-gpt2-124m-bf16-default 60 "$RUN" ctxengine bench "${ab[@]}"
    step ab-gpt2-124m-bf16-no-cublaslt 60 env CTX_CUBLASLT=0 "$RUN" ctxengine bench "${ab[@]}"
    step ab-gpt2-124m-bf16-fp32-activations 60 env CTX_BF16_ACTIVATIONS=0 "$RUN" ctxengine bench \
        "${ab[@]}"
    step ab-gpt2-124m-bf16-mlp-gelu-kernel 60 env CTX_MLP_GELU=kernel "$RUN" ctxengine bench \
        "${ab[@]}"
    step ab-gpt2-124m-bf16-lm-head-64mib 60 env CTX_LM_HEAD_CHUNK_MIB=64 "$RUN" ctxengine bench "${ab[@]}"
    step ab-gpt2-124m-bf16-lm-head-1gib 60 env CTX_LM_HEAD_CHUNK_MIB=1024 "$RUN" ctxengine bench "${ab[@]}"
}

# tests_then_bench SECONDS BENCH: the tests within SECONDS of the budget (so slow tests cannot
# starve the benchmarks), then BENCH with what is left.
tests_then_bench() {
    DEADLINE=$((START + $1))
    ((DEADLINE > START + BUDGET)) && DEADLINE=$((START + BUDGET))
    tests
    DEADLINE=$((START + BUDGET))
    "$2"
}

# The numbers that track issue 17, in one device call after the tests (docs/BENCHMARKS.md).
quick_bench() {
    local B=("$RUN" ctxengine bench) ncu cs m stall d peer="$BUNDLE/benchmarks/sdpa_peer.py"
    step bench-gpt2-124m-bf16 60 "${B[@]}" --config gpt2-124m --device cuda --precision bf16 \
        --steps 20 --warmup 3
    # at B 64 (T 1024), the per-GPU batch of llm.c's GPT-2 124M run, the goal's peer: the
    # products 8x larger than at the bench's default B 8
    step bench-gpt2-124m-bf16-b64 60 "${B[@]}" --config gpt2-124m --device cuda --precision bf16 \
        --batch 64 --steps 10 --warmup 2
    # A/B: the activations kept in fp32 and rounded by each product (before 2026-11-28)
    step ab-gpt2-124m-bf16-fp32-activations 60 env CTX_BF16_ACTIVATIONS=0 "${B[@]}" \
        --config gpt2-124m --device cuda --precision bf16 --steps 20 --warmup 3
    # A/B: the MLP's GELU and its derivative from the products' epilogues in bf16 (2026-12-06)
    # against the fp32 products and the activation kernels
    step ab-gpt2-124m-bf16-mlp-gelu-kernel 60 env CTX_MLP_GELU=kernel "${B[@]}" \
        --config gpt2-124m --device cuda --precision bf16 --steps 20 --warmup 3
    # where a step's milliseconds go now: each op's device time from two event marks (no wait
    # per op), then the 2026-11-28 profile's method (a wait after each op) to compare with it
    step profile-gpt2-124m-bf16 60 "${B[@]}" --config gpt2-124m --device cuda --precision bf16 \
        --steps 5 --warmup 2 --profile
    step profile-gpt2-124m-bf16-sync 60 env CTX_PROFILE_SYNC=1 "${B[@]}" --config gpt2-124m \
        --device cuda --precision bf16 --steps 5 --warmup 2 --profile
    for d in 64 128; do
        step "bench-attention-d$d-bf16" 60 "${B[@]}" attention --device cuda --precision bf16 \
            --head-dim $d --T 1024,4096,16384 --pe none,alibi,kerple_log --steps 5 --repeats 2
    done
    # A/B: the one-kernel backward (dq by atomic adds) against the two kernels above
    for d in 64 128; do
        step "ab-attention-d$d-bf16-atomic-dq" 60 env CTX_FLASH_BACKWARD=atomic "${B[@]}" \
            attention --device cuda --precision bf16 --head-dim $d --T 1024,4096,16384 \
            --pe none,alibi,kerple_log --steps 5 --repeats 2
    done
    # A/B: the forward on wgmma (sm_90's warpgroup instruction, 2026-12-05) against mma.sync;
    # the forward column is the one that differs
    for d in 64 128; do
        step "ab-attention-d$d-bf16-wgmma-fwd" 45 env CTX_FLASH_FORWARD=wgmma "${B[@]}" \
            attention --device cuda --precision bf16 --head-dim $d --T 1024,4096,16384 \
            --pe none,alibi,kerple_log --steps 5 --repeats 2
    done
    # and the backward's two kernels on wgmma (the backward column differs; each kernel's time
    # against the mma.sync ones' in the ncu steps below); GPT-2 with the forward, and with all
    for d in 64 128; do
        step "ab-attention-d$d-bf16-wgmma-bwd" 45 env CTX_FLASH_DQ=wgmma CTX_FLASH_DKV=wgmma \
            "${B[@]}" attention --device cuda --precision bf16 --head-dim $d \
            --T 1024,4096,16384 --pe none,alibi,kerple_log --steps 5 --repeats 2
    done
    # the wgmma forward's KERPLE-log computed (MUFU) against looked up (the default, in -wgmma-fwd)
    for d in 64 128; do
        step "ab-attention-d$d-bf16-wgmma-fwd-kerple-computed" 30 env CTX_FLASH_FORWARD=wgmma \
            CTX_FLASH_FORWARD_KERPLE=computed "${B[@]}" attention --device cuda --precision bf16 \
            --head-dim $d --T 1024,4096,16384 --pe kerple_log --steps 5 --repeats 2
    done
    # the three wgmma kernels with a producer warpgroup and named barriers (2026-12-06): the
    # forward column against -wgmma-fwd's, the backward column against -wgmma-bwd's
    for d in 64 128; do
        step "ab-attention-d$d-bf16-wgmma-producer" 45 env CTX_FLASH_FORWARD=wgmma \
            CTX_FLASH_DQ=wgmma CTX_FLASH_DKV=wgmma CTX_FLASH_WGMMA_PIPELINE=producer "${B[@]}" \
            attention --device cuda --precision bf16 --head-dim $d --T 1024,4096,16384 \
            --pe none,alibi,kerple_log --steps 5 --repeats 2
    done
    # the producer kernels with their tiles by TMA into 128-byte swizzled tiles and mbarriers
    # (2026-12-06): both columns against -wgmma-producer's (the same kernels by cp.async)
    for d in 64 128; do
        step "ab-attention-d$d-bf16-wgmma-tma" 45 env CTX_FLASH_FORWARD=wgmma \
            CTX_FLASH_DQ=wgmma CTX_FLASH_DKV=wgmma CTX_FLASH_WGMMA_PIPELINE=producer \
            CTX_FLASH_WGMMA_LOADS=tma "${B[@]}" attention --device cuda --precision bf16 \
            --head-dim $d --T 1024,4096,16384 --pe none,alibi,kerple_log --steps 5 --repeats 2
    done
    # the wgmma kernels in blocks of one warpgroup against two (the default above)
    step ab-attention-d128-bf16-wgmma-1wg 45 env CTX_FLASH_FORWARD=wgmma CTX_FLASH_DQ=wgmma \
        CTX_FLASH_DKV=wgmma CTX_FLASH_WGMMA_WARPGROUPS=1 "${B[@]}" attention --device cuda \
        --precision bf16 --head-dim 128 --T 1024,4096,16384 --pe none --steps 5 --repeats 2
    step ab-attention-d128-bf16-wgmma-all 45 env CTX_FLASH_FORWARD=wgmma CTX_FLASH_DQ=wgmma \
        CTX_FLASH_DKV=wgmma "${B[@]}" attention --device cuda --precision bf16 --head-dim 128 \
        --T 1024,4096,16384 --pe none --steps 5 --repeats 2
    step ab-gpt2-124m-bf16-wgmma-fwd 60 env CTX_FLASH_FORWARD=wgmma "${B[@]}" \
        --config gpt2-124m --device cuda --precision bf16 --steps 20 --warmup 3
    step ab-gpt2-124m-bf16-wgmma-all 60 env CTX_FLASH_FORWARD=wgmma CTX_FLASH_DQ=wgmma \
        CTX_FLASH_DKV=wgmma "${B[@]}" --config gpt2-124m --device cuda --precision bf16 \
        --steps 20 --warmup 3
    step ab-gpt2-124m-bf16-wgmma-producer 60 env CTX_FLASH_FORWARD=wgmma CTX_FLASH_DQ=wgmma \
        CTX_FLASH_DKV=wgmma CTX_FLASH_WGMMA_PIPELINE=producer "${B[@]}" --config gpt2-124m \
        --device cuda --precision bf16 --steps 20 --warmup 3
    step ab-gpt2-124m-bf16-wgmma-tma 60 env CTX_FLASH_FORWARD=wgmma CTX_FLASH_DQ=wgmma \
        CTX_FLASH_DKV=wgmma CTX_FLASH_WGMMA_PIPELINE=producer CTX_FLASH_WGMMA_LOADS=tma \
        "${B[@]}" --config gpt2-124m --device cuda --precision bf16 --steps 20 --warmup 3
    # A/B: the forward at one m-tile per warp (the layout before 2026-11-28) against two
    for d in 64 128; do
        step "ab-attention-d$d-bf16-fwd-1mtile" 45 env CTX_FLASH_FORWARD_MTILES=1 "${B[@]}" \
            attention --device cuda --precision bf16 --head-dim $d --T 1024,4096,16384 \
            --pe none,kerple_log --steps 5 --repeats 2
    done
    step ab-gpt2-124m-bf16-atomic-dq 60 env CTX_FLASH_BACKWARD=atomic "${B[@]}" \
        --config gpt2-124m --device cuda --precision bf16 --steps 20 --warmup 3
    # the one-kernel backward on wgmma (head dims 64 and 128 since 2026-12-06, dq's columns
    # split over a block's two warpgroups; no bias-parameter gradients: none and alibi here,
    # kerple_log's learned a, b take the mma.sync one): its backward column against
    # -wgmma-bwd's and -atomic-dq's; GPT-2 against -wgmma-all
    for d in 64 128; do
        step "ab-attention-d$d-bf16-wgmma-atomic-dq" 45 env CTX_FLASH_BACKWARD=atomic \
            CTX_FLASH_FORWARD=wgmma CTX_FLASH_DKV=wgmma "${B[@]}" attention --device cuda \
            --precision bf16 --head-dim $d --T 1024,4096,16384 --pe none,alibi --steps 5 \
            --repeats 2
    done
    # dq an entry an atomic (the layout before 2026-12-06's four-column atomics): against
    # ab-attention-d128-bf16-wgmma-atomic-dq, none only (whether L2's atomic rate bounds it)
    step ab-attention-d128-bf16-wgmma-atomic-dq-scalar 35 env CTX_FLASH_BACKWARD=atomic \
        CTX_FLASH_DQ_ATOMICS=scalar CTX_FLASH_FORWARD=wgmma CTX_FLASH_DKV=wgmma "${B[@]}" \
        attention --device cuda --precision bf16 --head-dim 128 --T 1024,4096,16384 \
        --pe none --steps 5 --repeats 2
    # its producer form (2026-12-06; the forward's too): against the lock-step one above
    step ab-attention-d128-bf16-wgmma-atomic-dq-producer 45 env CTX_FLASH_BACKWARD=atomic \
        CTX_FLASH_FORWARD=wgmma CTX_FLASH_DKV=wgmma CTX_FLASH_WGMMA_PIPELINE=producer "${B[@]}" \
        attention --device cuda --precision bf16 --head-dim 128 --T 1024,4096,16384 \
        --pe none,alibi --steps 5 --repeats 2
    step ab-gpt2-124m-bf16-wgmma-atomic-dq 60 env CTX_FLASH_BACKWARD=atomic \
        CTX_FLASH_FORWARD=wgmma CTX_FLASH_DKV=wgmma "${B[@]}" --config gpt2-124m --device cuda \
        --precision bf16 --steps 20 --warmup 3
    # A/B: RoPE inside the flash kernels (2026-12-05) against its rotary passes of their own
    step bench-gpt2-124m-bf16-rope 60 "${B[@]}" --config gpt2-124m --device cuda \
        --precision bf16 --pe rope --steps 20 --warmup 3
    step ab-gpt2-124m-bf16-rope-separate 60 env CTX_FLASH_ROTARY=separate "${B[@]}" \
        --config gpt2-124m --device cuda --precision bf16 --pe rope --steps 20 --warmup 3
    for m in fused separate; do
        step "ab-attention-d128-bf16-rope-$m" 45 env CTX_FLASH_ROTARY=$m "${B[@]}" attention \
            --device cuda --precision bf16 --head-dim 128 --T 1024,4096,16384 --pe none,rope \
            --steps 5 --repeats 2
    done
    if [[ -f "$peer" ]] && python3 -c "import torch" 2>/dev/null; then
        step bench-attention-sdpa-peer 60 python3 "$peer" --device cuda --head-dim 64,128 \
            --T 1024,4096,16384 --dtype bf16 --pe none --steps 3 --repeats 2
    fi
    # the sanitizers on what is new since the last GPU run: the full-tile loops of the flash
    # kernels (racecheck) and the bf16 activation kernels (memcheck)
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer \
         /usr/local/cuda*/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1 || true)
    if [[ -n "$cs" ]]; then
        step racecheck-flash-full-tiles 90 "$RUN" "$cs" --tool racecheck --error-exitcode 99 \
            --print-limit 10 "$BUNDLE/tests/test_ops_gpu_flash" --gtest_filter='*Bf16*full_tiles*'
        step memcheck-bf16-activations 60 "$RUN" "$cs" --tool memcheck --error-exitcode 99 \
            --print-limit 10 "$BUNDLE/tests/test_ops_gpu_bf16_acts"
        # the one-kernel attention backward (atomic dq; mma.sync and wgmma) and the
        # one-launch AdamW
        step memcheck-atomic-dq 60 "$RUN" "$cs" --tool memcheck --error-exitcode 99 \
            --print-limit 10 "$BUNDLE/tests/test_ops_gpu_flash" \
            --gtest_filter='*AtomicDq*d64*:*AtomicDq*d128*:*AtomicDq*full_tiles*:*WgmmaAtomic*'
        step memcheck-adamw-segments 30 "$RUN" "$cs" --tool memcheck --error-exitcode 99 \
            --print-limit 10 "$BUNDLE/tests/test_ops_gpu_adamw"
        # the page-locked upload ring (wraps, waits on its events, the pageable fallback)
        step memcheck-upload-ring 30 "$RUN" "$cs" --tool memcheck --error-exitcode 99 \
            --print-limit 10 "$BUNDLE/tests/test_ops_gpu_uploads"
        # the one-kernel backward's shared dS^T tile (written by every warp, read by all; the
        # wgmma form's read by the tensor core)
        step racecheck-atomic-dq 60 "$RUN" "$cs" --tool racecheck --error-exitcode 99 \
            --print-limit 10 "$BUNDLE/tests/test_ops_gpu_flash" \
            --gtest_filter='*AtomicDq*d64*:*AtomicDq*full_tiles*:*WgmmaAtomic*'
        # the forward's 128-query blocks (two m-tiles a warp): T = 1, odd T, windows, D 128;
        # KERPLE-log's tables (device-side decision, fill, clamped lookups)
        step memcheck-flash-forward 45 "$RUN" "$cs" --tool memcheck --error-exitcode 99 \
            --print-limit 10 "$BUNDLE/tests/test_ops_gpu_flash" \
            --gtest_filter='*Bf16TensorCores*none_*:*Bf16TensorCores*t5_packed_d128*:*Bf16ForwardAlone*'
        step memcheck-kerple-tables 45 "$RUN" "$cs" --tool memcheck --error-exitcode 99 \
            --print-limit 10 "$BUNDLE/tests/test_ops_gpu_flash" \
            --gtest_filter='*Kerple*:*Bf16TensorCores*kerple_log_int*'
        # the MLP activation's backward written in bf16 for fc's products (odd widths: padding)
        step memcheck-mlp-backward 30 "$RUN" "$cs" --tool memcheck --error-exitcode 99 \
            --print-limit 10 "$BUNDLE/tests/test_ops_gpu_mlp_backward"
        # the MLP's backward in one op (GELU's derivative in cuBLASLt's epilogue, 2026-12-06)
        step memcheck-mlp-backward-fused 30 "$RUN" "$cs" --tool memcheck --error-exitcode 99 \
            --print-limit 10 "$BUNDLE/tests/test_ops_gpu_mlp_backward_fused"
        # the norm forward's rows in registers (widths 8 to 1056: every K bucket and the loop)
        step memcheck-norm-forward 30 "$RUN" "$cs" --tool memcheck --error-exitcode 99 \
            --print-limit 10 "$BUNDLE/tests/test_ops_gpu_consistency" --gtest_filter='*LayerNorm*'
        # the wgmma forward, dq and dk / dv kernels (descriptors into their shared tiles; T = 1,
        # odd T, windows, D 128)
        step memcheck-wgmma-flash 60 "$RUN" "$cs" --tool memcheck --error-exitcode 99 \
            --print-limit 10 "$BUNDLE/tests/test_ops_gpu_flash" \
            --gtest_filter='*Wgmma*none_*:*Wgmma*kerple*'
        # the producer kernels' stages handed over by named barriers or (their TMA form)
        # mbarriers (positions read by plain loads, the tiles by the tensor core), and their
        # barrier use (synccheck)
        step racecheck-wgmma-producer 60 "$RUN" "$cs" --tool racecheck --error-exitcode 99 \
            --print-limit 10 "$BUNDLE/tests/test_ops_gpu_flash" --gtest_filter='*Producer*'
        step synccheck-wgmma-producer 60 "$RUN" "$cs" --tool synccheck --error-exitcode 99 \
            --print-limit 10 "$BUNDLE/tests/test_ops_gpu_flash" \
            --gtest_filter='*Producer*:OpsGpuFlashWgmmaAtomic.*'
        # the rotation table and the fused rotary epilogues (table reads at the last rows)
        step memcheck-flash-rotary 45 "$RUN" "$cs" --tool memcheck --error-exitcode 99 \
            --print-limit 10 "$BUNDLE/tests/test_ops_gpu_flash_rotary"
    fi
    ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu \
          2>/dev/null | head -1 || true)
    [[ -z "$ncu" ]] && return
    m="gpu__time_duration.sum,launch__registers_per_thread,sm__inst_executed.sum"
    m+=",sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
    m+=",sm__warps_active.avg.pct_of_peak_sustained_active"
    for stall in no_instruction long_scoreboard short_scoreboard wait barrier; do
        m+=",smsp__average_warps_issue_stalled_${stall}_per_issue_active.ratio"
    done
    # the forward against the shared-memory model (docs/CUDA.md "Shared-memory bandwidth"):
    # tensor-pipe activity and shared-memory wavefronts per kernel, D 64 and 128
    for d in 64 128; do
        step "profile-flash-tc-fwd-ncu-d$d" 60 "$RUN" "$ncu" -k regex:flash_tc_fwd \
            --launch-count 1 --metrics "$m,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum" \
            "$BUNDLE/bin/ctxengine" bench attention --device cuda --precision bf16 \
            --head-dim $d --T 4096 --pe none --steps 1 --repeats 1 --warmup 0
    done
    step profile-flash-tc-bwd-ncu-d64 60 "$RUN" "$ncu" -k regex:flash_tc_d --launch-count 2 \
        --metrics "$m" "$BUNDLE/bin/ctxengine" bench attention --device cuda --precision bf16 \
        --head-dim 64 --T 1024 --pe none --steps 1 --repeats 1 --warmup 0
    step profile-flash-tc-bwd-ncu-d64-atomic-dq 60 env CTX_FLASH_BACKWARD=atomic "$RUN" "$ncu" \
        -k regex:flash_tc_dkv --launch-count 1 --metrics "$m" "$BUNDLE/bin/ctxengine" bench \
        attention --device cuda --precision bf16 --head-dim 64 --T 1024 --pe none --steps 1 \
        --repeats 1 --warmup 0
    # the wgmma kernels (forward, dq, dk / dv), each against its mma.sync kernel above (the
    # backward's at D 64 / T 1k, the forward's at D 128 / T 4k)
    step profile-flash-wg-producer-ncu-d128 60 env CTX_FLASH_FORWARD=wgmma CTX_FLASH_DQ=wgmma \
        CTX_FLASH_DKV=wgmma CTX_FLASH_WGMMA_PIPELINE=producer "$RUN" "$ncu" -k regex:flash_wg \
        --launch-count 3 \
        --metrics "$m" "$BUNDLE/bin/ctxengine" bench attention --device cuda --precision bf16 \
        --head-dim 128 --T 4096 --pe none --steps 1 --repeats 1 --warmup 0
    step profile-flash-wg-tma-ncu-d128 60 env CTX_FLASH_FORWARD=wgmma CTX_FLASH_DQ=wgmma \
        CTX_FLASH_DKV=wgmma CTX_FLASH_WGMMA_PIPELINE=producer CTX_FLASH_WGMMA_LOADS=tma "$RUN" \
        "$ncu" -k regex:flash_wg --launch-count 3 \
        --metrics "$m" "$BUNDLE/bin/ctxengine" bench attention --device cuda --precision bf16 \
        --head-dim 128 --T 4096 --pe none --steps 1 --repeats 1 --warmup 0
    for dt in 64:1024 128:4096; do
        step "profile-flash-wg-ncu-d${dt%:*}" 60 env CTX_FLASH_FORWARD=wgmma CTX_FLASH_DQ=wgmma \
            CTX_FLASH_DKV=wgmma "$RUN" "$ncu" -k regex:flash_wg --launch-count 3 --metrics "$m" \
            "$BUNDLE/bin/ctxengine" bench attention --device cuda --precision bf16 \
            --head-dim "${dt%:*}" --T "${dt#*:}" --pe none --steps 1 --repeats 1 --warmup 0
    done
}

sanitize() {
    local tool=${1:-memcheck} cs t filter=()
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer \
         /usr/local/cuda*/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1 || true)
    if [[ -z "$cs" ]]; then
        echo "sanitize: compute-sanitizer not found (PATH, /usr/local/cuda*/bin)" | tee -a "$SUMMARY"
        failures=$((failures + 1))
        return
    fi
    [[ -n "${CTX_SANITIZE_FILTER:-}" ]] && filter=(--gtest_filter="$CTX_SANITIZE_FILTER")
    for t in $(gpu_tests); do
        step "sanitize-$tool-$t" "${CTX_TEST_TIMEOUT_S:-300}" "$RUN" "$cs" --tool "$tool" \
            --error-exitcode 99 --print-limit 20 "$BUNDLE/tests/$t" "${filter[@]}" \
            --gtest_output="xml:$OUT/tests/sanitize-$tool-$t.xml"
    done
}

echo "gpu_validate: $mode, output in $OUT" >&2
report
case "$mode" in
all) tests_then_bench "${CTX_TESTS_BUDGET_S:-240}" bench ;;
quick) tests_then_bench "${CTX_TESTS_BUDGET_S:-120}" quick_bench ;;
tests) tests ;;
bench) bench ;;
profile) profile ;;
sanitize) sanitize "${2:-memcheck}" ;;
esac

{
    echo
    echo "$failures step(s) not ok; $(($(date +%s) - START)) s in all; logs in $OUT/logs"
} | tee -a "$SUMMARY"
if [[ "${CTX_VALIDATE_PACK:-0}" == 1 ]]; then
    tar czf "$OUT/logs.tar.gz" -C "$OUT" logs tests && rm -rf "$OUT/logs" "$OUT/tests" &&
        echo "logs and test XML packed into $OUT/logs.tar.gz" | tee -a "$SUMMARY"
fi
((failures == 0))
