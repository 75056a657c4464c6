-- model:set_pe and model:extend(Le, {base = b}) (ABF): a RoPE swapped for another one changes
-- exactly what the PE changes, the same PE again changes nothing, checkpoints and HF exports
-- carry the new PE, and PEs with parameters are refused.
local out = arg[1]
local V = 48
local function model()
  return ctx.model{ style = "neox", vocab_size = V, d_model = 32, n_head = 4, n_layer = 2,
                    pe = ctx.pe("rope", { rotary_pct = 1 }), context_length = 16, seed = 5 }
end
local function data()  -- a fresh stream each time: both models see the same batches
  return ctx.data.tokens{ tokens = {5, 9, 2, 7, 7, 1, 30, 12, 4, 8, 16, 22, 3, 3, 9, 11, 5, 9, 2, 7},
                          vocab_size = V }
end
local seq = {5, 9, 2, 7, 7, 1, 30, 12, 4, 8, 16, 22}
local m = model()
ctx.train{ model = m, data = data(), steps = 4, batch_size = 2, seq_len = 8, log_every = 0 }
local before = m:logprobs(seq)
m:set_pe(ctx.pe("rope", { rotary_pct = 1 }))
local same = m:logprobs(seq)
for i = 1, #seq - 1 do assert(same[i] == before[i], "the same PE again changes nothing") end
m:set_pe(ctx.pe("rope", { rotary_pct = 1, base = 500000 }))
assert(m:config().pe == "pe/rope")
local abf = m:logprobs(seq)
local moved = 0
for i = 1, #seq - 1 do moved = math.max(moved, math.abs(abf[i] - before[i])) end
assert(moved > 1e-6, "a larger base moves the predictions: " .. moved)  -- small: 4 steps of training
assert(abf[1] == before[1], "the first token attends only to itself: the base cannot matter")

-- extend(Le, {base =}) is set_pe with the new base, then extend
local a = model()
ctx.train{ model = a, data = data(), steps = 4, batch_size = 2, seq_len = 8, log_every = 0 }
a:extend(32, { base = 500000 })
assert(a:config().context_length == 32)
local b = a:logprobs(seq)
for i = 1, #seq - 1 do assert(b[i] == abf[i], string.format("extend with base = set_pe with base: %d %.9g %.9g", i, b[i], abf[i])) end

-- checkpoints and HF exports carry the new PE
ctx.save(out .. "/abf.h5", { model = a })
local c = ctx.load(out .. "/abf.h5")
local cl = c:logprobs(seq)
for i = 1, #seq - 1 do assert(cl[i] == b[i], "the checkpoint keeps base 500000") end
ctx.save_hf(a, out .. "/abf_hf")
local f = assert(io.open(out .. "/abf_hf/config.json"))
local cfg = f:read("a")
f:close()
assert(cfg:find('"rope_theta": 500000') or cfg:find('"rope_theta":500000'), cfg)

-- PEs with parameters are refused, naming them
local function err(fn, ...) local ok, e = pcall(fn, ...); assert(not ok); return tostring(e) end
assert(err(m.set_pe, m, "learned"):find("pe/learned has trainable parameters"))
local g = ctx.model{ vocab_size = V, d_model = 16, n_head = 2, n_layer = 1, context_length = 8 }
assert(err(g.set_pe, g, "rope"):find("pe/learned has trainable parameters"))
assert(err(g.extend, g, 16, { base = 1e5 }):find("`base` applies to pe/rope, this model has pe/learned"))
assert(err(a.extend, a, 64, { bass = 1e5 }):find("bass"))
print("set_pe ok")
