-- An error object that is a table with __tostring.
local E = setmetatable({code = 7}, {__tostring = function(e) return "custom error (code " .. e.code .. ")" end})
error(E)
