-- One step at a time on a row stream: prints each step's global loss and this rank's
-- fingerprint. Run with 1 process and batch 2B, then 2 ranks and batch B: the global batches
-- are the same rows, so the losses must agree and both ranks must hold identical parameters.
local B, dir = tonumber(arg[1]), arg[2]
local corpus = ctx.data.corpus{ dir = dir, docs = 24, min_len = 600, max_len = 1200, seed = 2,
                                min_distance = 40, max_distance = 120 }
local rows = ctx.data.rows{ docs = corpus.train, window = 64, row_len = 32, batch_size = B, seed = 3,
                            sampler = ctx.sampler("chunk", { alpha = 0.25 }) }
local m = ctx.model{ style = "neox", vocab_size = 259, d_model = 32, n_layer = 2, n_head = 4,
                     context_length = 32, pe = ctx.pe("rope", { rotary_pct = 0.5 }) }
for step = 1, 6 do
  local r = ctx.train{ model = m, data = rows, steps = 1, log_every = 0,
                       optimizer = step == 1 and { lr = 3e-3, warmup_steps = 2, total_steps = 6 } or nil }
  print(string.format("step %d rank %d loss %.9g fp %s", step, ctx.rank(), r.final_loss, m:fingerprint()))
end
