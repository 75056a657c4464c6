-- Every evaluation task on one checkpoint at Lt, 2Lt and 4Lt (docs/EVAL.md), each with its
-- windowed control (attention limited to the last Lt tokens), and one table ("-": not measured
-- at that length):
--   perplexity        mean per-window perplexity, position-wise curve, extrapolation criterion
--   recall QA         retrieval on generated documents (ctx.data.recall_qa, scored by eval/altqa
--                     in freeformqa mode): the answer lies in the first half of the context, so
--                     beyond Lt at 2Lt and 4Lt (prompts of about L tokens: the generator counts
--                     bytes, converted with the corpus tokenizer's measured bytes per token)
--   LongChat-Lines    generated prompts of 4Lt and 8Lt tokens (eval/longchat_lines)
--
--   ctxengine recipes/eval_suite.lua [CHECKPOINT (file or run dir; runs/chunk_025/rope)]
--                                    [OUT (runs/eval_suite)] [quick]
-- then: python3 scripts/plot.py OUT
local C = require("common")
local ckpt = arg[1] or "runs/chunk_025/rope"
local out = arg[2] or "runs/eval_suite"
local quick = arg[3] == "quick"
if quick then C.quick(out .. "/quick") end
local path = ckpt:match("%.h5$") and ckpt or ctx.latest_checkpoint(ckpt)
if not path then error("no checkpoint in " .. ckpt .. " (run recipes/chunk_025.lua first)", 0) end
local model = ctx.load(path)
local Lt = model:config().trained_length
local lengths = { Lt, 2 * Lt, 4 * Lt }
local corpus = ctx.data.corpus(C.corpus)
local n_items = quick and 6 or 40
local tags = { checkpoint = path }
ctx.log(string.format("eval suite: %s (Lt = %d, context %d) at %d, %d, %d tokens", path, Lt,
                      model:config().context_length, table.unpack(lengths)))

local function run(task, options, extra_tags)
  local t = {}
  for k, v in pairs(tags) do t[k] = v end
  for k, v in pairs(extra_tags or {}) do t[k] = v end
  return ctx.run_eval{ eval = ctx.eval(task, options), model = model, data = corpus.val,
                       tokenizer = corpus.tokenizer, out_dir = out, tags = t }
end

local row = {}  -- row[L] = { ppl, ppl_w, qa, qa_w, lines, lines_w }
for _, L in ipairs(lengths) do row[L] = {} end

-- Perplexity: curve (16 bins), windowed control, extrapolation criterion.
for _, r in ipairs(run("perplexity", { lengths = lengths, max_windows = C.eval_windows,
                                       curve_bins = 16, windowed = true, extrapolation = true })) do
  if r.task == "perplexity" then
    row[r.length].ppl, row[r.length].ppl_w = r.mean_ppl, r.windowed_mean_ppl
  elseif r.task == "perplexity_extrapolation" then
    ctx.log(string.format("extrapolation to context %d: log-lik %.1f vs %.1f at Lt -> %s", r.context,
                          r.loglik_context, r.loglik_trained, r.extrapolates == 1 and "yes" or "no"))
  end
end

-- Recall QA at each length, answers in the first half of the context. The generator measures
-- its prompts in bytes and the model reads the corpus's tokens (a BPE by default): a prompt of
-- L tokens is L * (bytes per token) bytes, the ratio measured on one generated prompt, less 10%
-- so that no prompt outgrows the model's context.
local qa_corpus = {}
for k, v in pairs(C.corpus) do if k ~= "bpe" then qa_corpus[k] = v end end
local bytes_per_token = 1
if C.corpus.bpe and C.corpus.bpe > 0 then
  local probe = out .. "/recall_qa_ratio.jsonl"
  ctx.data.recall_qa{ out = probe, corpus = qa_corpus, context = 512, max_items = 1 }
  local f = assert(io.open(probe, "r"))
  local prompt = (f:read("l") or ""):match('"value":%s*"(.-)"')
  f:close()
  if not prompt then error("recall QA: no question fits 512 bytes of the corpus's documents", 0) end
  bytes_per_token = #prompt / math.max(1, #corpus.tokenizer:encode(prompt))
end
ctx.log(string.format("recall QA: %.2f bytes per token", bytes_per_token))
for _, L in ipairs(lengths) do
  local file = string.format("%s/recall_qa_%d.jsonl", out, L)
  local bytes = bytes_per_token > 1 and math.floor(0.9 * L * bytes_per_token) or L
  local n = ctx.data.recall_qa{ out = file, corpus = qa_corpus, context = bytes,
                                min_distance = bytes // 2, max_items = n_items }
  -- (no items where no recall fits the length: then the QA cells read "-")
  for _, window in ipairs(n > 0 and { 0, Lt } or {}) do
    for _, r in ipairs(run("altqa", { file = file, mode = "freeformqa", max_new_tokens = 10,
                                      window = window }, { context = L })) do
      if r.task == "altqa" and r.group == "all" then
        row[L][window == 0 and "qa" or "qa_w"] = r.accuracy
      end
    end
  end
  ctx.log(string.format("recall QA at %d: %d items", L, n))
end

-- LongChat-Lines sized to 4Lt and 8Lt tokens, at least 640 and 1280: its header alone is
-- about 490 bytes, more than a small Lt.
local lines_lengths = { math.max(4 * Lt, 640), math.max(8 * Lt, 1280) }
for _, L in ipairs(lines_lengths) do row[L] = row[L] or {} end
for _, window in ipairs{ 0, Lt } do
  for _, r in ipairs(run("longchat_lines", { token_lengths = lines_lengths,
                                             per_setting = quick and 3 or 10, max_new_tokens = 12,
                                             window = window })) do
    if r.task == "longchat_lines" then
      row[r.target_tokens][window == 0 and "lines" or "lines_w"] = r.accuracy
    end
  end
end

local function cell(v, fmt) return v and v == v and string.format(fmt, v) or "-" end
local lines = { string.format("%-8s | %9s %9s | %8s %8s | %8s %8s", "length", "ppl", "ppl(W)",
                              "QA acc", "QA(W)", "lines", "lines(W)") }
lines[#lines + 1] = string.rep("-", #lines[1])
local all = {}
for L in pairs(row) do all[#all + 1] = L end
table.sort(all)
for _, L in ipairs(all) do
  local x = row[L]
  lines[#lines + 1] = string.format("%-8d | %9s %9s | %8s %8s | %8s %8s", L, cell(x.ppl, "%9.3f"),
                                    cell(x.ppl_w, "%9.3f"), cell(x.qa, "%8.3f"), cell(x.qa_w, "%8.3f"),
                                    cell(x.lines, "%8.3f"), cell(x.lines_w, "%8.3f"))
end
if ctx.rank() == 0 then
  print(string.format("\nEval suite of %s (Lt = %d; (W): attention limited to the last %d tokens):\n%s",
                      path, Lt, Lt, table.concat(lines, "\n")))
  print("records in " .. out .. " (metrics.jsonl, *.csv); plots: python3 scripts/plot.py " .. out)
end
