-- ctx.save_checkpoint retention: keep_last newest step files plus multiples of keep_every; the
-- file `latest` names is always kept and loads.
local dir = arg[1] or "/tmp/retention"
local data = ctx.data.synthetic{ length = 600, period = 10, vocab_size = 32, seed = 2 }
local m = ctx.model{ vocab_size = 32, d_model = 16, n_layer = 1, n_head = 2, context_length = 8 }
local function exists(step)
  local f = io.open(string.format("%s/step-%08d.h5", dir, step), "rb")
  if f then f:close() end
  return f ~= nil
end
for _ = 1, 5 do
  ctx.train{ model = m, data = data, steps = 1, batch_size = 2, log_every = 0 }
  ctx.save_checkpoint(dir, { model = m, keep_last = 2, keep_every = 2 })
end
assert(not exists(1) and exists(2) and not exists(3) and exists(4) and exists(5),
       "expected steps 2, 4, 5 to remain")
assert(ctx.load(ctx.latest_checkpoint(dir)))
local ok, err = pcall(ctx.save_checkpoint, dir, { model = m, keep_every = 3 })
assert(not ok and tostring(err):find("keep_every.*only applies with keep_last"), tostring(err))
ok, err = pcall(ctx.save_checkpoint, dir, { model = m, keep_last = -1 })
assert(not ok and tostring(err):find("keep_last.*must be >= 0"), tostring(err))
print("retention ok")
