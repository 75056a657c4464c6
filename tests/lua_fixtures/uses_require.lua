-- Requires a Lua file next to it (package.path set by the test).
local helper = require("helper_mod")
scaled = helper.scale(4)
