#!/usr/bin/env bash
# dp_check.sh MPIEXEC CTXENGINE RECIPE: runs RECIPE on 2 ranks and checks that both ranks printed
# the same fingerprint and loss.
set -u
# stdout only: mpirun forwards stderr (the log) independently, and in one stream a log line can
# split a printed line
err=$(mktemp); trap 'rm -f "$err"' EXIT
out=$("$1" --allow-run-as-root --oversubscribe -np 2 "$2" --threads 1 "$3" 2>"$err") ||
  { echo "$out"; cat "$err"; exit 1; }
lines=$(grep -E "^rank [01] fingerprint" <<<"$out")
[ "$(wc -l <<<"$lines")" -eq 2 ] || { echo "expected two rank lines:"; echo "$out"; exit 1; }
uniq=$(sed -E 's/^rank [01] //' <<<"$lines" | sort -u | wc -l)
[ "$uniq" -eq 1 ] || { echo "ranks differ:"; echo "$lines"; exit 1; }
echo "ok: $lines"
