-- Sets globals that the test reads back through the C API.
local helper = function(x) return x * 2 end
answer = helper(21)
greeting = "hello from " .. (arg and arg[0] or "?")
script_args = table.pack(...)
