local function inner() error("boom from inner") end
local function outer() inner() end
outer()
