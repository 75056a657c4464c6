-- The segmented-sequences experiment (METHODS.md 2.2, 3.2-3.3) as a function of a corpus, shared
-- by chunk_025.lua (generated corpus) and real_corpus_chunk_025.lua (real documents): base models
-- trained at Lt (or reused), OOTB evaluation at Lt, 2Lt, 4Lt, chunk-0.25 training to Le = 4 Lt at
-- compute parity (rows of Lt tokens, Le/Lt epochs over the Le windows; `max_steps` caps it), the
-- same evaluation after, and the tables.
--
-- Evaluation (eval/perplexity on held-out documents): mean per-window perplexity at Lt, 2Lt,
-- 4Lt, and at 2Lt and 4Lt the windowed control (the same model with attention limited to its
-- last Lt tokens): a model that uses context beyond Lt beats its own windowed control. With
-- opts.recall (the generated corpus), also teacher-forced recall accuracy by distance: the
-- recalled values of the corpus can only be predicted by copying them from an earlier mention,
-- so accuracy at distances beyond Lt is retrieval beyond Lt, and the windowed control shows what
-- guessing alone gives there.
--
-- OOTB follows the paper: RoPE is evaluated as it is; learned positions are linearly
-- interpolated to each evaluation length (METHODS.md 1.1), so at Lt the base model is untouched.
--
-- opts.continued_control adds the row "continued-Lt": the base model trained for the same steps
-- on plain Lt windows (positions 0 .. Lt-1) and evaluated like OOTB, which separates what the
-- extension does from what more training does when the base models are not converged.
--
-- opts.models: which of C.models to run (default { "learned", "rope" }, the paper's two).
local LABEL = { learned = "APE", rope = "RoPE", llama = "Llama" }

return function(C, corpus, out, opts)
  opts = opts or {}
  local pes = opts.models or { "learned", "rope" }
  local PE_LABEL = setmetatable({}, { __index = function(_, k) return LABEL[k] or k end })
  -- res[method][pe] = { ppl = {[m] = x}, win = {[m] = x}, rec = {[m] = {[bin] = record}} }
  local res = {}

  local function slot(method, pe)
    res[method] = res[method] or {}
    res[method][pe] = res[method][pe] or { ppl = {}, win = {}, rec = {} }
    return res[method][pe]
  end

  -- One eval call at `multiples` of Lt, with the windowed control (at Lt it is the model itself).
  local function evaluate(model, method, pe, multiples)
    local task = ctx.eval("perplexity", { multiples = multiples, max_windows = C.eval_windows,
                                          batch_size = 4, windowed = true,
                                          recall = opts.recall or false })
    local s = slot(method, pe)
    for _, r in ipairs(ctx.run_eval{ eval = task, model = model, data = corpus.val, out_dir = out,
                                      tokenizer = corpus.tokenizer, tags = { method = method, pe = pe } }) do
      if r.task == "perplexity" then
        s.ppl[r.multiple] = r.mean_ppl
        s.win[r.multiple] = r.windowed_mean_ppl
      elseif r.task == "perplexity_recall" then
        s.rec[r.multiple] = s.rec[r.multiple] or {}
        s.rec[r.multiple][r.distance_from // C.Lt] = r
      end
    end
  end

  local function evaluate_all(model, method, pe) evaluate(model, method, pe, { 1, 2, 4 }) end

  -- Evaluates a model trained at Lt the OOTB way: APE interpolated to each length, RoPE as is.
  local function evaluate_at_lt_model(dir, method, pe)
    if pe == "learned" then
      evaluate(ctx.load(ctx.latest_checkpoint(dir)), method, pe, { 1 })
      for _, m in ipairs{ 2, 4 } do
        local copy = ctx.load(ctx.latest_checkpoint(dir))
        copy:extend(m * C.Lt)
        evaluate(copy, method, pe, { m })
      end
    else
      evaluate_all(ctx.load(ctx.latest_checkpoint(dir)), method, pe)
    end
  end
  local methods = { "OOTB", "chunk-0.25" }
  if opts.continued_control then methods = { "OOTB", "continued-Lt", "chunk-0.25" } end
  local optimizer = { lr = 1e-3, warmup_steps = 20, min_lr = 1e-4, weight_decay = 0.1 }
  for k, v in pairs(C.extend_optimizer or {}) do optimizer[k] = v end

  for _, pe in ipairs(pes) do
    local model = C.base_model(pe, corpus)
    evaluate_at_lt_model(C.base_dir(pe), "OOTB", pe)
    if pe == "learned" then model:extend(C.Le) end  -- the table now covers chunk rows' positions

    local rows = ctx.data.rows{ docs = corpus.train, window = C.Le, row_len = C.Lt,
                                sampler = ctx.sampler("chunk", { alpha = 0.25, boundary = "concat" }),
                                batch_size = C.batch_size, seed = 21 }
    local parity = (C.Le // C.Lt) * rows:num_windows() // (C.batch_size * ctx.parallel().dp)
    local steps = math.max(1, math.min(parity, opts.max_steps or parity))
    if opts.continued_control then
      local ctl = ctx.load(ctx.latest_checkpoint(C.base_dir(pe)))
      local plain = ctx.data.rows{ docs = corpus.train, window = C.Lt, batch_size = C.batch_size, seed = 23 }
      ctx.log(string.format("%s: continued-Lt control, %d steps on plain Lt windows", pe, steps))
      ctx.train{ model = ctl, data = plain, steps = steps, log_every = 100, out_dir = out,
                 optimizer = optimizer }
      ctx.save_checkpoint(out .. "/" .. pe .. "_continued", { model = ctl, data = plain,
                                                              metadata = { method = "continued-Lt" } })
      evaluate_at_lt_model(out .. "/" .. pe .. "_continued", "continued-Lt", pe)
    end
    ctx.log(string.format("%s: chunk-0.25 training for %d steps (%d windows of %d tokens; %d steps "
                          .. "would be compute parity)", pe, steps, rows:num_windows(), C.Le, parity))
    ctx.train{ model = model, data = rows, steps = steps, log_every = 100, out_dir = out,
               optimizer = optimizer }
    ctx.save_checkpoint(out .. "/" .. pe, { model = model, data = rows, metadata = { method = "chunk-0.25" } })
    evaluate_all(model, "chunk-0.25", pe)
  end

  -- a number, or "-" for missing and NaN (records carry NaN as the string "nan")
  local function num(v, fmt) return type(v) == "number" and v == v and string.format(fmt, v) or "-" end
  local lines, csv = {}, { "method,pe,multiple,mean_ppl,windowed_mean_ppl" }
  local function header(h)
    lines[#lines + 1] = h
    lines[#lines + 1] = string.rep("-", #h)
  end

  -- Perplexity, shaped like the paper's Table 3 plus the windowed control.
  header(string.format("%-12s %-5s| %9s %9s %9s | %9s %9s", "method", "PE", "Lt", "2Lt", "4Lt",
                       "win 2Lt", "win 4Lt"))
  for _, method in ipairs(methods) do
    for _, pe in ipairs(pes) do
      local s = res[method][pe]
      lines[#lines + 1] = string.format("%-12s %-5s| %9s %9s %9s | %9s %9s", method, PE_LABEL[pe],
        num(s.ppl[1], "%9.3f"), num(s.ppl[2], "%9.3f"), num(s.ppl[4], "%9.3f"),
        num(s.win[2], "%9.3f"), num(s.win[4], "%9.3f"))
      for _, m in ipairs{ 1, 2, 4 } do
        csv[#csv + 1] = string.format("%s,%s,%d,%.6f,%s", method, pe, m, s.ppl[m],
                                      s.win[m] and string.format("%.6f", s.win[m]) or "")
      end
    end
  end

  -- Recall accuracy by distance (bins of Lt): at Lt, the base skill; at 4Lt, every distance up
  -- to 4Lt, next to the windowed control.
  local rcsv = { "method,pe,multiple,distance_from,distance_to,recalls,accuracy,windowed_accuracy" }
  local summary = {}
  if opts.recall then
    lines[#lines + 1] = ""
    header(string.format("%-12s %-5s| %8s | %8s %8s %8s | %8s %8s", "method", "PE", "Lt:<Lt",
                         "4Lt:<Lt", "[Lt,2Lt)", "[2Lt,4Lt)", "win:[1,2)", "win:[2,4)"))
    local counts = ""
    for _, method in ipairs(methods) do
      for _, pe in ipairs(pes) do
        local s = res[method][pe]
        local r1, r4 = s.rec[1] or {}, s.rec[4] or {}
        local function real(v) return type(v) == "number" and v == v and v or nil end
        local function acc(r) return r and real(r.accuracy) end
        local function wacc(r) return r and real(r.windowed_accuracy) end
        lines[#lines + 1] = string.format("%-12s %-5s| %8s | %8s %8s %8s | %8s %8s", method,
          PE_LABEL[pe], num(acc(r1[0]), "%8.3f"), num(acc(r4[0]), "%8.3f"), num(acc(r4[1]), "%8.3f"),
          num(acc(r4[2]), "%8.3f"), num(wacc(r4[1]), "%8.3f"), num(wacc(r4[2]), "%8.3f"))
        if counts == "" and r1[0] and r4[0] then
          counts = string.format("recalls scored: %d at Lt; %d, %d, %d at 4Lt", r1[0].recalls,
                                 r4[0].recalls, r4[1] and r4[1].recalls or 0, r4[2] and r4[2].recalls or 0)
        end
        for _, m in ipairs{ 1, 2, 4 } do
          for _, r in pairs(s.rec[m] or {}) do
            rcsv[#rcsv + 1] = string.format("%s,%s,%d,%d,%d,%d,%s,%s", method, pe, m, r.distance_from,
              r.distance_to, r.recalls, num(r.accuracy, "%.6f"), r.windowed_accuracy and
              num(r.windowed_accuracy, "%.6f") or "")
          end
        end
        summary[method .. "/" .. pe] = { base = acc((res.OOTB[pe].rec[1] or {})[0]) or nil,
                                         far = acc(r4[2]), win_far = wacc(r4[2]),
                                         ppl4 = s.ppl[4], win4 = s.win[4] }
      end
    end
    lines[#lines + 1] = counts
  end

  if ctx.rank() == 0 then
    print(string.format("\n%s (Lt = %d, Le = %d):\n%s", opts.title or "Held-out documents, mean "
                        .. "per-window perplexity; win = windowed control (attention to the last Lt "
                        .. "tokens); recall accuracy by distance (teacher-forced)", C.Lt, C.Le,
                        table.concat(lines, "\n")))
    if opts.recall then
      -- The claims the experiment is for, checked on the numbers above.
      for _, pe in ipairs(pes) do
        local c, o = summary["chunk-0.25/" .. pe], summary["OOTB/" .. pe]
        if c.base and c.far and c.base > 0 then
          print(string.format("%s: chunk-0.25 recall at [2Lt,4Lt) is %.0f%% of the base's at [0,Lt) "
                              .. "(OOTB %.0f%%); 4Lt perplexity %.3f vs windowed %.3f (%s)",
                              PE_LABEL[pe], 100 * c.far / c.base, 100 * (o.far or 0) / c.base,
                              c.ppl4, c.win4, c.ppl4 < c.win4 and "uses context beyond Lt"
                              or "no gain from context beyond Lt"))
        end
      end
    end
    local function write(name, rows)
      local f = assert(io.open(out .. "/" .. name, "w"))
      f:write(table.concat(rows, "\n"), "\n")
      f:close()
    end
    write("table.csv", csv)
    if opts.recall then write("recall_table.csv", rcsv) end
    print("wrote " .. out .. "/table.csv" .. (opts.recall and ", recall_table.csv" or "")
          .. ", perplexity*.csv, metrics.jsonl and checkpoints")
  end
  return res
end
