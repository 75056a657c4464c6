-- A runtime error on line 3, raised two calls deep (no tail calls, so both frames show).
local function inner(t)
  local v = t.missing.field
  return v
end
local function outer()
  local r = inner({})
  return r
end
outer()
