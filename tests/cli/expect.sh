#!/usr/bin/env bash
# expect.sh CODE REGEX [--absent REGEX] [--also REGEX]... -- COMMAND...
# Runs COMMAND; passes when its exit code is CODE and its combined output matches REGEX (and
# every --also REGEX; with --absent, does not match that one). Prints the output on failure.
set -u
code=$1; regex=$2; shift 2
absent=""
if [ "${1:-}" = "--absent" ]; then absent=$2; shift 2; fi
also=()
while [ "${1:-}" = "--also" ]; do also+=("$2"); shift 2; done
[ "${1:-}" = "--" ] && shift
out=$("$@" 2>&1); rc=$?
ok=1
if [ "$rc" -ne "$code" ]; then echo "expected exit code $code, got $rc"; ok=0; fi
if ! grep -Eq -- "$regex" <<<"$out"; then echo "output does not match: $regex"; ok=0; fi
for a in "${also[@]}"; do
  if ! grep -Eq -- "$a" <<<"$out"; then echo "output does not match: $a"; ok=0; fi
done
if [ -n "$absent" ] && grep -Eq -- "$absent" <<<"$out"; then echo "output matches unwanted: $absent"; ok=0; fi
if [ $ok -eq 0 ]; then echo "---- output of: $*"; echo "$out"; exit 1; fi
echo "ok: exit $rc, matched $regex"
