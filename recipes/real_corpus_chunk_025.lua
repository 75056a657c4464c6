-- chunk-0.25 on a real long-document corpus: the Python documentation shipped by Debian, made
-- into token shards by scripts/prepare_corpus.sh (see README, docs/CORPORA.md):
--
--   bash scripts/setup_python.sh && bash scripts/prepare_corpus.sh --train-bpe 4096 \
--       --out data/real/python-docs-bpe4096
--   mpirun -np 2 build/ctxengine recipes/real_corpus_chunk_025.lua \
--       [SHARDS_DIR (data/real/python-docs-bpe4096/shards)] [OUT (runs/real_chunk_025)] [quick]
--
-- Base models are trained here at Lt = 128 tokens on the train split (validation = the val
-- split), then extended to Le = 512 as in chunk_025.lua, next to a "continued-Lt" control (the
-- same steps on plain Lt windows: these small base models are not converged). The vocabulary comes from the shards
-- (4096 with the BPE above, 259 with the byte tokenizer).
local C = require("common")
local shards = arg[1] or "data/real/python-docs-bpe4096/shards"
local out = arg[2] or "runs/real_chunk_025"
local function shard(split)
  local path = shards .. "/" .. split .. ".shard"
  local f = io.open(path, "rb")
  if not f then
    error(string.format("no %s: build the corpus first (bash scripts/prepare_corpus.sh --train-bpe 4096 "
                        .. "--out %s)", path, shards:gsub("/shards$", "")), 0)
  end
  f:close()
  return ctx.data.shard(path)
end
local corpus = { train = shard("train"), val = shard("val") }
C.runs = out
-- The sizes this recipe's published table was measured with (README), not the default corpus's.
C.size = { d_model = 128, n_layer = 4, n_head = 4 }
C.pretrain = { steps = 400, optimizer = { lr = 2e-3, warmup_steps = 30, min_lr = 2e-4, weight_decay = 0.1 } }
C.eval_windows = 48
local max_steps = nil  -- chunk training at the paper's compute parity (quick mode caps it)
if arg[3] == "quick" then
  C.Lt, C.Le, C.batch_size = 32, 128, 4
  C.size = { d_model = 32, n_layer = 2, n_head = 2 }
  C.models.rope.pe = { "rope", { rotary_pct = 0.5 } }
  C.pretrain.steps, max_steps, C.eval_windows = 20, 10, 4
end
ctx.log(string.format("real corpus %s: %d train documents (%d tokens), %d validation documents, "
                      .. "vocabulary %d", shards, #corpus.train, corpus.train:num_tokens(), #corpus.val,
                      corpus.train:vocab_size()))
require("chunk_experiment")(C, corpus, out, {
  max_steps = max_steps, continued_control = true,
  title = "Python docs, held-out documents, mean per-window perplexity" })
