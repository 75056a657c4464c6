#!/usr/bin/env bash
# paper_grid_quick.sh CTXENGINE RECIPE DIR: recipes/paper_grid.lua in quick mode prints its four
# tables and writes grid.csv; run again, it trains nothing (every cell and base model is loaded
# from DIR) and prints the same tables.
set -euo pipefail
exe=$1 recipe=$2 dir=$3
rm -rf "$dir"
first=$("$exe" --threads 1 "$recipe" generated "$dir" quick 2>&1) || { echo "$first"; exit 1; }
echo "$first" | grep -v "\[info\]" | tail -30
grep -Eq "^chunk-0\.25 +\| +[0-9.]+±[0-9.]+ +[0-9.]+±[0-9.]+" <<<"$first" || { echo "no multi-seed chunk-0.25 row"; exit 1; }
grep -Eq "^kerple_log +\| +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+" <<<"$first" || { echo "no scratch row"; exit 1; }
grep -q "^chunk-0.25,rope,2,ppl,4," "$dir/grid.csv" || { echo "grid.csv lacks chunk-0.25 rope 4Lt"; exit 1; }
grep -Eq "^prefix-0\.25 +\| +[0-9.]+±[0-9.]+ \([0-9.]+±[0-9.]+\)" <<<"$first" || { echo "no passkey row"; exit 1; }
grep -q "^chunk-0.25,learned,2,passkey_tf,16," "$dir/grid.csv" || { echo "grid.csv lacks the passkey"; exit 1; }
grep -q "^scratch,alibi,1,passkey_tf,16," "$dir/grid.csv" || { echo "grid.csv lacks the scratch passkey"; exit 1; }
grep -q "grid: base" <<<"$first" || { echo "the first run trained no base model?"; exit 1; }
second=$("$exe" --threads 1 "$recipe" generated "$dir" quick 2>&1) || { echo "$second"; exit 1; }
if grep -q "grid: " <<<"$second"; then echo "the second run trained again:"; grep "grid: " <<<"$second"; exit 1; fi
diff <(grep -v "\[info\]" <<<"$first" | sed -n '/^Paper grid/,$p') \
     <(grep -v "\[info\]" <<<"$second" | sed -n '/^Paper grid/,$p') || { echo "tables differ after resume"; exit 1; }
echo "paper grid quick ok (resumed without training)"
