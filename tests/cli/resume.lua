-- Resume is bit-exact: N steps straight == N/2 steps, save, load into a fresh model and data
-- stream, N/2 steps. Compares every loss and the full training state (parameters, moments, step).
local out = arg[1] or "/tmp/ctx_resume_test"
local N = 8
local function data() return ctx.data.synthetic{ length = 3000, period = 20, vocab_size = 48, seed = 5 } end
local function model()
  return ctx.model{ style = arg[2] or "gpt2", vocab_size = 48, d_model = 32, n_layer = 2, n_head = 4,
                    context_length = 32, seed = 3 }
end
local opt = { lr = 3e-3, warmup_steps = 2, total_steps = N }

local a, da = model(), data()
local straight = ctx.train{ model = a, data = da, steps = N, batch_size = 4, optimizer = opt, log_every = 0 }

local b, db = model(), data()
local first = ctx.train{ model = b, data = db, steps = N // 2, batch_size = 4, optimizer = opt, log_every = 0 }
ctx.save(out .. "/half.h5", { model = b, data = db, metadata = { note = "resume test" } })
local dc = data()
local c = ctx.load(out .. "/half.h5", { data = dc })
-- No optimizer table: continue the saved schedule (a new table would start a new schedule).
local second = ctx.train{ model = c, data = dc, steps = N - N // 2, batch_size = 4, log_every = 0 }

local resumed = {}
for _, l in ipairs(first.losses) do resumed[#resumed + 1] = l end
for _, l in ipairs(second.losses) do resumed[#resumed + 1] = l end
assert(#resumed == N, "expected " .. N .. " losses")
for i = 1, N do
  assert(resumed[i] == straight.losses[i],
    string.format("step %d: straight %.17g resumed %.17g", i, straight.losses[i], resumed[i]))
end
assert(a:fingerprint() == c:fingerprint(), "states differ: " .. a:fingerprint() .. " vs " .. c:fingerprint())
assert(a:fingerprint() ~= b:fingerprint(), "the half-way state must differ from the final one")
print("resume bit-exact", a:fingerprint())
