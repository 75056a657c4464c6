-- Under mpirun: every rank holds bit-identical parameters after training (the gradient
-- all-reduce keeps them in step), and the logged losses agree.
local data = ctx.data.synthetic{ length = 3000, period = 20, vocab_size = 48, seed = 5 }
local m = ctx.model{ vocab_size = 48, d_model = 32, n_layer = 2, n_head = 4, context_length = 32, pe = "rope" }
local r = ctx.train{ model = m, data = data, steps = 5, batch_size = 2, optimizer = { lr = 3e-3 }, log_every = 0 }
assert(ctx.world_size() == 2, "run me with mpirun -np 2")
print(string.format("rank %d fingerprint %s loss %.17g", ctx.rank(), m:fingerprint(), r.final_loss))
