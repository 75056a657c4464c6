#!/usr/bin/env bash
# tp_main_job.sh MPIEXEC CTXENGINE DIR
# The main job (recipes/chunk_025.lua, quick mode) on one process and on tp 2: the same rows
# (dp 1 both), so the printed perplexity and recall tables agree to their printed digits.
set -u
mpi=$1; exe=$2; dir=$3
recipe=$(dirname "$0")/../../recipes/chunk_025.lua
rm -rf "$dir"; mkdir -p "$dir"
"$exe" --threads 1 "$recipe" "$dir/single" quick >"$dir/single.log" 2>&1 \
  || { cat "$dir/single.log"; exit 1; }
"$mpi" --allow-run-as-root --oversubscribe -np 2 "$exe" --threads 1 --tp 2 "$recipe" "$dir/tp2" quick \
  >"$dir/tp2.log" 2>&1 || { cat "$dir/tp2.log"; exit 1; }
table() { grep -E '^(OOTB|chunk)' "$1"; }
if ! diff <(table "$dir/single.log") <(table "$dir/tp2.log"); then
  echo "the main job's tables differ between 1 process and tp 2"; exit 1
fi
grep -q "parallel grid: dp 1 x cp 1 x tp 2" "$dir/tp2.log" || { echo "tp 2 grid not used"; exit 1; }
[[ $(table "$dir/tp2.log" | wc -l) -ge 8 ]] || { echo "tables missing"; cat "$dir/tp2.log"; exit 1; }
echo "main job at tp 2 prints the 1-process tables"
