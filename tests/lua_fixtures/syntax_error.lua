-- A syntax error on line 3.
local ok = 1
a, b foo
