-- A sandboxed recipe must not be able to switch off the instruction limit.
debug.sethook()
while true do end
