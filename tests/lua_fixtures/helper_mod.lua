-- A helper module required by uses_require.lua.
local M = {}
function M.scale(x) return x * 10 end
return M
