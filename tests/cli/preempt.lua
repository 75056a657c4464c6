-- Preemption and auto-resume (tests/cli/preempt.sh): a training call that a stop signal ends
-- saves its checkpoint_dir and exits 75; the same command run again continues it (resume =
-- "auto") to the same final state as an uninterrupted run.
local out = assert(arg[1], "usage: preempt.lua OUT_DIR")
local data = ctx.data.synthetic{ length = 20000, period = 37, vocab_size = 64, seed = 9 }
local m = ctx.model{ vocab_size = 64, d_model = 64, n_layer = 2, n_head = 4, context_length = 64,
                     pe = "rope", seed = 4 }
ctx.train{ model = m, data = data, steps = 400, batch_size = 4, log_every = 100, out_dir = out,
           checkpoint_dir = out .. "/ckpt", resume = "auto",
           optimizer = { lr = 3e-3, warmup_steps = 20, total_steps = 400 } }
print(string.format("rank %d fingerprint %s", ctx.rank(), m:fingerprint()))
