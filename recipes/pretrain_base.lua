-- Trains the base models the other recipes start from (GPT-2-like with learned positions and
-- Pythia-like with RoPE) at Lt on the default corpus, and saves them to runs/base_<pe>/.
-- An existing checkpoint is reused, so running this twice trains nothing the second time.
--
--   ctxengine recipes/pretrain_base.lua [RUNS_DIR quick]
local C = require("common")
if arg[2] == "quick" then C.quick(arg[1]) end
local corpus = ctx.data.corpus(C.corpus)
for _, pe in ipairs{ "rope", "learned" } do
  local model = C.base_model(pe, corpus)
  local r = ctx.run_eval{ eval = ctx.eval("perplexity", { multiples = { 1 }, max_windows = C.eval_windows }),
                          model = model, data = corpus.val, tags = { model = pe } }
  ctx.log(string.format("%s base: validation perplexity at Lt = %.3f", pe, r[1].mean_ppl))
end
