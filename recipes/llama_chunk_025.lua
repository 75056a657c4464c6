-- The segmented-sequences method (METHODS.md 2.2, 3.2-3.3) on a Llama-style model: RMSNorm,
-- SwiGLU, grouped-query attention (4 query heads, 2 key/value heads), RoPE on whole heads, untied
-- head (recipes/common.lua: models.llama). A base trained at Lt on the generated default corpus
-- is extended to Le = 4 Lt with chunk-0.25 rows at their original positions, and evaluated at Lt,
-- 2Lt, 4Lt before (OOTB) and after, with the windowed control and recall by distance, as
-- chunk_025.lua does for the paper's two models.
--
--   mpirun -np 2 ctxengine recipes/llama_chunk_025.lua [OUT_DIR] [quick]
--
-- Given an HF directory first, it extends that pretrained Llama, Mistral or Qwen2 instead
-- (ctx.load_hf; hf_chunk_025.lua, as pythia_chunk_025.lua does for Pythia; docs/HF.md):
--
--   bash scripts/prepare_corpus.sh --tokenizer models/TinyLlama --out data/real/docs-tinyllama
--   ctxengine recipes/llama_chunk_025.lua models/TinyLlama data/real/docs-tinyllama/shards \
--       [OUT (runs/llama_hf_chunk_025)] [quick | MAX_STEPS]
local function is_hf_dir(path)
  local f = path and io.open(path .. "/config.json", "rb")
  if f then f:close() end
  return f ~= nil
end
if is_hf_dir(arg[1]) then
  require("hf_chunk_025")("llama", "runs/llama_hf_chunk_025")
  return
end
local C = require("common")
local out = arg[1] or "runs/llama_chunk_025"
if arg[2] == "quick" then C.quick(out) end
local corpus = ctx.data.corpus(C.corpus)
require("chunk_experiment")(C, corpus, out, { recall = true, models = { "llama" } })
