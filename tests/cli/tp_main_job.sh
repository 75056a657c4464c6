#!/usr/bin/env bash
# tp_main_job.sh MPIEXEC CTXENGINE DIR
# The main job (recipes/chunk_025.lua, quick mode) on one process, on tp 2 and on cp 2 (ring
# attention): the same rows (dp 1 all), so the printed perplexity and recall tables agree to
# their printed digits. Each run's stdout (the recipe's tables) and stderr (the log) go to
# separate files: mpirun forwards the two streams independently, so in one file a log line can land
# in the middle of a table line.
set -u
mpi=$1; exe=$2; dir=$3
recipe=$(dirname "$0")/../../recipes/chunk_025.lua
rm -rf "$dir"; mkdir -p "$dir"
run() {  # run NAME COMMAND...: stdout to NAME.log, stderr to NAME.err
  local name=$1; shift
  "$@" >"$dir/$name.log" 2>"$dir/$name.err" || { cat "$dir/$name.log" "$dir/$name.err"; exit 1; }
}
mpirun2() { "$mpi" --allow-run-as-root --oversubscribe -np 2 "$@"; }
run single "$exe" --threads 1 "$recipe" "$dir/single" quick
run tp2 mpirun2 "$exe" --threads 1 --tp 2 "$recipe" "$dir/tp2" quick
run cp2 mpirun2 "$exe" --threads 1 --cp 2 "$recipe" "$dir/cp2" quick
table() { grep -E '^(OOTB|chunk)' "$1"; }
for g in tp2 cp2; do
  if ! diff <(table "$dir/single.log") <(table "$dir/$g.log"); then
    echo "the main job's tables differ between 1 process and $g"; exit 1
  fi
done
grep -q "parallel grid: dp 1 x cp 1 x tp 2" "$dir/tp2.err" || { echo "tp 2 grid not used"; exit 1; }
[[ $(table "$dir/tp2.log" | wc -l) -ge 8 ]] || { echo "tables missing"; cat "$dir/tp2.log"; exit 1; }
grep -q "parallel grid: dp 1 x cp 2 x tp 1" "$dir/cp2.err" || { echo "cp 2 grid not used"; exit 1; }
echo "main job at tp 2 and at cp 2 prints the 1-process tables"
