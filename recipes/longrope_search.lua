-- LongRoPE-style factor search (METHODS.md 5.3), written in Lua on the public API only: the RoPE
-- base model of the main job (trained at Lt) is extended to Le = 4 Lt without any training, by
-- per-pair rescale factors lambda_k found by an evolutionary search scored by validation
-- perplexity at Le. Everything is a recipe: candidates become a PE with model:set_pe (pe/rope
-- scaling = "longrope"), fitness is ctx.run_eval's perplexity, and the winner is written as an HF
-- checkpoint with rope_type "longrope".
--
--   mpirun -np 2 ctxengine recipes/longrope_search.lua [OUT_DIR] [quick]
local C = require("common")
local out = arg[1] or "runs/longrope_search"
local quick = arg[2] == "quick"
if quick then C.quick(out) end
local corpus = ctx.data.corpus(C.corpus)
local model = C.base_model("rope", corpus)

local Lt, Le = C.Lt, C.Le
local s = Le / Lt
local pct = C.models.rope.pe[2].rotary_pct
local cfg = model:config()
local dr = math.floor(pct * cfg.d_model / cfg.n_head)
dr = dr - dr % 2
local pairs_n, base = dr // 2, 10000.0
local search = quick and { population = 4, generations = 2, keep = 2, windows = 4 }
                      or { population = 10, generations = 8, keep = 3, windows = 48 }
math.randomseed(7)  -- the same draws on every rank: every rank builds the same candidates

-- lambda_k >= 1, non-decreasing in k (low frequencies, at large k, are scaled more)
local function legal(f)
  local g, m = {}, 1.0
  for k = 1, pairs_n do
    m = math.max(m, f[k])
    g[k] = m
  end
  return g
end

-- the seeds: position interpolation, NTK-aware, and transformers' YaRN, as per-pair factors
local function theta(b, k) return b ^ (-2 * k / dr) end
local seeds = { pi = {}, ntk = {}, yarn = {} }
local ntk_base = base * s ^ (dr / (dr - 2))
for k = 0, pairs_n - 1 do
  seeds.pi[k + 1] = s
  seeds.ntk[k + 1] = theta(base, k) / theta(ntk_base, k)
  -- hf_yarn (METHODS 5.1): ramp over k between the correction dims of 32 and 1 rotations
  local function dim(rot) return dr * math.log(Lt / (rot * 2 * math.pi)) / (2 * math.log(base)) end
  local lo, hi = math.max(math.floor(dim(32)), 0), math.min(math.ceil(dim(1)), dr - 1)
  if lo == hi then hi = hi + 0.001 end
  local ramp = math.min(math.max((k - lo) / (hi - lo), 0), 1)
  seeds.yarn[k + 1] = 1 / (ramp / s + (1 - ramp))
end

local evaluated = 0
-- validation perplexity at Le with factors f (the same windows every time)
local function fitness(f, windows)
  model:set_pe(ctx.pe("rope", { rotary_pct = pct, scaling = "longrope", short_factor = f,
                                long_factor = f, original_length = Lt, factor = s }))
  evaluated = evaluated + 1
  local task = ctx.eval("perplexity", { lengths = { Le }, max_windows = windows, batch_size = 4 })
  for _, r in ipairs(ctx.run_eval{ eval = task, model = model, data = corpus.val,
                                   out_dir = out .. "/evals", tags = { method = "longrope" } }) do
    if r.task == "perplexity" then return r.mean_ppl end
  end
  error("no perplexity record")
end

local function show(f)
  local t = {}
  for k = 1, pairs_n do t[k] = string.format("%.3f", f[k]) end
  return "{" .. table.concat(t, ", ") .. "}"
end

-- the population: the seeds, then mutations of them
local pop = {}
for _, name in ipairs({ "pi", "ntk", "yarn" }) do
  local f = legal(seeds[name])
  pop[#pop + 1] = { f = f, ppl = fitness(f, search.windows), from = name }
  ctx.log(string.format("seed %-4s ppl@Le %.3f %s", name, pop[#pop].ppl, show(f)))
end
local function mutate(f)
  local g = {}
  for k = 1, pairs_n do
    g[k] = f[k] * (math.random() < 0.4 and (0.9 + 0.2 * math.random()) or 1)
  end
  return legal(g)
end
local function crossover(a, b)
  local g = {}
  for k = 1, pairs_n do g[k] = math.random() < 0.5 and a[k] or b[k] end
  return legal(g)
end
while #pop < search.population do
  local f = mutate(pop[math.random(3)].f)
  pop[#pop + 1] = { f = f, ppl = fitness(f, search.windows), from = "mutation" }
end
local function by_ppl(a, b) return a.ppl < b.ppl end
table.sort(pop, by_ppl)
local history = { pop[1].ppl }
for gen = 1, search.generations do
  local next_pop = {}
  for i = 1, search.keep do next_pop[i] = pop[i] end  -- elitism: the best survive unchanged
  while #next_pop < search.population do
    local a, b = pop[math.random(search.keep)], pop[math.random(#pop)]
    local f = math.random() < 0.5 and mutate(a.f) or crossover(a.f, b.f)
    next_pop[#next_pop + 1] = { f = f, ppl = fitness(f, search.windows), from = "gen " .. gen }
  end
  table.sort(next_pop, by_ppl)
  pop = next_pop
  history[#history + 1] = pop[1].ppl
  ctx.log(string.format("generation %d: best ppl@Le %.3f %s", gen, pop[1].ppl, show(pop[1].f)))
  assert(pop[1].ppl <= history[#history - 1], "elitism keeps the best")
end

-- the final comparison on every held-out window (C.eval_windows: 0 = all): no scaling, the
-- seeds and the search's best
local final = C.eval_windows
local rows = {}
model:set_pe(ctx.pe("rope", { rotary_pct = pct }))
local task = ctx.eval("perplexity", { lengths = { Lt, Le }, max_windows = final, batch_size = 4 })
local plain = {}
for _, r in ipairs(ctx.run_eval{ eval = task, model = model, data = corpus.val, out_dir = out .. "/evals",
                                 tags = { method = "plain" } }) do
  if r.task == "perplexity" then plain[r.length] = r.mean_ppl end
end
rows[#rows + 1] = { "RoPE, no scaling", plain[Le] }
for _, name in ipairs({ "pi", "ntk", "yarn" }) do
  rows[#rows + 1] = { "seed " .. name, fitness(legal(seeds[name]), final) }
end
local best = pop[1]
rows[#rows + 1] = { "search best", fitness(best.f, final) }
if ctx.rank() == 0 then
  print(string.format("\nLongRoPE-style search: base RoPE at Lt = %d (ppl %.3f there), evaluated at Le = %d",
                      Lt, plain[Lt], Le))
  print(string.format("%d candidates scored on %s windows; %d generations of %d, best kept %d",
                      evaluated, search.windows, search.generations, search.population, search.keep))
  print("| factors | ppl@Le |")
  print("| --- | ---: |")
  for _, r in ipairs(rows) do print(string.format("| %s | %.3f |", r[1], r[2])) end
  print("best factors (pe/rope longrope short_factor = long_factor): " .. show(best.f))
end
model:set_pe(ctx.pe("rope", { rotary_pct = pct, scaling = "longrope", short_factor = best.f,
                              long_factor = best.f, original_length = Lt, factor = s }))
model:extend(Le)  -- the context it is meant for: max_position_embeddings = Le in the export
ctx.save_hf(model, out .. "/hf", { tokenizer = corpus.tokenizer })
ctx.log("longrope search: the best factors as an HF checkpoint in " .. out .. "/hf")
