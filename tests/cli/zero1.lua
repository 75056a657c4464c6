-- ZeRO-1 under mpirun (2 or 3 ranks): the AdamW state sharded over the ranks (ctx.train{zero =
-- 1}) trains bit-identically to the whole state (zero = 0): same losses, same parameters and
-- moments (model:fingerprint gathers the shards); a checkpoint saved sharded resumes unsharded
-- and the other way round with the same continuation; extend() keeps the moments; every rank
-- ends with the same parameters.
local function model()
  return ctx.model{ vocab_size = 48, d_model = 32, n_layer = 2, n_head = 4, context_length = 16,
                   pe = ctx.pe("learned"), seed = 3 }  -- extend() grows its table
end
local opt = { lr = 3e-3, warmup_steps = 2, weight_decay = 0.1, grad_clip = 0.5 }
local function run(zero_first, zero_second, dir)
  local data = ctx.data.synthetic{ length = 4000, period = 20, vocab_size = 48, seed = 5 }
  local m = model()
  local r1 = ctx.train{ model = m, data = data, steps = 4, batch_size = 2, optimizer = opt,
                        log_every = 0, zero = zero_first }
  if dir then
    ctx.save_checkpoint(dir, { model = m })
    m = ctx.load(ctx.latest_checkpoint(dir))
  end
  m:extend(32)
  local r2 = ctx.train{ model = m, data = data, steps = 3, batch_size = 2, seq_len = 32,
                        log_every = 0, zero = zero_second }
  local losses = {}
  for _, x in ipairs(r1.losses) do losses[#losses + 1] = string.format("%.9g", x) end
  for _, x in ipairs(r2.losses) do losses[#losses + 1] = string.format("%.9g", x) end
  return m:fingerprint(), table.concat(losses, " ")
end
local out = arg[1] or "/tmp/zero1"
local f0, l0 = run(0, 0)
local f1, l1 = run(1, 1)
local f2, l2 = run(1, 0, out .. "/a")  -- saved sharded, continued whole
local f3, l3 = run(0, 1, out .. "/b")  -- saved whole, continued sharded
assert(l1 == l0, "zero = 1 losses " .. l1 .. " differ from zero = 0 " .. l0)
assert(f1 == f0, "zero = 1 state " .. f1 .. " differs from zero = 0 " .. f0)
assert(f2 == f0 and l2 == l0, "a sharded checkpoint resumed whole differs")
assert(f3 == f0 and l3 == l0, "a whole checkpoint resumed sharded differs")
local ok, err = pcall(ctx.train, { model = model(), steps = 1, batch_size = 2, zero = 2,
                                   data = ctx.data.synthetic{ length = 400, vocab_size = 48 } })
assert(not ok and tostring(err):find("zero.*must be 0 or 1"), tostring(err))
print(string.format("rank %d of %d fingerprint %s zero1 ok", ctx.rank(), ctx.world_size(), f1))
