-- Periodic checkpoints (tests/cli/checkpoint_every.sh): checkpoint_every = 2 saves step-N.h5
-- every 2 optimizer steps, keep_last = 2 keeps the newest two, and a rerun with resume = "auto"
-- continues from `latest` to the same state as the uninterrupted run.
local out = assert(arg[1], "usage: checkpoint_every.lua OUT_DIR")
local data = ctx.data.synthetic{ length = 6000, period = 29, vocab_size = 40, seed = 3 }
local m = ctx.model{ vocab_size = 40, d_model = 32, n_layer = 2, n_head = 4, context_length = 32,
                     pe = "rope", seed = 5 }
ctx.train{ model = m, data = data, steps = 7, batch_size = 4, log_every = 0,
           checkpoint_dir = out .. "/ckpt", resume = "auto", checkpoint_every = 2, keep_last = 2,
           optimizer = { lr = 3e-3, warmup_steps = 2, total_steps = 7 } }
print(string.format("fingerprint %s", m:fingerprint()))
