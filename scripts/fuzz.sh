#!/usr/bin/env bash
# Runs every libFuzzer target (tests/fuzz/, built by tests/fuzz/fuzz.cmake) for a while and prints,
# per target: executions, crashes (0, or the paths of the inputs that crashed), libFuzzer's final
# coverage (cov:) and the size of its corpus (corp:, inputs kept in memory at the end).
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [BUILD_DIR]      (defaults: 600, build)
# Each target starts from its seed corpus (tests/fuzz/corpus/NAME, never written) plus a scratch
# corpus kept between runs (BUILD_DIR/fuzz/corpus/NAME); crashing inputs go to
# BUILD_DIR/fuzz/artifacts/, logs to BUILD_DIR/fuzz/logs/. Runs under nice: the machine may be
# shared. Exits 1 when any target crashed (libFuzzer stops a target at its first crash).
# FUZZ_TARGETS="tokenizer_json hf_config" runs only those. FUZZ_RUNS=1000000 stops each target
# after that many executions instead (SECONDS_PER_TARGET then only caps it).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-600}
BUILD_DIR=${2:-build}
FUZZ_DIR=$BUILD_DIR/fuzz
SRC=tests/fuzz

# name, dictionary (- for none), max input length: as fuzz.cmake registers them for ctest.
TARGETS=(
  "safetensors_header safetensors.dict 2048"
  "tokenizer_json tokenizer.dict 4096"
  "checkpoint_config config.dict 1024"
  "checkpoint_file - 1024"
  "shard_header - 1024"
  "hf_config config.dict 2048"
  "recipe_options options.dict 1024"
)

mkdir -p "$FUZZ_DIR/artifacts" "$FUZZ_DIR/logs"
printf '%-20s %12s %8s %8s %8s %s\n' target executions seconds cov corpus crashes
any_crash=0
for entry in "${TARGETS[@]}"; do
  read -r name dict max_len <<<"$entry"
  [[ -n ${FUZZ_TARGETS:-} && " $FUZZ_TARGETS " != *" $name "* ]] && continue
  exe=$FUZZ_DIR/${name}_fuzz
  if [[ ! -x $exe ]]; then
    echo "$name: $exe not built (cmake --build $BUILD_DIR --target ${name}_fuzz)" >&2
    any_crash=1
    continue
  fi
  corpus=$FUZZ_DIR/corpus/$name
  log=$FUZZ_DIR/logs/$name.log
  mkdir -p "$corpus"
  options=(-max_total_time="$SECONDS_PER_TARGET" -max_len="$max_len" -timeout=10
           -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$FUZZ_DIR/artifacts/$name-")
  [[ $dict != - ]] && options+=(-dict="$SRC/$dict")
  [[ -n ${FUZZ_RUNS:-} ]] && options+=(-runs="$FUZZ_RUNS")
  before=$(date +%s)
  marker=$(mktemp)
  status=0
  nice -n 10 "$exe" "${options[@]}" "$corpus" "$SRC/corpus/$name" >"$log" 2>&1 || status=$?
  elapsed=$(( $(date +%s) - before ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  corp=$(grep -o 'corp: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  # Inputs written by this run: crash-, leak-, timeout- and oom- files (slow units are not bugs).
  crashes=$(find "$FUZZ_DIR/artifacts" -name "$name-*" -newer "$marker" \
            ! -name "$name-slow-unit-*" | sort | tr '\n' ' ')
  rm -f "$marker"
  if [[ -n $crashes || $status -ne 0 ]]; then
    any_crash=1
    [[ -z $crashes ]] && crashes="exit status $status, see $log"
  fi
  printf '%-20s %12s %8s %8s %8s %s\n' "$name" "${execs:-?}" "$elapsed" "${cov:-?}" \
    "${corp:-?}" "${crashes:-0}"
done
exit "$any_crash"
