#!/usr/bin/env bash
# sdpa_peer_test.sh SOURCE_DIR: benchmarks/sdpa_peer.py on small CPU shapes with --check (its
# output and gradients against a float64 softmax reference, row by row), then its argument
# errors. Skipped (77) without PyTorch.
set -euo pipefail
src=$1
# Debian's python (where python3-torch lives), else whatever python3 is on PATH.
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)
"$py" -c "import torch" 2>/dev/null || { echo "SKIPPED: PyTorch is not installed"; exit 77; }
out=$("$py" "$src/benchmarks/sdpa_peer.py" --device cpu --T 48,96 --head-dim 16 --heads 3 \
      --steps 2 --repeats 1 --check)
echo "$out"
# one timed row per length for pe none, each checked (a relative error, no FAILED mark)
rows=$(grep -cE '^fp32 +16 +(48|96) +1 +3 none +[0-9.]+ +[0-9.]+ +[0-9.]+ .* [0-9.]+e-[0-9]+$' <<<"$out" || true)
[ "$rows" = 2 ] || { echo "FAIL: expected 2 checked rows for pe none, got $rows"; exit 1; }
# alibi: measured and checked on torch >= 2.0, named as skipped on older ones
grep -qE '^fp32 +16 +48 +1 +3 alibi +([0-9.]+ .* [0-9.]+e-[0-9]+|skipped \(torch < 2\.0)' <<<"$out" ||
  { echo "FAIL: no alibi row"; exit 1; }
for bad in "--pe foo:--pe: expected none or alibi, got 'foo'" "--T 1,x:--T: expected a comma-separated list, got '1,x'" \
           "--dtype fp16:--dtype: expected fp32 or bf16, got 'fp16'"; do
  args=${bad%%:*} want=${bad#*:}
  if err=$("$py" "$src/benchmarks/sdpa_peer.py" --device cpu $args 2>&1); then
    echo "FAIL: $args was accepted"; exit 1
  fi
  grep -qF -- "$want" <<<"$err" || { echo "FAIL: $args: expected '$want', got: $err"; exit 1; }
done
echo "sdpa_peer: ok"
