-- The ctx module's surface: info, plugins, model construction per style, config, extend.
assert(type(ctx.version) == "string")
assert(ctx.rank() == 0 and ctx.world_size() == 1)
local names = {}
for _, p in ipairs(ctx.plugins()) do names[p.name] = p.kind end
assert(names["pe/learned"] == "pe" and names["pe/rope"] == "pe" and names["pe/alibi"] == "pe")

local neox = ctx.model{ style = "neox", vocab_size = 32, d_model = 32, n_head = 4, n_layer = 1 }
local c = neox:config()
assert(c.pe == "pe/rope" and c.parallel_residual and not c.tied_embeddings)
assert(c.activation == "gelu_erf")
local bloom = ctx.model{ style = "bloom", vocab_size = 32, d_model = 32, n_head = 4, n_layer = 1 }
assert(bloom:config().pe == "pe/alibi" and bloom:config().embedding_layernorm)
-- The Llama family: RMSNorm, SwiGLU, grouped-query attention, no biases, rope on whole heads;
-- attention_bias alone switches the output bias too (HF Llama), Qwen2 sets them apart.
local llama = ctx.model{ style = "llama", vocab_size = 32, d_model = 32, n_head = 4, n_kv_head = 2,
                         n_layer = 1, ffn_hidden = 40 }
c = llama:config()
assert(c.pe == "pe/rope" and c.norm == "rmsnorm" and c.activation == "swiglu" and c.n_kv_head == 2)
assert(not c.tied_embeddings and not c.attention_bias and not c.attention_out_bias and not c.mlp_bias)
-- wte + lm_head + 1 layer (2 norms, q 32x32, k and v 16x32 each, o 32x32, gate + up 80x32,
-- down 32x40) + final norm
assert(llama:num_params() == 2 * 32 * 32 + (2 * 32 + 32 * 32 + 2 * 16 * 32 + 32 * 32 + 80 * 32 + 32 * 40) + 32,
       "llama parameters: " .. llama:num_params())
local biased = ctx.model{ style = "llama", vocab_size = 32, d_model = 32, n_head = 4, n_layer = 1,
                          attention_bias = true }
assert(biased:config().attention_out_bias)
local qwen = ctx.model{ style = "llama", vocab_size = 32, d_model = 32, n_head = 4, n_layer = 1,
                        attention_bias = true, attention_out_bias = false, sliding_window = 16 }
assert(not qwen:config().attention_out_bias and qwen:config().sliding_window == 16)
local ok, err = pcall(ctx.model, { style = "llama", vocab_size = 32, d_model = 32, n_head = 4,
                                   n_kv_head = 3, n_layer = 1 })
assert(not ok and tostring(err):find("n_kv_head %(3%) must divide n_head %(4%)"), tostring(err))
ok, err = pcall(ctx.model, { style = "llama", vocab_size = 32, norm = "batchnorm" })
assert(not ok and tostring(err):find("layernorm"), tostring(err))

local m = ctx.model{ vocab_size = 32, d_model = 16, n_head = 2, n_layer = 1, context_length = 8 }
local before = m:num_params()
m:extend(16)
assert(m:config().context_length == 16 and m:config().trained_length == 8)
assert(m:num_params() == before + 8 * 16, "learned table grows by 8 rows of 16")
local data = ctx.data.tokens{ tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, vocab_size = 32 }
assert(#data == 20)
local r = ctx.train{ model = m, data = data, steps = 3, batch_size = 2, seq_len = 16, log_every = 0 }
assert(#r.losses == 3 and r.step == 3)
local r2 = ctx.train{ model = m, data = data, steps = 2, batch_size = 2, seq_len = 16, log_every = 0 }
assert(r2.step == 5, "a second ctx.train continues the optimizer")
assert(r2.skipped == 0, "no non-finite step to skip")
local okk, errk = pcall(ctx.train, { model = m, data = data, steps = 1, batch_size = 2, seq_len = 16,
                                     skip_nonfinite = -1 })
assert(not okk and tostring(errk):find("skip_nonfinite.*must be in %[0, 1000000%]"), tostring(errk))
local loss = ctx.evaluate{ model = m, data = data, seq_len = 16, batch_size = 1, batches = 1 }
assert(loss > 0 and loss < 10)
print("model_api ok")
