-- The largest model this 2-core machine trains in under an hour, for the contextual-sparsity
-- trade-off (docs/SPARSITY.md): a Pythia-like RoPE model of d_model 512, 8 layers, 8 heads
-- (27M parameters with the BPE of 4096; about 100x the main job's) trained at Lt = 128 on the
-- Python documentation, then extended to Le = 512 with chunk-0.25 (chunk_experiment.lua, the
-- same pipeline as real_corpus_chunk_025.lua; 200 steps, a third of compute parity). The decode speed of
-- this size is in docs/BENCHMARKS.md ("Decoding with contextual sparsity"); its quality with
-- sparsity is measured by recipes/sparsity.lua on the extended checkpoint:
--
--   bash scripts/setup_python.sh && bash scripts/prepare_corpus.sh --train-bpe 4096 \
--       --out data/real/python-docs-bpe4096
--   mpirun -np 2 build/ctxengine recipes/sparsity_base.lua [OUT (runs/sparsity_base)] [quick]
--   build/ctxengine recipes/sparsity.lua runs/sparsity_base/rope runs/sparsity_5m python-docs
local C = require("common")
local out = arg[1] or "runs/sparsity_base"
local quick = arg[2] == "quick"
local shards = "data/real/python-docs-bpe4096/shards"
local function shard(split)
  local path = shards .. "/" .. split .. ".shard"
  local f = io.open(path, "rb")
  if not f then
    error("no " .. path .. ": build the corpus first (bash scripts/prepare_corpus.sh --train-bpe 4096 "
          .. "--out data/real/python-docs-bpe4096)", 0)
  end
  f:close()
  return ctx.data.shard(path)
end
local corpus = { train = shard("train"), val = shard("val"),
                 tokenizer = ctx.tokenizer("data/real/python-docs-bpe4096/tokenizer/tokenizer.json") }
C.runs = out
C.size = { d_model = 512, n_layer = 8, n_head = 8 }
-- about 1.7 epochs of the train split (2.4M tokens) at 16 rows of 128 tokens per rank and step
-- under mpirun -np 2
C.pretrain = { steps = 1000, optimizer = { lr = 1e-3, warmup_steps = 50, min_lr = 1e-4, weight_decay = 0.1 } }
C.extend_optimizer = { lr = 5e-4, min_lr = 5e-5 }
C.eval_windows = 48
local max_steps = 200
if quick then
  C.Lt, C.Le, C.batch_size = 32, 128, 4
  C.size = { d_model = 32, n_layer = 2, n_head = 2 }
  C.models.rope.pe = { "rope", { rotary_pct = 0.5 } }
  C.pretrain.steps, max_steps, C.eval_windows = 20, 10, 4
end
ctx.log(string.format("sparsity base: %d train documents (%d tokens), vocabulary %d, d_model %d, %d layers",
                      #corpus.train, corpus.train:num_tokens(), corpus.train:vocab_size(),
                      C.size.d_model, C.size.n_layer))
require("chunk_experiment")(C, corpus, out, {
  models = { "rope" }, max_steps = max_steps,
  title = "Python docs, held-out documents, mean per-window perplexity (sparsity base model)" })
