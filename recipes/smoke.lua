-- Smoke recipe: a tiny GPT-2-style model learns a short synthetic sequence.
-- The data is a random 24-token cycle repeated; once the model attends more than one period back
-- every next token is predictable, so the loss must fall far below its start (ln 64 = 4.16).
-- ctest runs this recipe; it fails (non-zero exit) if the loss does not fall.

local data = ctx.data.synthetic{ kind = "cycle", length = 4096, period = 24, vocab_size = 64, seed = 7 }

local model = ctx.model{
  style = "gpt2",
  vocab_size = 64, d_model = 64, n_layer = 2, n_head = 4, context_length = 64,
  pe = ctx.pe("learned", { init_std = 0.02 }),
  seed = 1,
}
ctx.log(tostring(model))

local before = ctx.evaluate{ model = model, data = data, batch_size = 8, batches = 2 }
local result = ctx.train{
  model = model, data = data, steps = 150, batch_size = 8, seq_len = 64,
  optimizer = { lr = 3e-3, warmup_steps = 10, min_lr = 3e-4, weight_decay = 0.0 },
  log_every = 25,
}
local after = ctx.evaluate{ model = model, data = data, batch_size = 8, batches = 2 }

ctx.log(string.format("eval loss %.4f -> %.4f (train %.4f -> %.4f, %.0f tok/s)",
  before, after, result.first_loss, result.final_loss, result.tokens_per_s))
assert(after < 0.25 * before, string.format("loss did not fall enough: %.4f -> %.4f", before, after))
