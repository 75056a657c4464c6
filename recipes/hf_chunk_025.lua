-- Shared by gpt2_, pythia_, bloom_ and llama_chunk_025.lua (given an HF directory; docs/HF.md):
-- a pretrained HF model (config.json, model.safetensors, tokenizer.json) extended to 4x its
-- context Lt with chunk-0.25 (METHODS.md 2.2), perplexity on held-out documents at Lt, 2Lt and
-- 4Lt before (OOTB) and after, the extended model written back as an HF directory.
--
-- Recipe arguments: HF_DIR SHARDS_DIR [OUT] [quick | MAX_STEPS]
--   SHARDS_DIR holds train.shard and val.shard tokenized with the model's own tokenizer:
--     scripts/prepare_corpus.sh --tokenizer HF_DIR --out data/real/python-docs-<model>
--   MAX_STEPS caps the chunk training (default: compute parity, Le/Lt epochs over the Le
--   windows of the train split); `quick` shrinks everything to seconds (ctest).
return function(family, default_out)
  local hf_dir = arg[1]
  local shards = arg[2]
  if not hf_dir or not shards then
    error(string.format("usage: ctxengine recipes/%s_chunk_025.lua HF_DIR SHARDS_DIR [OUT] "
                        .. "[quick | MAX_STEPS] (docs/HF.md)", family), 0)
  end
  local out = arg[3] or default_out
  local quick = arg[4] == "quick"
  local max_steps = (not quick) and tonumber(arg[4]) or nil

  local function shard(split)
    local path = shards .. "/" .. split .. ".shard"
    local f = io.open(path, "rb")
    if not f then
      error(string.format("no %s: tokenize a corpus with the model's tokenizer first "
                          .. "(bash scripts/prepare_corpus.sh --tokenizer %s --out DIR)", path, hf_dir), 0)
    end
    f:close()
    return ctx.data.shard(path)
  end
  local train, val = shard("train"), shard("val")

  local model, tok = ctx.load_hf(hf_dir)
  local cfg = model:config()
  local Lt = cfg.context_length
  local Le = 4 * Lt
  if train:vocab_size() > cfg.vocab_size then
    error(string.format("%s/train.shard has vocabulary %d but the model %d: tokenize with %s's "
                        .. "tokenizer", shards, train:vocab_size(), cfg.vocab_size, hf_dir), 0)
  end
  ctx.log(string.format("%s: %s, %d layers, d_model %d, Lt = %d -> Le = %d; %d train documents "
                        .. "(%d tokens), %d validation documents", hf_dir, cfg.pe, cfg.n_layer,
                        cfg.d_model, Lt, Le, #train, train:num_tokens(), #val))

  -- Pretrained models want small steps; quick mode trains a tiny random model and may be bold.
  local batch_size = quick and 4 or 8
  local eval_opts = { max_windows = quick and 4 or 64, batch_size = quick and 4 or 1 }
  local optimizer = quick and { lr = 1e-3, warmup_steps = 2, min_lr = 1e-4, weight_decay = 0.0 }
                    or { lr = 3e-5, warmup_steps = 50, min_lr = 3e-6, weight_decay = 0.01 }
  if quick then max_steps = 10 end

  local results = {}
  local function evaluate(m, method, multiples)
    local opts = { multiples = multiples }
    for k, v in pairs(eval_opts) do opts[k] = v end
    local recs = ctx.run_eval{ eval = ctx.eval("perplexity", opts), model = m, data = val,
                               out_dir = out, tags = { method = method, model = family } }
    results[method] = results[method] or {}
    for _, r in ipairs(recs) do results[method][r.multiple] = r.mean_ppl end
  end

  -- OOTB. A learned table stops at Lt: evaluate each length on a fresh copy interpolated to it
  -- (METHODS.md 1.1), so at Lt the pretrained model is untouched. RoPE and ALiBi run as they are.
  if cfg.pe == "pe/learned" then
    for _, mult in ipairs{ 1, 2, 4 } do
      local base = ctx.load_hf(hf_dir)
      if mult > 1 then base:extend(mult * Lt) end
      evaluate(base, "OOTB", { mult })
    end
  else
    evaluate(model, "OOTB", { 1, 2, 4 })
  end

  -- chunk-0.25: rows of Lt tokens from windows of Le, keeping their original positions.
  model:extend(Le)
  local rows = ctx.data.rows{ docs = train, window = Le, row_len = Lt,
                              sampler = ctx.sampler("chunk", { alpha = 0.25, boundary = "concat" }),
                              batch_size = batch_size, seed = 21 }
  local parity = (Le // Lt) * rows:num_windows() // (batch_size * ctx.parallel().dp)
  local steps = math.max(1, math.min(parity, max_steps or parity))
  ctx.log(string.format("chunk-0.25: %d steps (%d windows of %d tokens; %d would be compute parity)",
                        steps, rows:num_windows(), Le, parity))
  optimizer.total_steps = steps
  ctx.train{ model = model, data = rows, steps = steps, log_every = quick and 5 or 50,
             out_dir = out, optimizer = optimizer }
  evaluate(model, "chunk-0.25", { 1, 2, 4 })

  ctx.save_checkpoint(out .. "/checkpoints", { model = model, data = rows,
                                               metadata = { method = "chunk-0.25", hf_source = hf_dir } })
  ctx.save_hf(model, out .. "/hf_extended", { tokenizer = tok })

  if ctx.rank() == 0 then
    local lines = { string.format("%-12s | %10s %10s %10s", "method", "Lt=" .. Lt, "2Lt", "4Lt") }
    lines[#lines + 1] = string.rep("-", #lines[1])
    local csv = { "model,method,multiple,mean_ppl" }
    for _, method in ipairs{ "OOTB", "chunk-0.25" } do
      local cells = {}
      for _, mult in ipairs{ 1, 2, 4 } do
        local v = results[method][mult]
        cells[#cells + 1] = string.format("%10.3f", v)
        csv[#csv + 1] = string.format("%s,%s,%d,%.6f", family, method, mult, v)
      end
      lines[#lines + 1] = string.format("%-12s | %s", method, table.concat(cells, " "))
    end
    print(string.format("\n%s (%s), mean per-window perplexity on held-out documents:\n%s",
                        family, hf_dir, table.concat(lines, "\n")))
    local f = assert(io.open(out .. "/table.csv", "w"))
    f:write(table.concat(csv, "\n"), "\n")
    f:close()
    print("wrote " .. out .. "/table.csv, perplexity.csv, metrics.jsonl, checkpoints/ and "
          .. "hf_extended/ (the extended model as an HF directory, context " .. Le .. ")")
  end
  return results
end
