-- An option key with a typo must be an error naming this file and line.
local m = ctx.model{
  d_modle = 64,
}
