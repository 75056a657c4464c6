#!/usr/bin/env bash
# checkpoint_every.sh CTXENGINE WORKDIR: periodic checkpoints and recovery from a run that died
# without a stop signal.
#   1. 7 steps, checkpoint_every 2, keep_last 2: step-4 and step-6 remain (step-2 deleted),
#      `latest` names step-6
#   2. a crash after step 5 is simulated: step-6 removed, `latest` pointed back at step-4;
#      the same command again resumes from step 4 and ends with the first run's fingerprint
set -u
exe=$1 work=$2
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rm -rf "$work" && mkdir -p "$work"
"$exe" --threads 1 "$here/checkpoint_every.lua" "$work" > "$work/a.log" 2>&1 ||
  { echo "first run failed"; cat "$work/a.log"; exit 1; }
ls "$work/ckpt" > "$work/files"
want=$'latest\nstep-00000004.h5\nstep-00000006.h5'
[ "$(cat "$work/files")" == "$want" ] || { echo "unexpected files:"; cat "$work/files"; exit 1; }
[ "$(cat "$work/ckpt/latest")" == "step-00000006.h5" ] || { echo "latest is not step 6"; exit 1; }
rm "$work/ckpt/step-00000006.h5"
echo "step-00000004.h5" > "$work/ckpt/latest"
"$exe" --threads 1 "$here/checkpoint_every.lua" "$work" > "$work/b.log" 2>&1 ||
  { echo "rerun failed"; cat "$work/b.log"; exit 1; }
grep -q "resumed from .*step-00000004.h5 (optimizer step 4" "$work/b.log" ||
  { echo "the rerun did not resume from step 4"; cat "$work/b.log"; exit 1; }
a=$(grep -o "fingerprint [0-9a-f]*" "$work/a.log"); b=$(grep -o "fingerprint [0-9a-f]*" "$work/b.log")
[ -n "$a" ] && [ "$a" == "$b" ] || { echo "states differ: $a vs $b"; exit 1; }
echo "periodic checkpoints ok ($a)"
