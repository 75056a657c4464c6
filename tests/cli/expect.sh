#!/usr/bin/env bash
# expect.sh CODE REGEX [--absent REGEX] [--also REGEX]... -- COMMAND...
# Runs COMMAND; passes when its exit code is CODE and a line of its stdout or of its stderr
# matches REGEX (and every --also REGEX; with --absent, no line matches that one). Prints both on
# failure. The streams are read apart because mpirun forwards them independently: merged, a log
# line on stderr can land in the middle of a printed line.
set -u
code=$1; regex=$2; shift 2
absent=""
if [ "${1:-}" = "--absent" ]; then absent=$2; shift 2; fi
also=()
while [ "${1:-}" = "--also" ]; do also+=("$2"); shift 2; done
[ "${1:-}" = "--" ] && shift
errfile=$(mktemp); trap 'rm -f "$errfile"' EXIT
out=$("$@" 2>"$errfile"); rc=$?
err=$(cat "$errfile")
matches() { grep -Eq -- "$1" <<<"$out" || grep -Eq -- "$1" <<<"$err"; }
ok=1
if [ "$rc" -ne "$code" ]; then echo "expected exit code $code, got $rc"; ok=0; fi
if ! matches "$regex"; then echo "output does not match: $regex"; ok=0; fi
for a in "${also[@]}"; do
  if ! matches "$a"; then echo "output does not match: $a"; ok=0; fi
done
if [ -n "$absent" ] && matches "$absent"; then echo "output matches unwanted: $absent"; ok=0; fi
if [ $ok -eq 0 ]; then
  echo "---- stdout of: $*"; echo "$out"; echo "---- stderr"; echo "$err"; exit 1
fi
echo "ok: exit $rc, matched $regex"
