#!/usr/bin/env bash
# plot_test.sh SOURCE_DIR TMP_DIR: scripts/plot.py on small CSVs in the shapes the eval tasks
# write; every expected PNG must exist, be a PNG and not be empty. Skipped (77) without matplotlib.
set -euo pipefail
src=$1 dir=$2
# Debian's python (where python3-matplotlib lives), else whatever python3 is on PATH.
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)
"$py" -c "import matplotlib" 2>/dev/null || { echo "SKIPPED: python3-matplotlib is not installed"; exit 77; }
rm -rf "$dir" && mkdir -p "$dir/a" "$dir/b"
for run in a b; do
  {
    echo "task,method,pe,length,multiple,positions,windows,tokens,mean_ppl,token_ppl,mean_nll"
    for L in 128 256 512; do echo "perplexity,$run,rope,$L,$((L / 128)),gap1,10,$((L * 10)),$((L / 64 + 2)).5,3.1,1.2"; done
  } > "$dir/$run/perplexity.csv"
  {
    echo "task,method,length,positions,bin,pos_start,pos_end,tokens,mean_nll,window,windowed_mean_nll"
    for b in 0 1 2 3; do echo "perplexity_curve,$run,512,gap1,$b,$((b * 128)),$(((b + 1) * 128)),1280,$((3 - b)).2,128,3.4"; done
  } > "$dir/$run/perplexity_curve.csv"
done
# passkey / ruler_niah: one row per (length, depth), the layout the host writes (task, tags,
# fields); "nan" where a score was not measured (ruler multivalue has no teacher-forced score).
{
  echo "task,method,length,multiple,depth,items,mean_prompt_tokens,needle_depth,accuracy,tf_accuracy,mean_logprob,window,windowed_accuracy,windowed_tf_accuracy,windowed_mean_logprob,max_new_tokens"
  for L in 256 512 1024; do for d in 0 0.25 0.5 0.75 1; do
    echo "passkey,a,$L,$((L / 128)),$d,4,$((L - 1)),$d,$(awk "BEGIN{print 1 - $L / 2048}"),1,-3.5,128,0.25,0.5,-7,12"
  done; done
} > "$dir/a/passkey.csv"
{
  echo "task,method,variant,haystack,value_type,length,multiple,depth,items,mean_prompt_tokens,needle_depth,accuracy,tf_accuracy,mean_logprob,window,windowed_accuracy,windowed_tf_accuracy,windowed_mean_logprob,max_new_tokens"
  for v in single multivalue; do for L in 512 1024; do for i in $(seq 0 9); do
    tf=$([ $v = single ] && echo 0.5 || echo nan)
    echo "ruler_niah,b,$v,noise,numbers,$L,$((L / 128)),$(awk "BEGIN{print $i / 9}"),2,$((L - 129)),0.5,0.$i,$tf,nan,128,0.1,nan,nan,128"
  done; done; done
} > "$dir/b/ruler_niah.csv"
# recipes/paper_grid.lua's grid.csv: two methods (one over 3 seeds), both PEs.
{
  echo "row,pe,seeds,measure,multiple,mean,half_range"
  for pe in learned rope; do for m in 1 2 4; do
    echo "OOTB,$pe,3,ppl,$m,$((m + 2)).5,0.1"
    echo "chunk-0.25,$pe,1,ppl,$m,2.8,0.000000"
  done
  echo "OOTB,$pe,3,recall_bin2,4,0.03,0.01"; echo "OOTB,$pe,3,windowed_recall_bin2,4,0.02,0.01"
  echo "chunk-0.25,$pe,1,recall_bin2,4,0.12,0"; echo "chunk-0.25,$pe,1,windowed_recall_bin2,4,0.03,0"
  done
  echo "scratch,alibi,1,ppl,8,2.5,0"
} > "$dir/b/grid.csv"
out=$("$py" "$src/scripts/plot.py" "$dir/a" "$dir/b" --out "$dir/png")
echo "$out"
for png in perplexity_vs_length position_loss passkey_heatmap ruler_niah_heatmap grid; do
  f="$dir/png/$png.png"
  [ -s "$f" ] || { echo "missing $f"; exit 1; }
  [ "$(head -c 8 "$f" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] || { echo "$f is not a PNG"; exit 1; }
  [ "$(stat -c %s "$f")" -gt 10000 ] || { echo "$f is suspiciously small"; exit 1; }
done
# No CSVs: a clear error, exit 1.
mkdir -p "$dir/empty"
if "$py" "$src/scripts/plot.py" "$dir/empty" 2> "$dir/err"; then echo "no error for an empty dir"; exit 1; fi
grep -q "no evaluation CSVs" "$dir/err"
echo "plots ok"
