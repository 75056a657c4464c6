-- A truncated checkpoint must give a clear error naming the file, never a crash.
local dir = arg[1]
local m = ctx.model{ vocab_size = 32, d_model = 16, n_layer = 1, n_head = 2, context_length = 8 }
ctx.save(dir .. "/good.h5", { model = m })
local f = assert(io.open(dir .. "/good.h5", "rb"))
local bytes = f:read("a")
f:close()
local g = assert(io.open(dir .. "/cut.h5", "wb"))
g:write(bytes:sub(1, #bytes // 2))
g:close()
ctx.load(dir .. "/cut.h5")
