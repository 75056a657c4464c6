#!/usr/bin/env bash
# preempt.sh MPIEXEC CTXENGINE WORKDIR: preemption and auto-resume under mpirun -np 2.
#   1. tests/cli/preempt.lua uninterrupted (the reference)
#   2. the same, stopped by SIGUSR1 once 60 steps are in metrics.jsonl: must exit 75 with a
#      checkpoint; then the same command again: must finish
#   3. the final fingerprints (parameters, moments, step) and every step's loss must equal the
#      reference's
set -u
mpiexec=$1 exe=$2 work=$3
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rm -rf "$work" && mkdir -p "$work"
# stdout (the printed fingerprints) to RUN.log, stderr (the log, errors) to RUN.err: mpirun
# forwards the two streams independently, so in one file a log line can split a printed line
run() { "$mpiexec" --allow-run-as-root --oversubscribe -np 2 "$exe" --threads 1 \
          "$here/preempt.lua" "$1" >> "$1.log" 2>> "$1.err"; }
run "$work/ref" || { echo "reference run failed"; cat "$work/ref.log" "$work/ref.err"; exit 1; }
mkdir -p "$work/run"
run "$work/run" &
pid=$!
for _ in $(seq 1 600); do  # up to 60 s for 60 steps
  n=$(grep -c '"type":"train"' "$work/run/metrics.jsonl" 2>/dev/null || true)
  [ "${n:-0}" -ge 60 ] && break
  sleep 0.1
done
pkill -USR1 -f "ctxengine --threads 1 $here/preempt.lua $work/run" || true
wait $pid; rc=$?
[ $rc -eq 75 ] ||
  { echo "preempted run: expected exit 75, got $rc"; cat "$work/run.log" "$work/run.err"; exit 1; }
grep -q "stopped by SIGUSR1 after optimizer step" "$work/run.err" ||
  { echo "no stop message"; cat "$work/run.log" "$work/run.err"; exit 1; }
[ -f "$work/run/ckpt/latest" ] || { echo "no checkpoint written"; exit 1; }
run "$work/run" || { echo "resumed run failed"; cat "$work/run.log" "$work/run.err"; exit 1; }
grep -q "resumed from" "$work/run.err" || { echo "the rerun did not resume"; exit 1; }
fp() { grep -Eo "rank 0 fingerprint [0-9a-f]+" "$1" | tail -1; }
[ -n "$(fp "$work/ref.log")" ] && [ "$(fp "$work/ref.log")" = "$(fp "$work/run.log")" ] ||
  { echo "final state differs: $(fp "$work/ref.log") vs $(fp "$work/run.log")"; exit 1; }
losses() { python3 -c 'import json,sys
rows=[json.loads(l) for l in open(sys.argv[1]) if "\"train\"" in l]
print("\n".join("%d %.9g" % (r["step"], r["loss"]) for r in rows))' "$1"; }
if ! diff <(losses "$work/ref/metrics.jsonl") <(losses "$work/run/metrics.jsonl") > "$work/diff.txt"; then
  echo "per-step losses differ:"; head "$work/diff.txt"; exit 1
fi
stopped=$(grep -Eo "stopped by SIGUSR1 after optimizer step [0-9]+" "$work/run.err" | head -1)
echo "ok: $stopped, resumed, 400 steps and the final state equal the uninterrupted run's"
