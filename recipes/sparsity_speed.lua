-- Decode speed with contextual sparsity by model size (docs/SPARSITY.md): for each size a
-- freshly initialised model (speed does not depend on the weights) with predictors fitted
-- briefly to its activations, then teacher-forced decoding of 4 rows, dense and at each
-- sparsity level. The quality side of the trade-off needs trained models: recipes/sparsity.lua.
--
--   ctxengine recipes/sparsity_speed.lua [quick]
local quick = arg[1] == "quick"
local text = {}
for i = 1, 64 do text[i] = string.rep(string.format("line %d of a document about %d things; ", i, i * 7), 20) end
local docs = ctx.data.documents{ texts = text }
local sizes = quick and { { 64, 2, 2 } } or
              { { 128, 4, 4 }, { 256, 6, 4 }, { 512, 8, 8 }, { 768, 8, 12 }, { 1024, 8, 16 } }
local levels = { { name = "dense" }, { name = "mlp 0.5", sparsity = { mlp = 0.5 } },
                 { name = "mlp 0.75", sparsity = { mlp = 0.75 } },
                 { name = "mlp 0.9", sparsity = { mlp = 0.9 } },
                 { name = "mlp 0.75 + heads 0.5", sparsity = { mlp = 0.75, heads = 0.5 } } }
local L = quick and 64 or 256
local out = {}
for _, s in ipairs(sizes) do
  local d, layers, heads = s[1], s[2], s[3]
  local m = ctx.model{ style = "gpt2", vocab_size = 259, d_model = d, n_layer = layers,
                       n_head = heads, context_length = L, seed = 1, pe = ctx.pe("learned") }
  m:train_predictors{ data = docs, row_len = 64, tokens = 512, held_out = 128, epochs = 1 }
  for _, batch in ipairs({ 1, 4 }) do  -- rows decoded together
    local dense
    for _, lv in ipairs(levels) do
      local r = m:decode_score{ data = docs, rows = batch, row_len = L, prefix = L // 4,
                                sparsity = lv.sparsity }
      dense = dense or r.decode_tokens_per_s
      out[#out + 1] = string.format("d_model %4d, %d layers, %2.0fM params, batch %d | %-22s | %8.0f tok/s | %5.2fx",
                                    d, layers, m:num_params() / 1e6, batch, lv.name,
                                    r.decode_tokens_per_s, r.decode_tokens_per_s / dense)
    end
  end
end
for _, line in ipairs(out) do ctx.log(line) end
