-- ctx.sampler.lua in a recipe: a PoSE-like sampler written in Lua (two chunks, the second
-- skipped by rng:below) trains inside a mix with a plugin sampler, and a run resumed from a
-- checkpoint gives the same losses as a straight one (the rows come from each row's own rng).
local out, N = arg[1], 6
local corpus = ctx.data.corpus{ dir = out .. "/corpus", docs = 24, min_len = 600, max_len = 1200,
                                min_distance = 40, max_distance = 120 }
local skip = ctx.sampler.lua(function(window, W, L, rng)
  local cut = 1 + rng:below(L - 1)             -- chunk lengths cut and L - cut
  local u = rng:below(W - L + 1)               -- the second chunk's skip
  local t, p, g = {}, {}, {}
  for r = 1, L do
    local pos = r - 1 + (r > cut and u or 0)
    t[r], p[r], g[r] = window[pos + 1], pos, window[pos + 2]
  end
  return { tokens = t, positions = p, targets = g }
end, { name = "skip" })
assert(tostring(skip) == "ctx.SamplerSpec(lua:skip)", tostring(skip))
local mix = ctx.sampler.mix{ { weight = 0.5, sampler = "full" }, { weight = 0.5, sampler = skip } }
local function rows()
  return ctx.data.rows{ docs = corpus.train, window = 64, row_len = 16, batch_size = 3, seed = 5,
                        sampler = mix }
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
local first = ctx.train{ model = b, data = rb, steps = 2, optimizer = opt, log_every = 0 }
ctx.save_checkpoint(out .. "/ckpt", { model = b, data = rb })
local rc = rows()
local c = ctx.load(ctx.latest_checkpoint(out .. "/ckpt"), { data = rc })
local second = ctx.train{ model = c, data = rc, steps = N - 2, log_every = 0 }
for i = 1, N do
  local r = i <= 2 and first.losses[i] or second.losses[i - 2]
  assert(r == straight.losses[i], string.format("step %d: %.17g vs %.17g", i, straight.losses[i], r))
end
-- a bad sampler fails where the stream is built (its trial row), naming itself and its line
local bad = ctx.sampler.lua(function(window, W, L, rng) return { tokens = {}, positions = {}, targets = {} } end)
local ok, err = pcall(ctx.data.rows, { docs = corpus.train, window = 64, row_len = 16, batch_size = 3,
                                       sampler = bad })
assert(not ok and tostring(err):find("lua:function %(.*lua_sampler%.lua:%d+:%): invalid row: 'tokens' has 0 entries"), tostring(err))
print("lua sampler resumes bit-exact", c:fingerprint())
