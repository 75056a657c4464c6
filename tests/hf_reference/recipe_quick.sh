#!/usr/bin/env bash
# A recipes/<family>_chunk_025.lua run in quick mode (docs/HF.md) on a tiny random model saved
# by transformers (make_reference.py), with shards tokenized by that model's tokenizer.json
# through `ctxengine tokenize --tokenizer HF_DIR`. Checks the table and that transformers loads
# the extended export with the new context.
# Usage: recipe_quick.sh FAMILY CTXENGINE REPO_ROOT BUILD_DIR   (FAMILY: gpt2 | pythia | bloom |
#        llama)
# Exit 77 (skipped) without torch + transformers.
set -euo pipefail
family=$1 exe=$2 root=$3 build=$4
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=find_python.sh
source "$here/find_python.sh"
case $family in
  gpt2) model=gpt2 key=n_positions ;;
  pythia) model=neox_parallel key=max_position_embeddings ;;
  bloom) model=bloom key=seq_length ;;
  llama) model=llama key=max_position_embeddings ;;
  *) echo "unknown family $family"; exit 2 ;;
esac

work="$build/hf_reference/recipe_$family"
rm -rf "$work"
mkdir -p "$work"
"$python" "$here/make_reference.py" "$model" "$work" 2>&1 | grep -v "loss_type=None" || true
[ -f "$work/hf/config.json" ] || { echo "make_reference.py failed"; exit 1; }
"$exe" tokenize --input "$work/corpus" --out "$work/shards" --tokenizer "$work/hf" \
  --val-fraction 0.2 --test-fraction 0 --no-progress > "$work/tokenize.log"
out=$("$exe" --threads 2 "$root/recipes/${family}_chunk_025.lua" "$work/hf" "$work/shards" \
  "$work/run" quick 2>&1) || { echo "$out"; exit 1; }
echo "$out" | tail -9
grep -Eq "chunk-0\.25 +\| +[0-9.]+ +[0-9.]+ +[0-9.]+" <<<"$out" || { echo "no result table"; exit 1; }
"$python" - "$work/run/hf_extended" "$key" <<'PY'
import sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
path, key = sys.argv[1], sys.argv[2]
model = AutoModelForCausalLM.from_pretrained(path)
tok = AutoTokenizer.from_pretrained(path)
ctx = getattr(model.config, key)
assert ctx == 128, f"{key} = {ctx}, expected 4 x 32"
ids = tok("The vault code is 48213.", return_tensors="pt")["input_ids"]
with torch.no_grad():
    assert torch.isfinite(model(ids).logits).all()
print(f"transformers loads {path}: {key} = {ctx}")
PY
echo "hf recipe $family quick ok"
