-- ctx.parallel(): the grid and this rank's coordinates (bad grids: tests/CMakeLists.txt).
-- arg[1] = "set": the recipe asks for tp 2 itself.
local g = arg[1] == "set" and ctx.parallel{ tp = 2 } or ctx.parallel()
print(string.format("rank %d of %d: dp %d x cp %d x tp %d, coordinates dp %d cp %d tp %d",
                    g.rank, g.world, g.dp, g.cp, g.tp, g.dp_rank, g.cp_rank, g.tp_rank))
if arg[1] == "set" then ctx.parallel{ tp = 1 } end  -- the grid is fixed now: an error
