-- Ablation: how retrieval beyond Lt grows with the length of chunk-0.25 training. The main job's
-- base models (runs/base_<pe>, trained now when missing), chunk-0.25 rows exactly as in
-- chunk_experiment.lua, one fresh run (its own warmup and cosine schedule) per multiple of the
-- compute-parity steps, each evaluated at 4Lt with the windowed control and teacher-forced recall
-- accuracy by distance. The main job trains at 1x; this shows what more steps would buy.
--
--   mpirun -np 2 ctxengine recipes/extension_steps.lua [OUT (runs/extension_steps)] [PE (rope)]
--                                                     [MULTIPLES (1,2,4)] [quick]
local C = require("common")
local out = arg[1] or "runs/extension_steps"
local pe = arg[2] or "rope"
local multiples = {}
for m in (arg[3] or "1,2,4"):gmatch("[^,]+") do
  local v = tonumber(m)
  if not v or v <= 0 then error("MULTIPLES: expected positive numbers separated by commas, got '"
                                .. tostring(arg[3]) .. "'", 0) end
  multiples[#multiples + 1] = v
end
if arg[4] == "quick" then C.quick(out .. "/quick") end
if not C.models[pe] then error("PE: expected rope or learned, got '" .. pe .. "'", 0) end
local corpus = ctx.data.corpus(C.corpus)
C.base_model(pe, corpus)  -- trained and saved when missing
local base = ctx.latest_checkpoint(C.base_dir(pe))

local optimizer = { lr = 1e-3, warmup_steps = 20, min_lr = 1e-4, weight_decay = 0.1 }
for k, v in pairs(C.extend_optimizer or {}) do optimizer[k] = v end

local function evaluate(model, tags)
  local task = ctx.eval("perplexity", { multiples = { 4 }, max_windows = C.eval_windows,
                                        batch_size = 4, windowed = true, recall = true })
  local r = { rec = {} }
  for _, x in ipairs(ctx.run_eval{ eval = task, model = model, data = corpus.val, out_dir = out,
                                    tokenizer = corpus.tokenizer, tags = tags }) do
    if x.task == "perplexity" then r.ppl, r.win = x.mean_ppl, x.windowed_mean_ppl
    elseif x.task == "perplexity_recall" then r.rec[x.distance_from // C.Lt] = x end
  end
  return r
end

local function base_recall()
  local task = ctx.eval("perplexity", { multiples = { 1 }, max_windows = C.eval_windows,
                                        batch_size = 4, windowed = true, recall = true })
  for _, x in ipairs(ctx.run_eval{ eval = task, model = ctx.load(base), data = corpus.val,
                                    out_dir = out, tokenizer = corpus.tokenizer,
                                    tags = { pe = pe, steps = 0, multiple_of_parity = 0 } }) do
    if x.task == "perplexity_recall" and x.distance_from == 0 and type(x.accuracy) == "number" then
      return x.accuracy
    end
  end
end

local rows = ctx.data.rows{ docs = corpus.train, window = C.Le, row_len = C.Lt,
                            sampler = ctx.sampler("chunk", { alpha = 0.25, boundary = "concat" }),
                            batch_size = C.batch_size, seed = 21 }
local parity = (C.Le // C.Lt) * rows:num_windows() // (C.batch_size * ctx.parallel().dp)
local results = {}
for _, mult in ipairs(multiples) do
  local steps = math.max(1, math.floor(mult * parity + 0.5))
  local model = ctx.load(base)
  if pe == "learned" then model:extend(C.Le) end
  local data = ctx.data.rows{ docs = corpus.train, window = C.Le, row_len = C.Lt,
                              sampler = ctx.sampler("chunk", { alpha = 0.25, boundary = "concat" }),
                              batch_size = C.batch_size, seed = 21 }
  ctx.log(string.format("%s: chunk-0.25 for %d steps (%gx parity of %d)", pe, steps, mult, parity))
  ctx.train{ model = model, data = data, steps = steps, log_every = 100, optimizer = optimizer }
  results[#results + 1] = { mult = mult, steps = steps,
                            r = evaluate(model, { pe = pe, steps = steps, multiple_of_parity = mult }) }
end
local b = base_recall()

if ctx.rank() == 0 then
  local function num(v, fmt) return type(v) == "number" and v == v and string.format(fmt, v) or "-" end
  local h = string.format("%-7s %6s | %8s %8s | %8s %8s %8s | %8s %8s | %s", "parity", "steps",
                          "ppl 4Lt", "win 4Lt", "4Lt:<Lt", "[Lt,2Lt)", "[2Lt,4Lt)", "win:[1,2)",
                          "win:[2,4)", "far / base")
  local lines = { h, string.rep("-", #h) }
  local csv = { "multiple_of_parity,steps,ppl_4lt,windowed_ppl_4lt,recall_lt,recall_1_2,recall_2_4,"
                .. "windowed_recall_1_2,windowed_recall_2_4,base_recall_lt" }
  for _, x in ipairs(results) do
    local r = x.r.rec
    local function real(v) return type(v) == "number" and v == v and v or nil end
    local function acc(bin) return r[bin] and real(r[bin].accuracy) end
    local function wacc(bin) return r[bin] and real(r[bin].windowed_accuracy) end
    lines[#lines + 1] = string.format("%-7s %6d | %8s %8s | %8s %8s %8s | %8s %8s | %s",
      string.format("%gx", x.mult), x.steps, num(x.r.ppl, "%8.3f"), num(x.r.win, "%8.3f"),
      num(acc(0), "%8.3f"), num(acc(1), "%8.3f"), num(acc(2), "%8.3f"), num(wacc(1), "%8.3f"),
      num(wacc(2), "%8.3f"), (b and acc(2) and b > 0) and string.format("%.0f%%", 100 * acc(2) / b) or "-")
    csv[#csv + 1] = string.format("%g,%d,%s,%s,%s,%s,%s,%s,%s,%s", x.mult, x.steps,
      num(x.r.ppl, "%.6f"), num(x.r.win, "%.6f"), num(acc(0), "%.6f"), num(acc(1), "%.6f"),
      num(acc(2), "%.6f"), num(wacc(1), "%.6f"), num(wacc(2), "%.6f"), num(b, "%.6f"))
  end
  print(string.format("\nchunk-0.25 training length, %s (Lt = %d, Le = %d; base recall at [0,Lt): %s):\n%s",
                      pe, C.Lt, C.Le, num(b, "%.3f"), table.concat(lines, "\n")))
  local f = assert(io.open(out .. "/extension_steps.csv", "w"))
  f:write(table.concat(csv, "\n"), "\n")
  f:close()
  print("wrote " .. out .. "/extension_steps.csv")
end
