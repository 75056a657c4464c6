-- Contextual sparsity from a recipe (docs/SPARSITY.md): predictors trained on a model's own
-- activations, sparse generation and teacher-forced decoding, the predictors file round trip,
-- and the errors a user meets first. arg[1]: a scratch directory.
local m = ctx.model{ style = "gpt2", vocab_size = 259, d_model = 32, n_head = 4, n_layer = 2,
                     context_length = 32, seed = 3, pe = ctx.pe("learned") }
local text = string.rep("the quick brown fox jumps over the lazy dog; ", 40)
local docs = ctx.data.documents{ texts = { text, text:upper(), text:reverse() } }
local prompt = { 116, 104, 101, 32, 113 }
local function err(f, ...)
  local ok, e = pcall(f, ...)
  assert(not ok, "expected an error")
  return tostring(e)
end

-- sparsity before there are predictors: say what to do
assert(err(m.generate, m, prompt, { sparsity = { mlp = 0.5 } }):find("needs sparsity predictors"))

local s = m:train_predictors{ data = docs, row_len = 32, tokens = 1024, held_out = 512, epochs = 8,
                              mlp_rank = 8, heads_rank = 4 }
assert(s.tokens == 1024 and #s.recall_mlp_by_layer == 2 and #s.loss_heads_last == 2)
assert(s.recall_mlp > 0 and s.recall_mlp <= 1 and s.recall_heads > 0 and s.recall_heads <= 1)
for l = 1, 2 do
  assert(s.loss_mlp_last[l] < s.loss_mlp_first[l], "the unit predictors' loss did not fall")
end
assert(s.recall_active == nil, "recall of active units is for ReLU models only")

-- bad options name the key and what is expected
assert(err(m.generate, m, prompt, { sparsity = { mlp = 1.0 } }):find("mlp must be in %[0, 1%)"))
assert(err(m.generate, m, prompt, { sparsity = { mpl = 0.5 } }):find("unknown option 'mpl'"))
assert(err(m.generate, m, prompt, { sparsity = { heads = "half" } }):find("heads"))
assert(err(m.train_predictors, m, { data = docs, row_len = 1 }):find("row_len"))

-- no fraction skipped is the dense path: the same tokens
local dense = m:generate(prompt, { max_new_tokens = 8 })
local same = m:generate(prompt, { max_new_tokens = 8, sparsity = {} })
for i = 1, 8 do assert(dense.tokens[i] == same.tokens[i]) end
local sparse = m:generate(prompt, { max_new_tokens = 8, sparsity = { mlp = 0.5, heads = 0.5 } })
assert(#sparse.tokens == 8)

-- decode_score: dense equals the model's own perplexity scoring in spirit (finite, > 1), and the
-- saved predictors score the same after a reload
local d0 = m:decode_score{ data = docs, rows = 2, row_len = 24, prefix = 8 }
assert(d0.tokens == 2 * 16 and d0.perplexity > 1 and d0.decode_tokens_per_s > 0)
local opts = { data = docs, rows = 2, row_len = 24, prefix = 8, sparsity = { mlp = 0.5 } }
local d1 = m:decode_score(opts)
m:save_predictors(arg[1] .. "/sparsity_predictors.safetensors")
m:load_predictors(arg[1] .. "/sparsity_predictors.safetensors")
local d2 = m:decode_score(opts)
assert(d1.perplexity == d2.perplexity, string.format("%.9g vs %.9g", d1.perplexity, d2.perplexity))

-- scoring tasks run by teacher-forced decoding when given sparsity: with nothing skipped that is
-- the dense model, so perplexity agrees with the forward pass's to float rounding
local function ppl(sparsity)
  local task = ctx.eval("perplexity", { multiples = { 1 }, max_windows = 4, batch_size = 2 })
  for _, r in ipairs(ctx.run_eval{ eval = task, model = m, data = docs, sparsity = sparsity }) do
    if r.task == "perplexity" then return r.mean_ppl end
  end
end
local p_forward, p_decode = ppl(nil), ppl({})
assert(math.abs(p_decode / p_forward - 1) < 1e-4, string.format("%.6f vs %.6f", p_decode, p_forward))
assert(ppl({ mlp = 0.5 }) ~= p_forward)

-- predictors of another model are refused with what differs
local other = ctx.model{ style = "gpt2", vocab_size = 259, d_model = 48, n_head = 4, n_layer = 2,
                         context_length = 32, seed = 3, pe = ctx.pe("learned") }
assert(err(other.load_predictors, other, arg[1] .. "/sparsity_predictors.safetensors")
         :find("d_model = 32, this model has 48"))
assert(err(m.load_predictors, m, arg[1] .. "/nosuch.safetensors"):find("nosuch"))
-- the predictors travel with the model: checkpoints and HF exports carry the side file, and
-- loading picks it up (the same scores after the round trip)
local ck = ctx.save_checkpoint(arg[1] .. "/ckpt", { model = m })
local back = ctx.load(ck)
assert(back:decode_score(opts).perplexity == d2.perplexity)
ctx.save_hf(m, arg[1] .. "/hf")
local hf = ctx.load_hf(arg[1] .. "/hf")
local h1 = hf:decode_score(opts)
assert(math.abs(h1.perplexity / d2.perplexity - 1) < 1e-5, string.format("%.7g vs %.7g", h1.perplexity, d2.perplexity))

-- into ReLU form: exact unit labels (active or not), their recall reported, positive-score
-- selection allowed; SwiGLU and unknown names refused
m:set_activation("relu")
assert(m:config().activation == "relu")
ctx.train{ model = m, data = ctx.data.tokens{ tokens = { 116, 104, 101, 32, 113, 117, 105, 99, 107 },
                                              vocab_size = 259 },
           steps = 3, batch_size = 2, seq_len = 8, log_every = 0 }
local r = m:train_predictors{ data = docs, row_len = 32, tokens = 1024, held_out = 512, epochs = 8,
                              mlp_rank = 8, heads_rank = 4 }
assert(r.recall_active > 0 and r.recall_active <= 1 and r.selected_active >= 0)
assert(#m:generate(prompt, { max_new_tokens = 4, sparsity = { mlp_positive = true } }).tokens == 4)
assert(err(m.set_activation, m, "swiglu"):find("SwiGLU has another MLP shape"))
assert(err(m.set_activation, m, "tanh"):find("unknown activation 'tanh'"))
print("sparsity ok")
