local data = ctx.data.text{ text = string.rep("abc", 100) }
local m = ctx.model{ d_model = 16, n_head = 2, n_layer = 1, context_length = 16 }
ctx.train{ model = m, data = data, steps = 2, batch_size = 2,
  optimizer = { lr = 1e-3, wieght_decay = 0.1 } }
