-- Contextual sparsity (Deja Vu; docs/SPARSITY.md) on a trained model: predictors trained on its
-- own activations, then decoding dense and at several sparsity levels, each with its decode
-- speed, its teacher-forced decode perplexity at 4 Lt and the passkey probe it generates at 2 Lt.
-- Then the same model fine-tuned into ReLU form (model:set_activation("relu") and more steps on
-- the corpus), where a unit's label is exact (active or not) and decoding may keep just the
-- units its predictor calls active.
--
--   ctxengine recipes/sparsity.lua [CHECKPOINT (file or run dir; runs/chunk_025/rope)]
--                                  [OUT (runs/sparsity)] [quick | python-docs] [RELU_STEPS (600)]
-- python-docs: the model was trained on that corpus (recipes/paper_grid.lua python-docs).
local C = require("common")
local ckpt = arg[1] or "runs/chunk_025/rope"
local out = arg[2] or "runs/sparsity"
local quick = arg[3] == "quick"
if quick then C.quick(out .. "/quick") end
local path = ckpt:match("%.h5$") and ckpt or ctx.latest_checkpoint(ckpt)
if not path then error("no checkpoint in " .. ckpt .. " (run recipes/chunk_025.lua first)", 0) end
local corpus
if arg[3] == "python-docs" then
  local dir = "data/real/python-docs-bpe4096"
  corpus = { train = ctx.data.shard(dir .. "/shards/train.shard"),
             val = ctx.data.shard(dir .. "/shards/val.shard"),
             tokenizer = ctx.tokenizer(dir .. "/tokenizer/tokenizer.json") }
else
  corpus = ctx.data.corpus(C.corpus)
