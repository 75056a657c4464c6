#!/usr/bin/env bash
# gpu_digest.sh REPO DIR: scripts/gpu_digest.py on the 2026-11-28 H100 run's logs laid out as
# gpu_validate.sh writes them (logs/NAME.log after a `$ COMMAND` line, summary.txt), with the
# 2026-11-27 run as the baseline; the digest must carry the logs' numbers to their tables. Two
# copies with a changed command only (an env switch, --batch 64) check the A/B pairing.
set -u
repo=$1; dir=$2
run=$repo/docs/gpu_runs/2026-11-28-h100
rm -rf "$dir"; mkdir -p "$dir/out/logs"
L=$dir/out/logs B="/b/run.sh ctxengine bench"
ab="--config gpt2-124m --device cuda --precision bf16 --steps 20 --warmup 3"
log() { local name=$1 cmd=$2 src=$3; { echo "\$ $cmd"; cat "$src"; } >"$L/$name.log"; }
log bench-gpt2-124m-bf16 "$B $ab" "$run/gpt2_124m_bf16_default.log"
log ab-gpt2-124m-bf16-no-cublaslt "env CTX_CUBLASLT=0 $B $ab" "$run/gpt2_124m_bf16_no-cublaslt.log"
log bench-gpt2-124m-bf16-b64 "$B $ab --batch 64" "$run/gpt2_124m_bf16_default.log"
log profile-gpt2-124m-bf16 "$B $ab --profile" "$run/gpt2_124m_bf16_profile.log"
for d in 64 128; do
  log "bench-attention-d$d-bf16" "$B attention --device cuda --precision bf16 --head-dim $d" \
    "$run/attention_d${d}_bf16.log"
done
log ab-attention-d128-bf16-atomic-dq "env CTX_FLASH_BACKWARD=atomic $B attention --head-dim 128" \
  "$run/attention_d128_bf16.log"
log bench-attention-sdpa-peer "python3 sdpa_peer.py" "$run/sdpa_peer_bf16.log"
printf '%s\n' "gpu: NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB, 9.0, 1980 MHz" \
  "nvidia-smi                         ok          1s  " \
  "racecheck-flash-full-tiles         FAIL(99)    3s  error" >"$dir/out/summary.txt"
digest=$repo/scripts/gpu_digest.py
out=$(python3 "$digest" "$dir/out" --baseline "$repo/docs/gpu_runs/2026-11-27-h100") ||
  { echo "gpu_digest failed: $out"; exit 1; }
fail=0
expect() {
  grep -qF -- "$1" <<<"$out" || { echo "missing: $1"; fail=1; }
}
expect "GPU: NVIDIA H100 80GB HBM3"
expect "steps: 1 ok, 1 not ok"
expect "racecheck-flash-full-tiles         FAIL(99)"
expect '| `bench-gpt2-124m-bf16` | gpt2-124m bf16 | 8 | learned | 160,311 | 0.130 | 7,736 | - |'
expect '| 153,141 | 0.124 | 7,704 | -4.5% vs `bench-gpt2-124m-bf16` |'
expect '| 160,311 | 0.130 | 7,736 | +0.0% vs `bench-gpt2-124m-bf16` |'
expect '| 16384 | kerple_log | 61.2 | 61.2 (+0.0%) | 63.6 | +76.9% | - |'
expect '| 1024 | none | 34.3 | 36.7 | - | 225.2 |'
expect '| attention_backward | B=8 T=1024 C=768 H=12 flash | 12 | 16.617 | 27.3% |'
expect "- MFU, GPT-2 124M bf16, B 8: 0.130 against 0.5 (not met)"
expect "- attention, D 128, none: 45.6-108.3 TFLOP/s against 300 (not met)"
expect "- kerple_log over none: +28.3% to +90.9% against <= 5% (not met)"
# the profile's run is not a row of the training table (its timing carries the marks)
grep -q '^| `profile-gpt2-124m-bf16` | gpt2' <<<"$out" &&
  { echo "profile run in the training table"; fail=1; }
# a directory with no logs is refused
mkdir -p "$dir/empty"
msg=$(python3 "$digest" "$dir/empty" 2>&1) && { echo "empty dir accepted"; fail=1; }
grep -q "no .log files in" <<<"$msg" || { echo "no message for an empty dir: $msg"; fail=1; }
if [[ $fail != 0 ]]; then echo "---- digest"; echo "$out"; exit 1; fi
echo "gpu_digest carries the run's numbers"
