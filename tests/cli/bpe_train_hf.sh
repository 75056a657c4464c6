#!/usr/bin/env bash
# bpe_train_hf.sh CTXENGINE REPO_ROOT WORK_DIR: the BPE that `ctxengine data generate --bpe`
# trains is a tokenizer.json HF `tokenizers` reads, and HF encodes the corpus text to exactly the
# ids in the shards (our encoder's). Without the Python package: exit 77 (ctest: skipped).
set -euo pipefail
exe=$1 root=$2 work=$3
python=""
for candidate in "${CTX_PYTHON:-}" "$root/build/pyenv/bin/python" "$(dirname "$work")/pyenv/bin/python"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ] && "$candidate" -c "import tokenizers" 2>/dev/null; then
    python="$candidate"
    break
  fi
done
[ -n "$python" ] || { echo "SKIPPED: python package tokenizers not available"; exit 77; }
rm -rf "$work"
"$exe" data generate --out "$work" --docs 30 --min-len 800 --max-len 2000 --bpe 500 > /dev/null
"$python" - "$work" <<'PY'
import array, struct, sys
from tokenizers import Tokenizer
work = sys.argv[1]
tok = Tokenizer.from_file(f"{work}/tokenizer.json")
assert tok.get_vocab_size() == 500, tok.get_vocab_size()
checked = 0
for split in ("train", "val"):
    b = open(f"{work}/{split}.shard", "rb").read()
    _, _, tb, vocab, _, ndocs, ntok, toff, ioff, _ = struct.unpack("<8sIIIIQQQQQ", b[:64])
    toks = array.array("H" if tb == 2 else "I"); toks.frombytes(b[toff:toff + ntok * tb])
    idx = array.array("Q"); idx.frombytes(b[ioff:ioff + (ndocs + 1) * 8])
    for d in range(ndocs):
        ids = list(toks[idx[d]:idx[d + 1]])
        text = tok.decode(ids)
        again = tok.encode(text, add_special_tokens=False).ids
        assert again == ids, f"{split} doc {d}: HF encodes to {len(again)} ids, ours {len(ids)}"
        checked += 1
print(f"HF tokenizers encodes all {checked} documents to the shards' ids")
PY
