#!/usr/bin/env bash
# tensor_parallel.sh MPIEXEC CTXENGINE RECIPE DIR
# Tensor parallelism end to end (tests/cli/tensor_parallel.lua):
#   1 process vs tp 2 (with and without sequence parallelism), cp 2 and cp 2 x tp 2 (with and
#   without sequence parallelism; same
#   rows): the same losses and held-out loss to float tolerance;
#   dp 2 vs dp 2 x tp 2 (same rows per data-parallel rank): the same;
#   resharding: the checkpoint saved at dp 2 x tp 2 loads at dp 2 x tp 1, dp 2 x tp 2 and
#   dp 2 x cp 2 into
#   the same whole state (same fingerprint) and both continue with the same losses, on the same
#   grid bit for bit as the uninterrupted run (the
#   in-memory data source resumes at the same dp only; row streams resume at any); the HF export from
#   tp 2 loads in one process with the held-out loss tp 2 measured;
#   a row stream's checkpoint saved at dp 2 x tp 2 resumes at dp 4 and dp 2 x cp 2 (with
#   ZeRO-1), dp 2 and in
#   one process with the same state and continuation.
set -u
mpi=$1; exe=$2; recipe=$3; dir=$4
rm -rf "$dir"; mkdir -p "$dir"
run() {  # run NAME NP [--tp N] -- ARGS...
  local name=$1 np=$2; shift 2
  # stdout (the lines parsed below) apart from stderr (the log): mpirun forwards the two
  # streams independently, so in one file a log line can split a printed line
  local log="$dir/$name.log" err="$dir/$name.err"
  if [[ $np == 1 ]]; then "$exe" --threads 1 "$@" >"$log" 2>"$err"
  else "$mpi" --allow-run-as-root --oversubscribe -np "$np" "$exe" --threads 1 "$@" >"$log" 2>"$err"
  fi || { echo "run $name failed:"; cat "$log" "$err"; exit 1; }
}
run single 1 "$recipe" "$dir/single" 4
run tp2 2 --tp 2 "$recipe" "$dir/tp2" 4
run tp2sp 2 --tp 2 --sequence-parallel "$recipe" "$dir/tp2sp" 4
run cp2 2 --cp 2 "$recipe" "$dir/cp2" 4
run cp2tp2 4 --cp 2 --tp 2 "$recipe" "$dir/cp2tp2" 4
run cp2tp2sp 4 --cp 2 --tp 2 --sequence-parallel "$recipe" "$dir/cp2tp2sp" 4
run dp2 2 "$recipe" "$dir/dp2" 2
run dp2tp2 4 --tp 2 "$recipe" "$dir/dp2tp2" 2
run resume_tp1 2 "$recipe" "$dir/dp2tp2" 2 resume
run resume_tp2 4 --tp 2 "$recipe" "$dir/dp2tp2" 2 resume
run resume_cp2 4 --cp 2 "$recipe" "$dir/dp2tp2" 2 resume
run straight_dp2tp2 4 --tp 2 "$recipe" "$dir/dp2tp2" 2 straight
run hf_single 1 "$recipe" "$dir/tp2" 4 hf
run rows_dp2tp2 4 --tp 2 "$recipe" "$dir/rows" 2 rows
run rows_dp4 4 "$recipe" "$dir/rows" 1 rows_resume zero
run rows_dp2 2 "$recipe" "$dir/rows" 2 rows_resume
run rows_dp2cp2 4 --cp 2 "$recipe" "$dir/rows" 2 rows_resume zero
run rows_single 1 "$recipe" "$dir/rows" 4 rows_resume
python3 - "$dir" <<'PY'
import re, sys
d = sys.argv[1]
def read(name):
    return open(f"{d}/{name}.log").read()
def losses(name, key="step"):
    return [float(x) for x in re.findall(rf"^{key} \d+ loss (\S+)$", read(name), re.M)]
def value(name, key):
    m = re.search(rf"^{key} (\S+)$", read(name), re.M)
    assert m, f"{name}: no '{key}' line:\n{read(name)}"
    return m.group(1)
