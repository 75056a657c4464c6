-- Retrieval probes on one checkpoint (docs/EVAL.md, "Retrieval probes"): landmark attention's
-- passkey and RULER's needle tasks (single, multikey, multivalue, multiquery, variable tracking)
-- over prompt lengths x needle depths, scored generated and teacher-forced, each with its
-- windowed control (attention limited to the last Lt tokens); one table per task and length,
-- and RULER's effective lengths.
--
--   ctxengine recipes/probes.lua [CHECKPOINT (file or run dir; runs/chunk_025/rope)]
--                                [OUT (runs/probes)] [quick] [tokenizer=SPEC] [docs=SHARD]
-- tokenizer= and docs= probe a checkpoint of another vocabulary (a BPE tokenizer.json and a
-- shard of held-out documents in its tokens); by default the recipes' generated corpus is used.
-- then: python3 scripts/plot.py OUT   (passkey_heatmap.png, ruler_niah_heatmap.png)
local C = require("common")
local ckpt = arg[1] or "runs/chunk_025/rope"
local out = arg[2] or "runs/probes"
local quick, tokenizer_spec, docs_path = false, nil, nil
for i = 3, #arg do
  if arg[i] == "quick" then quick = true
  elseif arg[i]:match("^tokenizer=") then tokenizer_spec = arg[i]:sub(11)
  elseif arg[i]:match("^docs=") then docs_path = arg[i]:sub(6)
  else error("unknown argument '" .. arg[i] .. "' (expected quick, tokenizer=SPEC or docs=SHARD)", 0) end
end
if quick then C.quick(out .. "/quick") end
local path = ckpt:match("%.h5$") and ckpt or ctx.latest_checkpoint(ckpt)
if not path then error("no checkpoint in " .. ckpt .. " (run recipes/chunk_025.lua first)", 0) end
local model = ctx.load(path)
local Lt = model:config().trained_length
-- held-out documents (the essay haystack) and the tokenizer of the text tasks
local docs, tokenizer
if docs_path then docs = ctx.data.shard(docs_path) else
  local corpus = ctx.data.corpus(C.corpus)
  docs, tokenizer = corpus.val, corpus.tokenizer
end
if tokenizer_spec then tokenizer = ctx.tokenizer(tokenizer_spec) end
local tags = { checkpoint = path }

-- Lengths in multiples of Lt, but never shorter than the prompts' fixed text: the passkey's
-- task line, key sentence and question are about 250 bytes, RULER's multiquery question alone
-- about 650 (byte tokens).
local function lengths(multiples, floor)
  local t = {}
  for i, m in ipairs(multiples) do t[i] = math.max(m * Lt, floor[i]) end
  return t
end
local passkey_lengths = quick and { 256, 320 } or lengths({ 2, 4, 8 }, { 256, 512, 1024 })
local ruler_lengths = quick and { 512, 640 } or lengths({ 6, 12 }, { 768, 1536 })
local ruler_tasks = quick and { { variant = "single" }, { variant = "vt" } } or {
  { variant = "single" },                             -- RULER niah_single_1
  { variant = "single", haystack = "essay" },         -- niah_single_2
  { variant = "single", haystack = "essay", value_type = "uuids" },  -- niah_single_3
  { variant = "multikey", haystack = "essay" },       -- niah_multikey_1
  { variant = "multikey", haystack = "needle" },      -- niah_multikey_2
  { variant = "multivalue", haystack = "essay" },     -- niah_multivalue
  { variant = "multiquery", haystack = "essay" },     -- niah_multiquery
  { variant = "vt" },                                 -- vt
}
ctx.log(string.format("probes: %s (Lt = %d, context %d)", path, Lt, model:config().context_length))

local rows, effective = {}, {}  -- rows[i] = { name, length, record }; effective[name][metric]
local function run(name, task, options)
  local recs = ctx.run_eval{ eval = ctx.eval(task, options), model = model, data = docs,
                             tokenizer = tokenizer, out_dir = out, tags = tags }
  for _, r in ipairs(recs) do
    if r.task == task .. "_by_length" then
      rows[#rows + 1] = { name = name, length = r.length, r = r }
    elseif r.task == task .. "_effective_length" then
      effective[name] = effective[name] or { order = #rows }
      effective[name][r.metric] = r
    end
  end
end

run("passkey", "passkey", { token_lengths = passkey_lengths, num_depths = quick and 2 or 5,
                            per_setting = quick and 1 or 10 })
for _, t in ipairs(ruler_tasks) do
  local name = t.variant .. "/" .. (t.haystack or "noise") .. (t.value_type and ("/" .. t.value_type) or "")
  local o = { token_lengths = ruler_lengths, num_depths = quick and 2 or 5,
              per_setting = quick and 1 or 2, max_new_tokens = t.variant == "vt" and 30 or 48 }
  for k, v in pairs(t) do o[k] = v end
  run(name, "ruler_niah", o)
end

-- "-": not measured (no teacher-forced score for multivalue, multiquery and vt). A score that
-- was not measured is NaN, which reaches Lua as the string "nan".
local function num(v) return type(v) == "number" and v == v and v or nil end
local function cell(v) return num(v) and string.format("%6.3f", v) or "     -" end
local lines = { string.format("%-28s %6s | %6s %6s | %6s %6s", "task", "length", "gen", "tf",
                              "gen(W)", "tf(W)") }
lines[#lines + 1] = string.rep("-", #lines[1])
for _, x in ipairs(rows) do
  local r = x.r
  lines[#lines + 1] = string.format("%-28s %6d | %s %s | %s %s", x.name, x.length, cell(r.accuracy),
                                    cell(r.tf_accuracy), cell(r.windowed_accuracy),
                                    cell(r.windowed_tf_accuracy))
end
local eff = { "", string.format("effective length (the longest length whose score stays >= %.1f%%; "
                                .. "in brackets: >= 80%% of the shortest length's score):", 85.6),
              string.format("%-28s | %13s %13s %13s %13s", "task", "gen", "tf", "gen(W)", "tf(W)") }
local function ecell(r)
  if not r then return string.format("%13s", "-") end
  local rel = num(r.relative_effective_length)
  return string.format("%13s", string.format("%d (%s)", r.effective_length,
                                              rel and string.format("%d", rel) or "-"))
end
local names = {}
for name, e in pairs(effective) do names[#names + 1] = { name = name, order = e.order } end
table.sort(names, function(a, b) return a.order < b.order end)
for _, n in ipairs(names) do
  local e = effective[n.name]
  eff[#eff + 1] = string.format("%-28s | %s %s %s %s", n.name, ecell(e.accuracy), ecell(e.tf_accuracy),
                                ecell(e.windowed_accuracy), ecell(e.windowed_tf_accuracy))
end
if ctx.rank() == 0 then
  print(string.format("\nRetrieval probes of %s (Lt = %d; gen: generated, tf: teacher-forced; "
                      .. "(W): attention limited to the last %d tokens):\n%s\n%s", path, Lt, Lt,
                      table.concat(lines, "\n"), table.concat(eff, "\n")))
  print("records in " .. out .. " (passkey*.csv, ruler_niah*.csv); heat maps: python3 scripts/plot.py " .. out)
end
