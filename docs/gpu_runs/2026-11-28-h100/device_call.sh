#!/usr/bin/env bash
# Session 12, device call 1: session 11's changes (fused lm head + loss, cuBLASLt epilogues,
# 64-query dk/dv tiles at D<=64, bf16 dbias in the rounding pass) on the GPU: tests, sanitizers on
# the new kernels, then the timings (GPT-2 124M A/B, attention tables, SDPA peer, ncu).
set -uo pipefail
R=$OUT; B=build-gpu-bundle; tar xzf gpu_session/bundle.tgz
T0=$(date +%s); W=/tmp/c4; mkdir -p $W
el() { echo $(( $(date +%s) - T0 )); }
source $B/run.sh
head -1 $B/BUNDLE_INFO.txt
OUT=$W/v CTX_VALIDATE_BUDGET_S=150 bash $B/gpu_validate.sh tests > $W/v_tests.out 2>&1
sed -n '/^nvidia-smi/,$p' $W/v/summary.txt; grep -h '^\[  FAILED' $W/v/logs/*.log | head -20
echo "== tests done at $(el)s"
cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
for t in test_ops_gpu_lm_head test_ops_gpu_blaslt test_ops_gpu_bf16; do
  timeout 60 $B/run.sh $cs --tool memcheck --error-exitcode 99 --print-limit 10 $B/tests/$t > $W/memcheck_$t.log 2>&1
  echo "memcheck $t rc=$? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' $W/memcheck_$t.log | paste -sd' ' | cut -c1-110)"
done
timeout 60 $B/run.sh $cs --tool racecheck --error-exitcode 99 --print-limit 10 $B/tests/test_ops_gpu_flash --gtest_filter='*Bf16*d64*:*Bf16*none_d128_long*' > $W/racecheck.log 2>&1
echo "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY|^\[  (PASSED|FAILED)' $W/racecheck.log | paste -sd' ')"
echo "== sanitizers done at $(el)s"
BB="$B/run.sh ctxengine bench"
ab="--config gpt2-124m --device cuda --precision bf16 --steps 20 --warmup 3"
for v in "default:" "no-cublaslt:CTX_CUBLASLT=0" "head-64mib:CTX_LM_HEAD_CHUNK_MIB=64" "head-1gib:CTX_LM_HEAD_CHUNK_MIB=1024"; do
  n=${v%%:*}; e=${v#*:}
  timeout 60 env $e $BB $ab > $W/gpt2_124m_bf16_$n.log 2>&1
  echo "gpt2-124m bf16 $n rc=$? $(grep -E '^(device|tokens_per_s|mfu|peak_memory_mib)=' $W/gpt2_124m_bf16_$n.log | paste -sd' ')"
done
grep -iE 'warn|fallback|unfused' $W/gpt2_124m_bf16_default.log | head -5
echo "== gpt2 done at $(el)s"
for d in 64 128; do
timeout 80 $BB attention --device cuda --precision bf16 --head-dim $d --T 1024,4096,16384 --pe none,alibi,kerple_log --steps 5 --repeats 2 > $W/attn_d${d}_bf16.log 2>&1
grep -E '^(mode|flash)' $W/attn_d${d}_bf16.log | cut -c1-140
done
echo "== attention done at $(el)s"
timeout 60 python3 $B/benchmarks/sdpa_peer.py --device cuda --head-dim 64,128 --T 1024,4096,16384 --dtype bf16 --pe none --steps 3 --repeats 2 > $W/sdpa.log 2>&1
grep -E 'bf16|dtype' $W/sdpa.log | cut -c1-110
echo "== sdpa done at $(el)s"
if (( $(el) < 300 )); then
timeout 40 $BB --config gpt2-124m --device cuda --precision bf16 --steps 5 --warmup 2 --profile > $W/gpt2_profile.log 2>&1
echo "profile rc=$?"; grep -vE '^\s*$' $W/gpt2_profile.log | tail -40 | cut -c1-120
fi
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
M=gpu__time_duration.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum
for st in barrier long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait not_selected; do M+=",smsp__average_warps_issue_stalled_${st}_per_issue_active.ratio"; done
for cfg in "64 1024" "128 4096"; do set -- $cfg
  (( $(el) > 370 )) && { echo "ncu d$1 skipped (time)"; continue; }
  timeout 60 $B/run.sh $NCU -k regex:flash_tc --launch-count 3 --metrics $M $B/bin/ctxengine bench attention --device cuda --precision bf16 --head-dim $1 --T $2 --pe none --steps 1 --repeats 1 --warmup 0 > $W/ncu_d$1.log 2>&1
  echo "ncu d$1 rc=$?"; grep -E 'flash_tc_|gpu__time|registers_per|warps_active|hmma|local_op|bank_conf|stalled' $W/ncu_d$1.log | sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//; s/ +/ /g' | cut -c1-100
done
echo "== all done at $(el)s"
tar czf $R/call4.tgz $W 2>/dev/null
