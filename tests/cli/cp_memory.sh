#!/usr/bin/env bash
# cp_memory.sh MPIEXEC CTXENGINE: a row that does not fit one rank's memory fits at cp 2.
#   1. one process, --backend-memory-limit 40e6: the allocation fails and says why
#   2. mpirun -np 2 --cp 2, the same limit per rank: runs
#   3. its loss and its passkey score (teacher-forced, 4000 tokens) equal the one process's
#      without a limit
set -u
mpi=$1; exe=$2
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
limit=40000000
out=$("$exe" --threads 1 --backend-memory-limit $limit "$here/cp_memory.lua" 2>&1)
[ $? -ne 0 ] && echo "$out" | grep -q "would exceed the memory limit of 38.1 MiB" ||
  { echo "one process did not hit the limit:"; echo "$out"; exit 1; }
echo "1 process under the limit: $(echo "$out" | grep -o 'allocating.*MiB in use)')"
# stdout only (the parsed lines): mpirun forwards stderr (the log) independently, and in one
# stream a log line can split a printed line
err=$(mktemp); trap 'rm -f "$err"' EXIT
cp2=$("$mpi" --allow-run-as-root --oversubscribe -np 2 "$exe" --threads 1 --cp 2 \
      --backend-memory-limit $limit "$here/cp_memory.lua" 2>"$err") ||
  { echo "cp 2 failed:"; echo "$cp2"; cat "$err"; exit 1; }
whole=$("$exe" --threads 1 "$here/cp_memory.lua" 2>"$err") || { echo "$whole"; cat "$err"; exit 1; }
a=$(echo "$cp2" | grep -oP '^cp 2 loss \K\S+'); b=$(echo "$whole" | grep -oP '^cp 1 loss \K\S+')
python3 -c "import sys; a, b = float('$a'), float('$b'); assert abs(a - b) <= 1e-5 * abs(b), (a, b)" ||
  { echo "cp 2 loss $a vs one process $b"; exit 1; }
echo "cp 2 fits the limit: loss $a (one process without a limit: $b)"
a=$(echo "$cp2" | grep -oP '^cp 2 passkey logprob \K\S+'); b=$(echo "$whole" | grep -oP '^cp 1 passkey logprob \K\S+')
python3 -c "import sys; a, b = float('$a'), float('$b'); assert abs(a - b) <= 1e-5 * abs(b), (a, b)" ||
  { echo "cp 2 passkey log-probability $a vs one process $b"; exit 1; }
echo "cp 2 passkey at 4000 tokens: mean log-probability $a (one process without a limit: $b)"
