-- The segmented-sequences method at small scale (METHODS.md 2.2, 3.2-3.3) on the generated
-- default corpus: extend base models trained at Lt to Le = 4 Lt by continued pretraining on
-- chunk-0.25 rows (4 segments of Lt/4 tokens from an Le window, at their ORIGINAL positions), and
-- compare perplexity at Lt, 2Lt, 4Lt before (OOTB) and after. See chunk_experiment.lua.
--
--   mpirun -np 2 ctxengine recipes/chunk_025.lua [OUT_DIR] [quick]
local C = require("common")
local out = arg[1] or "runs/chunk_025"
if arg[2] == "quick" then C.quick(out) end
local corpus = ctx.data.corpus(C.corpus)
require("chunk_experiment")(C, corpus, out, { recall = true })
