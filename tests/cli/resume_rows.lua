-- Resume on the real pipeline: an extended learned-position model trained on chunk rows from a
-- row stream, N straight vs N/2 + save + load + N/2 (cursor, PE state, schedule, moments).
local out, N = arg[1], 8
local corpus = ctx.data.corpus{ dir = out .. "/corpus", docs = 24, min_len = 600, max_len = 1200,
                                min_distance = 40, max_distance = 120 }
local function rows()
  return ctx.data.rows{ docs = corpus.train, window = 64, row_len = 16, batch_size = 3, seed = 9,
                        sampler = ctx.sampler("chunk", { alpha = 0.25, boundary = "next" }) }
end
local function model()
  local m = ctx.model{ vocab_size = 259, d_model = 32, n_layer = 2, n_head = 2, context_length = 16, seed = 4 }
  m:extend(64)
  return m
end
local opt = { lr = 3e-3, warmup_steps = 2, total_steps = N }
local a, ra = model(), rows()
local straight = ctx.train{ model = a, data = ra, steps = N, optimizer = opt, log_every = 0 }
local b, rb = model(), rows()
local first = ctx.train{ model = b, data = rb, steps = N // 2, optimizer = opt, log_every = 0 }
ctx.save_checkpoint(out .. "/ckpt", { model = b, data = rb })
local rc = rows()
local c = ctx.load(ctx.latest_checkpoint(out .. "/ckpt"), { data = rc })
assert(c:config().context_length == 64, "the extended length is restored")
local second = ctx.train{ model = c, data = rc, steps = N - N // 2, log_every = 0 }
for i = 1, N do
  local r = i <= N // 2 and first.losses[i] or second.losses[i - N // 2]
  assert(r == straight.losses[i], string.format("step %d: %.17g vs %.17g", i, straight.losses[i], r))
end
assert(a:fingerprint() == c:fingerprint(), "states differ")
print("resume rows bit-exact", c:fingerprint())
