-- Context parallelism against a memory limit (tests/cli/cp_memory.sh): the held-out loss of one
-- 4096-token row, and the passkey retrieval eval scored teacher-forced at 4000 tokens (prompts
-- whose length does not split into 2 x cp chunks: padded), flash attention, on a model whose
-- activations for such a row exceed the --backend-memory-limit of one rank but fit at cp 2.
local g = ctx.parallel()
local data = ctx.data.synthetic{ length = 20000, period = 97, vocab_size = 256, seed = 4 }
local m = ctx.model{ vocab_size = 259,  -- the byte tokenizer's ids (the data uses 256)
                      d_model = 64, n_layer = 2, n_head = 4,
                     context_length = 4096, pe = "rope", seed = 2, attention = "flash" }
local loss = ctx.evaluate{ model = m, data = data, batch_size = 1, seq_len = 4096, batches = 1 }
if ctx.rank() == 0 then
  print(string.format("cp %d loss %.9g", g.cp, loss))
end
local recs = ctx.run_eval{ eval = ctx.eval("passkey", { token_lengths = { 4000 }, num_depths = 2,
                                           per_setting = 1, generate = false, windowed = false,
                                           batch_size = 1 }),
                           model = m, tokenizer = ctx.tokenizer("byte") }
for _, r in ipairs(recs) do
  if r.task == "passkey_by_length" and ctx.rank() == 0 then
    print(string.format("cp %d passkey logprob %.9g", g.cp, r.mean_logprob))
  end
end
