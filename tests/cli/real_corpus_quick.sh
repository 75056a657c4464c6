#!/usr/bin/env bash
# real_corpus_quick.sh CTXENGINE RECIPE DIR: the real-corpus recipe in quick mode on shards made
# the way scripts/prepare_corpus.sh lays them out (DIR/shards/{train,val}.shard), here from the
# generated corpus so the test needs no Debian documentation package.
set -euo pipefail
exe=$1 recipe=$2 dir=$3
rm -rf "$dir"
"$exe" data generate --out "$dir/shards" --docs 40 --min-len 1000 --max-len 2000 \
  --val-fraction 0.2 > /dev/null
out=$("$exe" "$recipe" "$dir/shards" "$dir/run" quick 2>&1) || { echo "$out"; exit 1; }
echo "$out" | tail -8
grep -Eq "chunk-0\.25 +RoPE +\| +[0-9.]+ +[0-9.]+ +[0-9.]+ \| +[0-9.]+ +[0-9.]+" <<<"$out"
grep -q "vocabulary 259" <<<"$out"
# A missing corpus is a clear error naming the shard and how to build it.
if msg=$("$exe" "$recipe" "$dir/nosuch" "$dir/run2" quick 2>&1); then echo "no error"; exit 1; fi
grep -q "no $dir/nosuch/train.shard: build the corpus first (bash scripts/prepare_corpus.sh" <<<"$msg" \
  || { echo "$msg"; exit 1; }
echo "real corpus recipe ok"
