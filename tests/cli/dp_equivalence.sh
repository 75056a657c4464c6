#!/usr/bin/env bash
# dp_equivalence.sh MPIEXEC CTXENGINE RECIPE DIR
# 1 process x 4 rows vs 2 ranks x 2 rows per step: losses agree to float tolerance (the
# all-reduce sums in another order) and the two ranks are bit-identical after every step.
set -u
mpiexec=$1; exe=$2; recipe=$3; dir=$4
# stdout only (the parsed lines): mpirun forwards stderr (the log) independently, and in one
# stream a log line can split a printed line
err=$(mktemp); trap 'rm -f "$err"' EXIT
single=$("$exe" --threads 1 "$recipe" 4 "$dir" 2>"$err") || { echo "$single"; cat "$err"; exit 1; }
multi=$("$mpiexec" --allow-run-as-root --oversubscribe -np 2 "$exe" --threads 1 "$recipe" 2 "$dir" \
  2>"$err") || { echo "$multi"; cat "$err"; exit 1; }
python3 - "$single" "$multi" <<'PY'
import re, sys
pat = re.compile(r"^step (\d+) rank (\d+) loss (\S+) fp (\S+)$", re.M)
single = {int(s): (float(l), f) for s, r, l, f in pat.findall(sys.argv[1])}
multi = {}
for s, r, l, f in pat.findall(sys.argv[2]):
    multi.setdefault(int(s), {})[int(r)] = (float(l), f)
assert len(single) == 6 and len(multi) == 6, (sys.argv[1], sys.argv[2])
for step in range(1, 7):
    l1, _ = single[step]
    r0, r1 = multi[step][0], multi[step][1]
    assert r0[1] == r1[1], f"step {step}: ranks differ ({r0[1]} vs {r1[1]})"
    assert r0[0] == r1[0], f"step {step}: ranks report different losses"
    rel = abs(l1 - r0[0]) / abs(l1)
    assert rel < 1e-5, f"step {step}: 1 process {l1} vs 2 ranks {r0[0]} (rel {rel:.2e})"
    print(f"step {step}: loss {l1:.6f} vs {r0[0]:.6f} (rel {rel:.1e}), ranks identical {r0[1]}")
print("ok")
PY
