-- model:logprobs and model:generate, the building blocks of probes written in Lua. Checked
-- against each other and against what a distribution must satisfy: over every candidate next
-- token the probabilities sum to 1 and greedy generation picks their argmax; a batch equals its
-- rows one by one; with window = 1 a prediction ignores every earlier token; ctx.evaluate's loss
-- on a row is the mean of its negated log-probabilities.
local V = 40
local m = ctx.model{ style = "neox", vocab_size = V, d_model = 32, n_head = 4, n_layer = 2,
                     pe = ctx.pe("rope", { rotary_pct = 1 }),
                     context_length = 16, seed = 3 }
local data = ctx.data.tokens{ tokens = {5, 9, 2, 7, 7, 1, 30, 12, 4, 8, 16, 22, 3, 3, 9, 11, 5, 9, 2, 7},
                              vocab_size = V }
ctx.train{ model = m, data = data, steps = 5, batch_size = 2, seq_len = 8, log_every = 0 }

local prompt = {5, 9, 2, 7, 7}
local lp = m:logprobs({5, 9, 2, 7, 7, 1})
assert(#lp == 5)
for _, x in ipairs(lp) do assert(x <= 0 and x == x, tostring(x)) end

-- every candidate next token in one batch: probabilities sum to 1, greedy takes the argmax
local rows = {}
for c = 0, V - 1 do
  local r = { table.unpack(prompt) }
  r[#r + 1] = c
  rows[#rows + 1] = r
end
local all = m:logprobs(rows)
assert(#all == V)
local sum, best, best_lp = 0, -1, -math.huge
for c = 0, V - 1 do
  local x = all[c + 1][#prompt]
  sum = sum + math.exp(x)
  if x > best_lp then best, best_lp = c, x end
  -- the rows share their prefix: the earlier entries agree with the single call
  for i = 1, #prompt - 1 do
    assert(math.abs(all[c + 1][i] - lp[i]) < 1e-5, "batch row differs from the single call")
  end
end
assert(math.abs(sum - 1) < 1e-4, string.format("probabilities sum to %.6f", sum))
local g = m:generate(prompt, { max_new_tokens = 1 })
assert(g.tokens[1] == best and g.finish == "length", string.format("greedy %d, argmax %d", g.tokens[1], best))

-- window = 1: the last prediction sees only its own token (and position)
local a = m:logprobs({5, 9, 2, 7, 1}, { window = 1 })
local b = m:logprobs({30, 12, 4, 7, 1}, { window = 1 })
assert(a[4] == b[4] and a[1] ~= b[1], "window 1 ignores earlier tokens")
-- positions matter through their differences (RoPE): a common shift changes nothing, a spread does
local shifted = m:logprobs({5, 9, 2, 7, 7, 1}, { positions = {10, 11, 12, 13, 14, 15} })
local spread = m:logprobs({5, 9, 2, 7, 7, 1}, { positions = {0, 3, 6, 9, 12, 15} })
assert(math.abs(shifted[5] - lp[5]) < 1e-6, string.format("%.9g vs %.9g", shifted[5], lp[5]))
assert(math.abs(spread[5] - lp[5]) > 1e-6, string.format("%.9g vs %.9g", spread[5], lp[5]))

-- ctx.evaluate's mean loss on one row is the mean negated log-probability
local row = {5, 9, 2, 7, 7, 1, 30, 12, 4}
local one = ctx.data.tokens{ tokens = row, vocab_size = V }
local loss = ctx.evaluate{ model = m, data = one, seq_len = 8, batch_size = 1, batches = 1 }
local s = 0
for _, x in ipairs(m:logprobs(row)) do s = s - x end
assert(math.abs(loss - s / 8) < 1e-5, string.format("evaluate %.7f vs logprobs %.7f", loss, s / 8))

-- several prompts, stop tokens, text through a tokenizer
local many = m:generate({ prompt, {9, 2}, {1} }, { max_new_tokens = 4 })
assert(#many == 3 and many[1].tokens[1] == best)
for i, p in ipairs({ prompt, {9, 2}, {1} }) do
  local single = m:generate(p, { max_new_tokens = 4 })
  assert(table.concat(single.tokens, ",") == table.concat(many[i].tokens, ","), "prompt " .. i)
end
local stop = m:generate(prompt, { max_new_tokens = 4, stop = { best } })
assert(#stop.tokens == 0 and stop.finish == "stop_token")
local tok = ctx.tokenizer("byte")
local bm = ctx.model{ vocab_size = tok:vocab_size(), d_model = 16, n_head = 2, n_layer = 1,
                      context_length = 32, seed = 1 }
local t = bm:generate("The pass key is", { max_new_tokens = 3, tokenizer = tok })
assert(type(t.text) == "string" and #t.tokens == 3 and t.text == tok:decode(t.tokens))

-- bad calls say what is wrong
local function err(f, ...) local ok, e = pcall(f, ...); assert(not ok); return tostring(e) end
assert(err(m.logprobs, m, {5}):find("at least 2 tokens"))
assert(err(m.logprobs, m, {5, 99}):find("token 99 is outside the vocabulary %[0, 40%)"))
assert(err(m.logprobs, m, { {1, 2}, {1, 2, 3} }):find("every sequence must have the length"))
assert(err(m.generate, m, "text"):find("a text prompt needs the `tokenizer` option"))
assert(err(m.generate, m, prompt, { stop = { "x" } }):find("strings need the `tokenizer` option"))
assert(err(m.generate, m, prompt, { max_tokens = 3 }):find("max_tokens"))
print("model probes ok")
