-- A ctx.train that fails inside a step (a position beyond the learned table, found during the
-- forward pass) can be caught, and the next ctx.train on the same model runs normally.
local m = ctx.model{ vocab_size = 48, d_model = 32, n_layer = 1, n_head = 4, context_length = 16,
                     pe = "learned", device = "cpu" }
local long = ctx.data.synthetic{ length = 3000, period = 20, vocab_size = 48, seed = 5 }
local ok, err = pcall(ctx.train, { model = m, data = long, steps = 1, batch_size = 1,
                                   seq_len = 32, log_every = 0 })
assert(not ok and tostring(err):find("learned position table"), tostring(err))
local short = ctx.data.synthetic{ length = 3000, period = 20, vocab_size = 48, seed = 5 }
local r = ctx.train{ model = m, data = short, steps = 2, batch_size = 1, log_every = 0 }
assert(r.final_loss > 0)
print("train after failure ok")
