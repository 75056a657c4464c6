-- Tensor parallelism end to end (tests/cli/tensor_parallel.sh runs it on several grids).
-- arg: OUT_DIR BATCH [MODE]; MODE "train" (default): 4 steps, printing each step's loss, the
-- held-out loss and the fingerprint of the whole state, then ctx.save and ctx.save_hf;
-- "resume": ctx.load of OUT_DIR/tp.h5 (written on another grid) and 2 more steps;
-- "hf": ctx.load_hf of OUT_DIR/hf and the held-out loss.
local out, B, mode = arg[1], tonumber(arg[2]), arg[3] or "train"
local g = ctx.parallel()
local function say(fmt, ...) if ctx.rank() == 0 then print(string.format(fmt, ...)) end end
say("grid world %d dp %d cp %d tp %d sequence_parallel %s", g.world, g.dp, g.cp, g.tp,
    tostring(g.sequence_parallel))
local function data(seed)
  return ctx.data.synthetic{ length = 4000, period = 23, vocab_size = 49, seed = seed }
end
local held_out = data(9)
local function eval(m) return ctx.evaluate{ model = m, data = held_out, batch_size = 4, batches = 2 } end

if mode == "train" then
  -- vocabulary 49: tp 2 splits it 25 + 24; BLOOM's ALiBi slopes are split with the heads
  local m = ctx.model{ style = "bloom", vocab_size = 49, d_model = 32, n_layer = 2, n_head = 4,
                       context_length = 32, seed = 3, pe = ctx.pe("alibi") }
  local d = data(5)
  local r = ctx.train{ model = m, data = d, steps = 4, batch_size = B, log_every = 0,
                       optimizer = { lr = 3e-3, warmup_steps = 1, total_steps = 8 } }
  for i, l in ipairs(r.losses) do say("step %d loss %.9g", i, l) end
  say("eval %.9g", eval(m))
  ctx.save(out .. "/tp.h5", { model = m, data = d })
  ctx.save_hf(m, out .. "/hf")
  say("fingerprint %s", m:fingerprint())
elseif mode == "resume" or mode == "straight" then
  -- "straight": the same 4 + 2 steps without the checkpoint in between (same-grid resume must
  -- match it bit for bit)
  local d = data(5)
  local m
  if mode == "resume" then
    m = ctx.load(out .. "/tp.h5", { data = d })
    say("resumed fingerprint %s", m:fingerprint())
  else
    m = ctx.model{ style = "bloom", vocab_size = 49, d_model = 32, n_layer = 2, n_head = 4,
                   context_length = 32, seed = 3, pe = ctx.pe("alibi") }
    ctx.train{ model = m, data = d, steps = 4, batch_size = B, log_every = 0,
               optimizer = { lr = 3e-3, warmup_steps = 1, total_steps = 8 } }
  end
  local r = ctx.train{ model = m, data = d, steps = 2, batch_size = B, log_every = 0 }
  for i, l in ipairs(r.losses) do say("resume step %d loss %.9g", i, l) end
  say("continued fingerprint %s", m:fingerprint())
elseif mode == "rows" or mode == "rows_resume" then
  -- A row stream counts global rows (its cursor does not depend on the rank), so a checkpoint
  -- resumes on any number of data-parallel ranks: B rows per rank of dp ranks, same dp x B.
  -- MODE "rows": 3 steps, ctx.save; "rows_resume": ctx.load, 2 more steps with ZeRO-1 when
  -- arg[4] is "zero" (its shards: the dp ranks; the gradient reduce-scattered).
  local corpus = ctx.data.corpus{ dir = out .. "/corpus", docs = 24, min_len = 600,
                                  max_len = 1200, seed = 2 }
  local rows = ctx.data.rows{ docs = corpus.train, window = 64, row_len = 32, batch_size = B,
                              seed = 3, sampler = ctx.sampler("chunk", { alpha = 0.5 }) }
  local zero = arg[4] == "zero" and 1 or 0
  local opt = { lr = 3e-3, warmup_steps = 1, total_steps = 8, grad_clip = 0.5 }
  if mode == "rows" then
    -- vocabulary 259 (bytes): tp 2 splits it 130 + 129
    local m = ctx.model{ style = "bloom", vocab_size = 259, d_model = 32, n_layer = 2,
                         n_head = 4, context_length = 32, seed = 4, pe = ctx.pe("alibi") }
    local r = ctx.train{ model = m, data = rows, steps = 3, log_every = 0, optimizer = opt }
    for i, l in ipairs(r.losses) do say("rows step %d loss %.9g", i, l) end
    ctx.save(out .. "/rows.h5", { model = m, data = rows })
    say("rows fingerprint %s", m:fingerprint())
  else
    local m = ctx.load(out .. "/rows.h5", { data = rows })
    say("resumed rows fingerprint %s", m:fingerprint())
    local r = ctx.train{ model = m, data = rows, steps = 2, log_every = 0, zero = zero }
    for i, l in ipairs(r.losses) do say("rows resume step %d loss %.9g", i, l) end
    say("rows resumed fingerprint after %s", m:fingerprint())
  end
else
  local m = ctx.load_hf(out .. "/hf")
  say("hf eval %.9g", eval(m))
end
