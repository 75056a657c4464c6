-- Packed rows from a recipe: short documents (each shorter than the window) fill windows end to
-- end, a model trains on them, and samplers that cannot say where their tokens come from (Lua
-- samplers) are refused with the reason.
local texts = {}
for i = 1, 40 do texts[i] = string.rep(string.char(97 + i % 20), 5 + i % 7) end
local docs = ctx.data.documents{ texts = texts }
-- every document is shorter than 16 tokens: unpacked, there is not a single window
local ok, err = pcall(ctx.data.rows, { docs = docs, window = 16, batch_size = 2 })
assert(not ok and tostring(err):find("windows"), tostring(err))
local model = ctx.model{ style = "llama", vocab_size = 256, d_model = 32, n_head = 4, n_kv_head = 2,
                         n_layer = 1, context_length = 16 }
for _, mode in ipairs{ "restart", "continue" } do
  local rows = ctx.data.rows{ docs = docs, window = 16, batch_size = 2, pack = mode,
                              sampler = ctx.sampler("chunk", { alpha = 0.5 }), row_len = 8 }
  local r = ctx.train{ model = model, data = rows, steps = 3, log_every = 0 }
  assert(#r.losses == 3 and r.losses[3] == r.losses[3], "finite losses with pack = " .. mode)
end
ok, err = pcall(ctx.data.rows, { docs = docs, window = 16, batch_size = 2, pack = "sideways" })
assert(not ok and tostring(err):find("restart"), tostring(err))
local lua_sampler = ctx.sampler.lua(function(window, rng)
  local t, p, y, m = {}, {}, {}, {}
  for i = 1, 16 do t[i], p[i], y[i], m[i] = window[i], i - 1, window[i + 1], 1 end
  return { tokens = t, positions = p, targets = y, mask = m }
end)
local rows = ctx.data.rows{ docs = docs, window = 16, batch_size = 2, pack = "restart",
                            sampler = lua_sampler }
ok, err = pcall(ctx.train, { model = model, data = rows, steps = 1, log_every = 0 })
assert(not ok and tostring(err):find("gave no window index"), tostring(err))
print("packing ok")
