-- Under mpirun -np 2: the gradient reducer's options from ctx.train. With two ranks every
-- summation order gives the same bits (a + b == b + a), so tiny buckets (many all-reduces
-- overlapped with the backward pass) and the deterministic rank-ordered mode must train to the
-- same fingerprint as the defaults; bad options are refused with the recipe's line.
assert(ctx.world_size() == 2, "run me with mpirun -np 2")
local function run(extra)
    -- a fresh stream per run: a stream continues where the last ctx.train left it
    local data = ctx.data.synthetic{ length = 3000, period = 20, vocab_size = 48, seed = 5 }
    local m = ctx.model{ vocab_size = 48, d_model = 32, n_layer = 3, n_head = 4, context_length = 32,
                         pe = "alibi", device = "cpu" }
    local opts = { model = m, data = data, steps = 4, batch_size = 2, optimizer = { lr = 3e-3 },
                   log_every = 0 }
    for k, v in pairs(extra) do opts[k] = v end
    ctx.train(opts)
    return m:fingerprint()
end
local base = run{}
local small = run{ grad_bucket_mb = 0.002 }  -- 2 KiB buckets: dozens per step
local det = run{ deterministic = true, grad_bucket_mb = 0.01 }
assert(small == base, "tiny buckets changed training: " .. small .. " vs " .. base)
assert(det == base, "deterministic mode changed training: " .. det .. " vs " .. base)

local function refused(extra, pattern)
    local ok, err = pcall(run, extra)
    assert(not ok and tostring(err):find(pattern), tostring(err))
end
refused({ grad_bucket_mb = 0 }, "grad_bucket_mb")
refused({ reduce_precision = "fp16" }, "reduce_precision")
refused({ reduce_precision = "bf16" }, "bf16")  -- the MPI host path sums fp32 only
print(string.format("rank %d reduce options ok %s", ctx.rank(), base))
