-- The segmented-sequences paper's grid (its Tables 2 and 3; METHODS.md sections 3.2 and 4) on one
-- corpus, plus the bias PEs trained from scratch (KERPLE's claim) and rows beyond the paper:
--
--   mpirun -np 2 ctxengine recipes/paper_grid.lua [generated | python-docs] [OUT] [quick]
--
-- For APE (GPT-2-like, learned positions) and RoPE (Pythia-like) base models trained at Lt, every
-- method continues training at compute parity (METHODS.md 3.2: the tokens of Le/Lt epochs over
-- the Le windows, in rows of Lt tokens; "full 2Lt" spends the same tokens in rows of 2Lt):
--   OOTB          the base model as it is (APE interpolated to each length, METHODS.md 1.1)
--   DA            the same tokens as plain Lt rows (the paper's domain-adaptation control)
--   full-2Lt      full 2Lt windows
--   chunk-a       a in {0.125, 0.25, 0.5} (boundary "concat", the paper's)
--   prefix-a      a in {0.25, 0.5}
--   randomized    Giraffe's randomized positions (gaps U[1/16, 2])
--   beyond the paper: mix (25% plain Lt rows, 75% chunk-0.25), curriculum (chunk-0.25 from 2Lt
--   windows for the first half, 4Lt after), chunk-0.25 with boundary "next"
-- and ALiBi, KERPLE-log, KERPLE-power, T5 trained from scratch at Lt, evaluated to 8Lt.
-- OOTB, DA, chunk-0.25, prefix-0.25 and full-2Lt run with 3 seeds (base model and data order);
-- the tables show their mean and, after "±", half the range. Every cell's model also takes the
-- passkey probe (eval/passkey: teacher-forced and generated, 5 depths x 4 prompts per length) at
-- 1, 2, 4 Lt (8 Lt for the bias PEs).
--
-- Every cell's results are written to OUT/cell_<cell>.lua when it finishes, so a killed grid
-- run again continues where it stopped (base models are reused from OUT/base_* likewise).
-- Tables: OUT/grid.txt and OUT/grid.csv; per-cell CSVs from the eval tasks in OUT/; the figure:
-- python3 scripts/plot.py OUT (OUT/grid.png).
local C = require("common")
local which = arg[1] or "generated"
local out = arg[2] or ("runs/paper_grid_" .. which)
local quick = arg[3] == "quick"
if quick then C.quick(out) end
C.runs = out

-- ---------------------------------------------------------------- corpus
local corpus
if which == "generated" then
  corpus = ctx.data.corpus(C.corpus)
elseif which == "python-docs" then
  local shards = "data/real/python-docs-bpe4096/shards"
  local function shard(split)
    local f = io.open(shards .. "/" .. split .. ".shard", "rb")
    if not f then
      error("no " .. shards .. "/" .. split .. ".shard: build the corpus first (bash scripts/" ..
            "prepare_corpus.sh --train-bpe 4096 --out data/real/python-docs-bpe4096)", 0)
    end
    f:close()
    return ctx.data.shard(shards .. "/" .. split .. ".shard")
  end
  corpus = { train = shard("train"), val = shard("val"),
             tokenizer = ctx.tokenizer("data/real/python-docs-bpe4096/tokenizer/tokenizer.json") }
  if not quick then
    C.size = { d_model = 128, n_layer = 4, n_head = 4 }
    C.pretrain = { steps = 1200, optimizer = { lr = 2e-3, warmup_steps = 30, min_lr = 2e-4, weight_decay = 0.1 } }
  end
else
  error("paper_grid.lua: corpus must be 'generated' or 'python-docs', got '" .. tostring(which) .. "'", 0)
end
local recall = which == "generated"  -- recall accuracy needs the generated corpus's recalls
local Lt, Le = C.Lt, C.Le
local seeds = quick and { 1, 2 } or { 1, 2, 3 }
local multi_seed = { OOTB = true, DA = true, ["chunk-0.25"] = true, ["prefix-0.25"] = true, ["full-2Lt"] = true }

-- ---------------------------------------------------------------- cell results on disk
-- (written last, after the cell's evaluation created OUT; a cut-off file does not parse and the
-- cell runs again)
local function cell_path(name) return out .. "/cell_" .. name:gsub("[^%w%-%.]", "_") .. ".lua" end

local function serialize(v)
  if type(v) == "table" then
    local parts = {}
    for k, x in pairs(v) do
      local key = type(k) == "number" and ("[" .. k .. "]") or string.format("[%q]", k)
      parts[#parts + 1] = key .. " = " .. serialize(x)
    end
    table.sort(parts)
    return "{ " .. table.concat(parts, ", ") .. " }"
  elseif type(v) == "number" then
    return v ~= v and "0/0" or string.format("%.17g", v)
  else
    return string.format("%q", tostring(v))
  end
end

local function load_cell(name)
  local f = io.open(cell_path(name), "r")
  if not f then return nil end
  local text = f:read("a")
  f:close()
  local chunk = load(text, "=" .. cell_path(name), "t", {})
  return chunk and chunk() or nil
end

local function save_cell(name, result)
  if ctx.rank() ~= 0 then return end
  local f = assert(io.open(cell_path(name), "w"))
  f:write("return ", serialize(result), "\n")
  f:close()
end

-- ---------------------------------------------------------------- evaluation
-- result = { ppl = {[m] =}, win = {[m] =}, rec = {[m] = {[bin] = accuracy}}, wrec = {...} }
local function evaluate(model, tags, multiples, result)
  local task = ctx.eval("perplexity", { multiples = multiples, max_windows = C.eval_windows,
                                        batch_size = 4, windowed = true, recall = recall })
  for _, r in ipairs(ctx.run_eval{ eval = task, model = model, data = corpus.val, out_dir = out,
                                   tokenizer = corpus.tokenizer, tags = tags }) do
    local m = r.multiple
    if r.task == "perplexity" then
      result.ppl[m], result.win[m] = r.mean_ppl, r.windowed_mean_ppl
    elseif r.task == "perplexity_recall" then
      local bin = r.distance_from // Lt
      result.rec[m] = result.rec[m] or {}
      result.wrec[m] = result.wrec[m] or {}
      result.rec[m][bin] = type(r.accuracy) == "number" and r.accuracy or 0 / 0
      result.wrec[m][bin] = type(r.windowed_accuracy) == "number" and r.windowed_accuracy or 0 / 0
    end
  end
end

local function new_result() return { ppl = {}, win = {}, rec = {}, wrec = {} } end

-- A saved model at each of `multiples`: learned tables are interpolated (METHODS.md 1.1) to any
-- length beyond the model's context, on a fresh copy per length (so a base model at Lt is
-- evaluated the OOTB way); other PEs run as they are.
local function evaluate_saved(path, pe, tags, multiples)
  local result = new_result()
  if pe == "learned" then
    for _, m in ipairs(multiples) do
      local copy = ctx.load(path)
      if m * Lt > copy:config().context_length then copy:extend(m * Lt) end
      evaluate(copy, tags, { m }, result)
    end
  else
    evaluate(ctx.load(path), tags, multiples, result)
  end
  return result
end

-- The passkey probe on a saved model at each of `multiples` (learned tables interpolated as
-- above): pk[m] = { tf = teacher-forced accuracy, gen = generated accuracy }. Quick mode probes
-- 8 Lt and 16 Lt instead: the prompt's fixed text is 141 of its tokens, more than 4 x its Lt of 32.
local function passkey(path, pe, tags, multiples)
  local pk = {}
  local function probe(model, ms)
    local lengths = {}
    for i, m in ipairs(ms) do lengths[i] = m * Lt end
    local task = ctx.eval("passkey", { token_lengths = lengths, num_depths = quick and 2 or 5,
                                       per_setting = quick and 1 or 4 })
    for _, r in ipairs(ctx.run_eval{ eval = task, model = model, data = corpus.val, out_dir = out,
                                     tokenizer = corpus.tokenizer, tags = tags }) do
      if r.task == "passkey_by_length" then
        local num = function(v) return type(v) == "number" and v or 0 / 0 end
        pk[r.length // Lt] = { tf = num(r.tf_accuracy), gen = num(r.accuracy) }
      end
    end
  end
  if quick then multiples = { 8, 16 } end
  if pe == "learned" then
    for _, m in ipairs(multiples) do
      -- room for the prompt and the 12 tokens the probe generates after it
      local copy = ctx.load(path)
      if m * Lt + 16 > copy:config().context_length then copy:extend(m * Lt + 16) end
      probe(copy, { m })
    end
  else
    probe(ctx.load(path), multiples)
  end
  return pk
end

-- ---------------------------------------------------------------- models
local spec = {
  learned = { style = "gpt2", pe = { "learned", { init_std = 0.02 } } },
  rope = C.models.rope,
  alibi = { style = "bloom", pe = { "alibi", {} } },
  kerple_log = { style = "gpt2", pe = { "kerple_log", {} } },
  kerple_power = { style = "gpt2", pe = { "kerple_power", {} } },
  t5_bias = { style = "gpt2", pe = { "t5_bias", {} } },
}

-- The base model of (pe, seed): trained at Lt on plain rows, or reused from its directory.
local function base(pe, seed)
  local dir = string.format("%s/base_%s_s%d", out, pe, seed)
  local path = ctx.latest_checkpoint(dir)
  if path then return path end
  local s = spec[pe]
  local t = { style = s.style, context_length = Lt, seed = seed, pe = ctx.pe(s.pe[1], s.pe[2]),
              vocab_size = corpus.train:vocab_size() }
  for k, v in pairs(C.size) do t[k] = v end
  local model = ctx.model(t)
  local rows = ctx.data.rows{ docs = corpus.train, window = Lt, batch_size = C.batch_size, seed = 10 + seed }
  ctx.log(string.format("grid: base %s seed %d (%d steps at Lt = %d)", pe, seed, C.pretrain.steps, Lt))
  ctx.train{ model = model, data = rows, steps = C.pretrain.steps, optimizer = C.pretrain.optimizer,
             log_every = 200, out_dir = out }
  ctx.save_checkpoint(dir, { model = model, data = rows, metadata = { stage = "base", seed = seed } })
  return ctx.latest_checkpoint(dir)
end

-- ---------------------------------------------------------------- methods
local function chunk(alpha, boundary)
  return { window = Le, sampler = ctx.sampler("chunk", { alpha = alpha, boundary = boundary or "concat" }) }
end
local methods = {
  { name = "DA", rows = function() return { window = Lt } end },
  { name = "full-2Lt", rows = function() return { window = 2 * Lt } end, row_len = 2 * Lt, extend = 2 * Lt },
  { name = "chunk-0.125", rows = function() return chunk(0.125) end },
  { name = "chunk-0.25", rows = function() return chunk(0.25) end },
  { name = "chunk-0.5", rows = function() return chunk(0.5) end },
  { name = "prefix-0.25", rows = function() return { window = Le, sampler = ctx.sampler("prefix", { alpha = 0.25 }) } end },
  { name = "prefix-0.5", rows = function() return { window = Le, sampler = ctx.sampler("prefix", { alpha = 0.5 }) } end },
  { name = "randomized", rows = function() return { window = Le, sampler = ctx.sampler("randomized", {}) } end },
  { name = "mix", beyond = true, rows = function()
      return { window = Le, sampler = ctx.sampler.mix{
        { weight = 0.25, sampler = "full", window = Lt },
        { weight = 0.75, sampler = ctx.sampler("chunk", { alpha = 0.25 }) } } } end },
  { name = "curriculum", beyond = true, rows = function(steps)
      return { sampler = ctx.sampler("chunk", { alpha = 0.25 }),
               curriculum = { { steps = steps // 2, window = 2 * Lt }, { window = Le } } } end },
  { name = "chunk-0.25-next", beyond = true, rows = function() return chunk(0.25, "next") end },
}

-- Steps at compute parity: the tokens of Le/Lt epochs over the Le windows.
local parity_rows = ctx.data.rows{ docs = corpus.train, window = Le, row_len = Lt, batch_size = C.batch_size,
                                   sampler = ctx.sampler("chunk", { alpha = 0.25 }), seed = 1 }
local parity_tokens = (Le // Lt) * parity_rows:num_windows() * Lt
local function parity_steps(row_len)
  local steps = parity_tokens // (row_len * C.batch_size * ctx.parallel().dp)
  return math.max(1, quick and math.min(steps, 6) or steps)
end

local extend_optimizer = { lr = 1e-3, warmup_steps = 20, min_lr = 1e-4, weight_decay = 0.1 }
for k, v in pairs(C.extend_optimizer or {}) do extend_optimizer[k] = v end

-- One cell: a method applied to the base (pe, seed), trained and evaluated, or loaded from disk.
-- A cell finished by an earlier run without the passkey probe gets it now.
local function with_passkey(name, result, path, pe, multiples)
  if result.passkey then return result end
  ctx.log(string.format("passkey: %s", name))
  result.passkey = passkey(path, pe, { method = name }, multiples)
  save_cell(name, result)
  return result
end

local function run_cell(method, pe, seed)
  local name = string.format("%s_%s_s%d", method.name, pe, seed)
  local done = load_cell(name)
  if done then
    return with_passkey(name, done, ctx.latest_checkpoint(out .. "/ckpt_" .. name), pe, { 1, 2, 4 })
  end
  local path = base(pe, seed)
  local model = ctx.load(path)
  local row_len = method.row_len or Lt
  local steps = parity_steps(row_len)
  local r = method.rows(steps)
  if pe == "learned" then model:extend(method.extend or (r.window or Le)) end
  local rows = ctx.data.rows{ docs = corpus.train, window = r.window, row_len = row_len,
                              sampler = r.sampler, curriculum = r.curriculum,
                              batch_size = C.batch_size, seed = 100 * seed + 7 }
  ctx.log(string.format("grid: %s (%d steps of %d x %d tokens per rank)", name, steps, C.batch_size, row_len))
  ctx.train{ model = model, data = rows, steps = steps, optimizer = extend_optimizer, log_every = 0,
             out_dir = out }
  local dir = out .. "/ckpt_" .. name
  ctx.save_checkpoint(dir, { model = model, metadata = { method = method.name, seed = seed } })
  local result = evaluate_saved(ctx.latest_checkpoint(dir), pe, { method = name }, { 1, 2, 4 })
  return with_passkey(name, result, ctx.latest_checkpoint(dir), pe, { 1, 2, 4 })
end

local function run_ootb(pe, seed)
  local name = string.format("OOTB_%s_s%d", pe, seed)
  local done = load_cell(name)
  if done then return with_passkey(name, done, base(pe, seed), pe, { 1, 2, 4 }) end
  local result = evaluate_saved(base(pe, seed), pe, { method = name }, { 1, 2, 4 })
  return with_passkey(name, result, base(pe, seed), pe, { 1, 2, 4 })
end

-- Bias PEs from scratch at Lt, evaluated to 8Lt.
local function run_scratch(pe)
  local name = "scratch_" .. pe
  local done = load_cell(name)
  if done then return with_passkey(name, done, base(pe, 1), pe, { 1, 2, 4, 8 }) end
  local model = ctx.load(base(pe, 1))
  local result = new_result()
  evaluate(model, { method = name }, { 1, 2, 4, 8 }, result)
  return with_passkey(name, result, base(pe, 1), pe, { 1, 2, 4, 8 })
end

-- ---------------------------------------------------------------- the grid
local results = {}  -- results[row][pe] = list of per-seed results
local function add(row, pe, r)
  results[row] = results[row] or {}
  results[row][pe] = results[row][pe] or {}
  table.insert(results[row][pe], r)
end
local rows_order = { "OOTB" }
for _, m in ipairs(methods) do rows_order[#rows_order + 1] = m.name end

for _, pe in ipairs{ "learned", "rope" } do
  for _, seed in ipairs(seeds) do
    add("OOTB", pe, run_ootb(pe, seed))
    for _, m in ipairs(methods) do
      if seed == 1 or multi_seed[m.name] then add(m.name, pe, run_cell(m, pe, seed)) end
    end
  end
end
local scratch = { "alibi", "kerple_log", "kerple_power", "t5_bias" }
for _, pe in ipairs(scratch) do add("scratch", pe, run_scratch(pe)) end

-- ---------------------------------------------------------------- tables
local function stats(list, get)
  local xs = {}
  for _, r in ipairs(list or {}) do
    local v = get(r)
    if type(v) == "number" and v == v then xs[#xs + 1] = v end
  end
  if #xs == 0 then return nil end
  local sum, lo, hi = 0, math.huge, -math.huge
  for _, v in ipairs(xs) do sum, lo, hi = sum + v, math.min(lo, v), math.max(hi, v) end
  return sum / #xs, (hi - lo) / 2, #xs
end
local function cell(list, get, fmt)
  local mean, half, n = stats(list, get)
  if not mean then return "-" end
  if n > 1 then return string.format(fmt .. "±" .. fmt, mean, half) end
  return string.format(fmt, mean)
end

local lines, csv = {}, { "row,pe,seeds,measure,multiple,mean,half_range" }
local function line(s) lines[#lines + 1] = s end
local function csv_row(row, pe, measure, m, list, get)
  local mean, half, n = stats(list, get)
  if mean then csv[#csv + 1] = string.format("%s,%s,%d,%s,%s,%.6f,%.6f", row, pe, n, measure, m, mean, half) end
end

line(string.format("Paper grid on the %s corpus (Lt = %d, Le = %d), mean per-window perplexity:", which, Lt, Le))
local h = string.format("%-16s | %13s %13s %13s | %13s %13s %13s", "method", "APE Lt", "APE 2Lt", "APE 4Lt",
                        "RoPE Lt", "RoPE 2Lt", "RoPE 4Lt")
line(h); line(string.rep("-", #h))
for _, row in ipairs(rows_order) do
  local cells = {}
  for _, pe in ipairs{ "learned", "rope" } do
    for _, m in ipairs{ 1, 2, 4 } do
      local list = results[row][pe]
      cells[#cells + 1] = string.format("%13s", cell(list, function(r) return r.ppl[m] end, "%.3f"))
      csv_row(row, pe, "ppl", m, list, function(r) return r.ppl[m] end)
      csv_row(row, pe, "windowed_ppl", m, list, function(r) return r.win[m] end)
      for bin = 0, 2 do
        csv_row(row, pe, "recall_bin" .. bin, m, list, function(r) return (r.rec[m] or {})[bin] end)
        csv_row(row, pe, "windowed_recall_bin" .. bin, m, list, function(r) return (r.wrec[m] or {})[bin] end)
      end
    end
  end
  line(string.format("%-16s | %s %s %s | %s %s %s", row, table.unpack(cells)))
end
if recall then
  line("")
  line("Recall accuracy (teacher-forced) on 4Lt windows by distance; win = windowed control:")
  h = string.format("%-16s | %11s %11s %11s %11s | %11s %11s %11s %11s", "method", "APE <Lt",
                    "APE [1,2)", "APE [2,4)", "win [2,4)", "RoPE <Lt", "RoPE [1,2)", "RoPE [2,4)", "win [2,4)")
  line(h); line(string.rep("-", #h))
  for _, row in ipairs(rows_order) do
    local cells = {}
    for _, pe in ipairs{ "learned", "rope" } do
      local list = results[row][pe]
      for bin = 0, 2 do
        cells[#cells + 1] = string.format("%11s", cell(list, function(r) return (r.rec[4] or {})[bin] end, "%.2f"))
      end
      cells[#cells + 1] = string.format("%11s", cell(list, function(r) return (r.wrec[4] or {})[2] end, "%.2f"))
    end
    line(string.format("%-16s | %s %s %s %s | %s %s %s %s", row, table.unpack(cells)))
  end
end
local pk_multiples = quick and { 8, 16 } or { 1, 2, 4 }
line("")
line("Passkey accuracy, teacher-forced (generated in brackets), by prompt length:")
h = string.format("%-16s |", "method")
for _, pe in ipairs{ "APE", "RoPE" } do
  for _, m in ipairs(pk_multiples) do h = h .. string.format(" %21s", string.format("%s %dLt", pe, m)) end
  if pe == "APE" then h = h .. " |" end
end
line(h); line(string.rep("-", #h))
for _, row in ipairs(rows_order) do
  local t = string.format("%-16s |", row)
  for _, pe in ipairs{ "learned", "rope" } do
    local list = results[row][pe]
    for _, m in ipairs(pk_multiples) do
      local get_tf = function(r) return ((r.passkey or {})[m] or {}).tf end
      local get_gen = function(r) return ((r.passkey or {})[m] or {}).gen end
      t = t .. string.format(" %21s", cell(list, get_tf, "%.2f") .. " (" .. cell(list, get_gen, "%.2f") .. ")")
      csv_row(row, pe, "passkey_tf", m, list, get_tf)
      csv_row(row, pe, "passkey_gen", m, list, get_gen)
    end
    if pe == "learned" then t = t .. " |" end
  end
  line(t)
end
line("")
line("Trained from scratch at Lt, mean per-window perplexity (recall [2Lt,4Lt) at 4Lt; passkey")
line("teacher-forced at the longest length):")
h = string.format("%-16s | %9s %9s %9s %9s | %9s %9s", "PE", "Lt", "2Lt", "4Lt", "8Lt", "recall", "passkey")
line(h); line(string.rep("-", #h))
for _, pe in ipairs(scratch) do
  local list = results.scratch[pe]
  local c = {}
  for _, m in ipairs{ 1, 2, 4, 8 } do
    c[#c + 1] = string.format("%9s", cell(list, function(r) return r.ppl[m] end, "%.3f"))
    csv_row("scratch", pe, "ppl", m, list, function(r) return r.ppl[m] end)
  end
  c[#c + 1] = string.format("%9s", cell(list, function(r) return (r.rec[4] or {})[2] end, "%.2f"))
  local get_pk = function(r) return ((r.passkey or {})[quick and 16 or 8] or {}).tf end
  c[#c + 1] = string.format("%9s", cell(list, get_pk, "%.2f"))
  csv_row("scratch", pe, "passkey_tf", quick and 16 or 8, list, get_pk)
  line(string.format("%-16s | %s %s %s %s | %s %s", pe, table.unpack(c)))
end
line(string.format("(± is half the range over %d seeds of base model and data order)", #seeds))

if ctx.rank() == 0 then
  print("\n" .. table.concat(lines, "\n"))
  local f = assert(io.open(out .. "/grid.txt", "w"))
  f:write(table.concat(lines, "\n"), "\n")
  f:close()
  f = assert(io.open(out .. "/grid.csv", "w"))
  f:write(table.concat(csv, "\n"), "\n")
  f:close()
  print("wrote " .. out .. "/grid.txt and grid.csv")
end
