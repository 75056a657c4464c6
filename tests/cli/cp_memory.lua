-- Context parallelism against a memory limit (tests/cli/cp_memory.sh): the held-out loss of one
-- 4096-token row, flash attention, on a model whose activations for that row exceed the
-- --backend-memory-limit of one rank but fit at cp 2.
local g = ctx.parallel()
local data = ctx.data.synthetic{ length = 20000, period = 97, vocab_size = 256, seed = 4 }
local m = ctx.model{ vocab_size = 256, d_model = 64, n_layer = 2, n_head = 4,
                     context_length = 4096, pe = "rope", seed = 2, attention = "flash" }
local loss = ctx.evaluate{ model = m, data = data, batch_size = 1, seq_len = 4096, batches = 1 }
if ctx.rank() == 0 then
  print(string.format("cp %d loss %.9g", g.cp, loss))
end
