-- Device, precision and attention selection from a recipe (run with --device cpu and without).
local function opts(extra)
    local o = {d_model = 32, n_layer = 1, n_head = 2, vocab_size = 259, context_length = 16}
    for k, v in pairs(extra or {}) do o[k] = v end
    return o
end
local function expect_error(extra, pattern)
    local ok, err = pcall(ctx.model, opts(extra))
    assert(not ok, "expected an error matching '" .. pattern .. "'")
    assert(tostring(err):find(pattern), "error '" .. tostring(err) .. "' lacks '" .. pattern .. "'")
end

local n = ctx.cuda_devices()
assert(math.type(n) == "integer" and n >= 0)

local cpu = ctx.model(opts{device = "cpu"})
assert(cpu:config().device == "cpu")
assert(cpu:config().precision == "fp32")
assert(cpu:config().attention == "materialised", cpu:config().attention)  -- the CPU's auto
local flash = ctx.model(opts{device = "cpu", attention = "flash"})
assert(flash:config().attention == "flash")
local old = ctx.model(opts{backend = "cpu"})  -- the older key still works
assert(old:config().device == "cpu")

expect_error({device = "cpu", precision = "bf16"}, 'precision = "bf16" needs the CUDA backend')
expect_error({device = "cpu", backend = "cpu"}, "older name of device")
expect_error({device = "gpu"}, "device")
expect_error({attention = "fast"}, "attention")
expect_error({precision = "fp16"}, "precision")

local default = ctx.model(opts())
if n == 0 then
    assert(default:config().device == "cpu", "auto without a GPU is the CPU")
    expect_error({device = "cuda"}, 'device = "cuda" was asked for but cannot be used')
else
    print("device select: " .. n .. " CUDA device(s); default model on " .. default:config().device)
end
print("device selection ok: default " .. default:config().device)