def close(a, b, what, tol=2e-5):
    assert len(a) == len(b) and a, f"{what}: {a} vs {b}"
    for i, (x, y) in enumerate(zip(a, b)):
        rel = abs(x - y) / abs(y)
        assert rel < tol, f"{what} [{i}]: {x} vs {y} (rel {rel:.2e})"
    print(f"{what}: {len(a)} values agree (max rel "
          f"{max(abs(x - y) / abs(y) for x, y in zip(a, b)):.1e})")
assert "dp 1 cp 1 tp 2" in read("tp2") and "dp 2 cp 1 tp 2" in read("dp2tp2"), "grids not as asked"
close(losses("tp2"), losses("single"), "tp 2 vs 1 process: losses")
assert "sequence_parallel true" in read("tp2sp"), "sequence parallelism not on"
close(losses("tp2sp"), losses("single"), "tp 2 sequence parallel vs 1 process: losses")
close(losses("cp2"), losses("single"), "cp 2 vs 1 process: losses")
close([float(value("cp2", "eval"))], [float(value("single", "eval"))], "cp 2 vs 1 process: held-out")
close(losses("cp2tp2"), losses("single"), "cp 2 x tp 2 vs 1 process: losses")
assert "sequence_parallel true" in read("cp2tp2sp"), "sequence parallelism not on at cp 2 x tp 2"
close(losses("cp2tp2sp"), losses("single"), "cp 2 x tp 2 sequence parallel vs 1 process: losses")
close([float(value("tp2", "eval"))], [float(value("single", "eval"))], "tp 2 vs 1 process: held-out")
close(losses("dp2tp2"), losses("dp2"), "dp 2 x tp 2 vs dp 2: losses")
a, b = value("resume_tp1", "resumed fingerprint"), value("resume_tp2", "resumed fingerprint")
c = value("resume_cp2", "resumed fingerprint")
assert a == b == c == value("dp2tp2", "fingerprint"), f"resharded states differ: {a} {b} {c}"
print(f"checkpoint of dp 2 x tp 2 loads at dp 2 x tp 1, dp 2 x tp 2 and dp 2 x cp 2 "
      f"bit-identically ({a})")
close(losses("resume_tp2", "resume step"), losses("resume_tp1", "resume step"),
      "resumed at tp 2 vs tp 1: losses")
close(losses("resume_cp2", "resume step"), losses("resume_tp1", "resume step"),
      "resumed at cp 2 vs tp 1: losses")
assert losses("resume_tp2", "resume step") == losses("straight_dp2tp2", "resume step"), \
    "same-grid resume at dp 2 x tp 2 differs from the uninterrupted run"
assert value("resume_tp2", "continued fingerprint") == value("straight_dp2tp2", "continued fingerprint")
print("same-grid resume at dp 2 x tp 2: bit-identical to the uninterrupted run")
close([float(value("hf_single", "hf eval"))], [float(value("tp2", "eval"))],
      "HF export of tp 2, loaded in 1 process: held-out")
saved = value("rows_dp2tp2", "rows fingerprint")
for name in ("rows_dp4", "rows_dp2", "rows_dp2cp2", "rows_single"):
    assert value(name, "resumed rows fingerprint") == saved, f"{name}: state differs from the save"
close(losses("rows_dp4", "rows resume step"), losses("rows_single", "rows resume step"),
      "row stream saved at dp 2 x tp 2, resumed at dp 4 (ZeRO-1) vs 1 process: losses")
close(losses("rows_dp2", "rows resume step"), losses("rows_single", "rows resume step"),
      "row stream saved at dp 2 x tp 2, resumed at dp 2 vs 1 process: losses")
close(losses("rows_dp2cp2", "rows resume step"), losses("rows_single", "rows resume step"),
      "row stream saved at dp 2 x tp 2, resumed at dp 2 x cp 2 (ZeRO-1 over dp x cp) vs 1 "
      "process: losses")
print("tensor parallel ok")
PY
