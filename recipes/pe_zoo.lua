-- Every positional encoding side by side: a tiny model per PE trained for a few hundred steps
-- at Lt on the default corpus, then evaluated at Lt and 4 Lt (learned positions interpolated to
-- 4 Lt first). One table; metrics.jsonl and perplexity.csv in the output directory.
--
--   ctxengine recipes/pe_zoo.lua [OUT_DIR] [smoke]
local out = arg[1] or "runs/pe_zoo"
local smoke = arg[2] == "smoke"
local Lt = smoke and 16 or 64
local steps = smoke and 4 or 300

local corpus = ctx.data.corpus(smoke
  and { dir = out .. "/corpus", docs = 20, min_len = 500, max_len = 900, min_distance = 20, max_distance = 60 }
  or { dir = "data/generated/pe_zoo", docs = 200, min_len = 2000, max_len = 6000, min_distance = 70, max_distance = 250 })

local zoo = {
  { "learned",             "learned",    {} },
  { "sinusoidal",          "sinusoidal", {} },
  { "rope",                "rope",       {} },
  { "rope linear x4",      "rope",       { scaling = "linear", factor = 4 } },
  { "rope ntk x4",         "rope",       { scaling = "ntk", factor = 4 } },
  { "rope dynamic ntk",    "rope",       { scaling = "dynamic_ntk", factor = 1 } },
  { "rope yarn x4",        "rope",       { scaling = "yarn", factor = 4 } },
  { "rope giraffe power",  "rope",       { scaling = "giraffe_power" } },
  { "rope giraffe trunc",  "rope",       { scaling = "giraffe_truncated" } },
  { "rope xpos",           "rope",       { scaling = "xpos" } },
  { "alibi",               "alibi",      {} },
  { "kerple log",          "kerple_log", {} },
  { "kerple power",        "kerple_power", {} },
  { "t5 bias",             "t5_bias",    {} },
  { "fire",                "fire",       {} },
  { "none (NoPE)",         "none",       {} },
}

local rows_table = {}
for _, z in ipairs(zoo) do
  local label, name, options = z[1], z[2], z[3]
  local m = ctx.model{ style = "gpt2", vocab_size = 259, d_model = smoke and 16 or 64, n_layer = 2,
                       n_head = smoke and 2 or 4, context_length = Lt, seed = 1,
                       pe = ctx.pe(name, options) }
  local rows = ctx.data.rows{ docs = corpus.train, window = Lt, batch_size = 8, seed = 5 }
  local r = ctx.train{ model = m, data = rows, steps = steps, log_every = 0, out_dir = out,
                       optimizer = { lr = 2e-3, warmup_steps = math.min(20, steps), weight_decay = 0.0 } }
  if name == "learned" then m:extend(4 * Lt) end
  local recs = ctx.run_eval{ eval = ctx.eval("perplexity", { multiples = { 1, 4 }, max_windows = smoke and 4 or 32 }),
                             model = m, data = corpus.val, out_dir = out, tags = { pe = label } }
  rows_table[#rows_table + 1] = string.format("%-20s | %9.3f | %9.3f | %9.3f | %8d",
    label, r.final_loss, recs[1].mean_ppl, recs[2].mean_ppl, m:num_params())
end

if ctx.rank() == 0 then
  print(string.format("\nPE zoo (Lt = %d, %d steps each; perplexity on held-out documents):", Lt, steps))
  print(string.format("%-20s | %9s | %9s | %9s | %8s", "pe", "train loss", "ppl Lt", "ppl 4Lt", "params"))
  print(string.rep("-", 68))
  print(table.concat(rows_table, "\n"))
end