end
local Lt = ctx.load(path):config().trained_length
local L = quick and 2 * Lt or 4 * Lt
-- 2 Lt (quick: 8 Lt, the probe's fixed text is longer than 4 x its Lt of 32)
local passkey = ctx.eval("passkey", { token_lengths = { (quick and 8 or 2) * Lt }, num_depths = quick and 2 or 5,
                                      per_setting = quick and 1 or 4 })
-- LongChat-Lines generated at 4 Lt tokens (at least 640: its header alone is about 490 bytes)
local lines = ctx.eval("longchat_lines", { token_lengths = { math.max(4 * Lt, 640) },
                                           per_setting = quick and 2 or 10, max_new_tokens = 12 })

local function predictors(model, name)
  local s = model:train_predictors{ data = corpus.train, tokens = quick and 1024 or 16384,
                                    held_out = quick and 512 or 4096, epochs = quick and 3 or 20 }
  ctx.log(string.format("%s predictors: unit recall %.3f (keep 0.25), head recall %.3f (keep 0.5)%s",
                        name, s.recall_mlp, s.recall_heads,
                        s.recall_active and string.format(", active units found %.3f selecting %.3f",
                                                          s.recall_active, s.selected_active) or ""))
  model:save_predictors(out .. "/" .. name .. "/sparsity_predictors.safetensors")
end

-- The generated corpus's recalls: teacher-forced recall accuracy by distance at L (eval/
-- perplexity scores its rows by decoding when sparsity is set), [0, Lt) and [L/2, L).
local recall = arg[3] ~= "python-docs"
local recall_task = ctx.eval("perplexity", { multiples = { L // Lt }, max_windows = quick and 4 or 32,
                                             batch_size = 4, recall = true })

-- one row per level: decode tokens/s, perplexity at L by teacher-forced decoding, recall
-- accuracy near and far, passkey accuracy (generated) and the key's teacher-forced
-- log-probability (a retrieval score that moves before the accuracy does), LongChat-Lines accuracy
local function measure(model, name, levels)
  local rows = {}
  for _, lv in ipairs(levels) do
    local s = model:decode_score{ data = corpus.val, rows = 4, row_len = L, prefix = Lt,
                                  sparsity = lv.sparsity }
    -- decode speed of one row at a time (the paper's setting; 4 rows decoded together each read
    -- their own selection)
    local s1 = model:decode_score{ data = corpus.val, rows = 1, row_len = L, prefix = Lt,
                                   sparsity = lv.sparsity }
    local function run(task)
      return ctx.run_eval{ eval = task, model = model, data = corpus.val, tokenizer = corpus.tokenizer,
                           out_dir = out .. "/" .. name, sparsity = lv.sparsity, tags = { level = lv.name } }
    end
    local function num(v) return type(v) == "number" and v or 0 / 0 end  -- "nan": none scored
    local acc, keylp, near, far, lacc = 0 / 0, 0 / 0, 0 / 0, 0 / 0, 0 / 0
    for _, r in ipairs(run(passkey)) do
      if r.task == "passkey_by_length" then acc, keylp = num(r.accuracy), num(r.mean_logprob) end
    end
    for _, r in ipairs(run(lines)) do
      if r.task == "longchat_lines" then lacc = num(r.accuracy) end
    end
    if recall then
      for _, r in ipairs(run(recall_task)) do
        if r.task == "perplexity_recall" and r.distance_from == 0 then near = num(r.accuracy) end
        if r.task == "perplexity_recall" and r.distance_from == L // 2 then far = num(r.accuracy) end
      end
    end
    rows[#rows + 1] = { lv.name, s1.decode_tokens_per_s, s.decode_tokens_per_s, s.perplexity, near, far,
                        acc, keylp, lacc }
  end
  ctx.log(string.format("%s: %-22s %9s %8s %9s %8s %10s %8s %9s %9s %8s %9s %8s", name, "level", "tok/s b1",
                        "speedup", "tok/s b4", "speedup", "ppl@" .. L, "change", "rec<Lt", "rec>=" .. L // 2,
                        "passkey", "key logp", "lines"))
  for _, r in ipairs(rows) do
    ctx.log(string.format("%s: %-22s %9.0f %7.2fx %9.0f %7.2fx %10.3f %7.2f%% %9.3f %9.3f %8.2f %9.2f %8.2f",
                          name, r[1], r[2], r[2] / rows[1][2], r[3], r[3] / rows[1][3], r[4],
                          100 * (r[4] / rows[1][4] - 1), r[5], r[6], r[7], r[8], r[9]))
  end
end

local model = ctx.load(path)
predictors(model, "gelu")
measure(model, "gelu", {
  { name = "dense" },
  { name = "mlp 0.5", sparsity = { mlp = 0.5 } },
  { name = "mlp 0.75", sparsity = { mlp = 0.75 } },
  { name = "mlp 0.9", sparsity = { mlp = 0.9 } },
  { name = "heads 0.5", sparsity = { heads = 0.5 } },
  { name = "mlp 0.75 + heads 0.5", sparsity = { mlp = 0.75, heads = 0.5 } },
})

local relu = ctx.load(path)
relu:set_activation("relu")
local steps = quick and 20 or tonumber(arg[4]) or 600
local rows = ctx.data.rows{ docs = corpus.train, window = Lt, batch_size = C.batch_size, seed = 77 }
local t = ctx.train{ model = relu, data = rows, steps = steps, log_every = quick and 0 or 100,
                     optimizer = { lr = 1e-3, warmup_steps = 10, min_lr = 1e-4 } }
ctx.log(string.format("relu: fine-tuned %d steps, loss %.3f -> %.3f", steps, t.first_loss, t.final_loss))
predictors(relu, "relu")
measure(relu, "relu", {
  { name = "dense" },
  { name = "mlp active", sparsity = { mlp_positive = true } },
  { name = "mlp 0.75", sparsity = { mlp = 0.75 } },
  { name = "mlp 0.9", sparsity = { mlp = 0.9 } },
  { name = "mlp active + heads 0.25", sparsity = { mlp_positive = true, heads = 0.25 } },
  { name = "mlp active + heads 0.5", sparsity = { mlp_positive = true, heads = 0.5 } },
})
