-- cancel.lua: drop a call that is still waiting in the delay set.
-- ARGV: 1 id
-- Returns: 1 if the call was parked, else 0.
if redis.call('ZREM', DELAYED, ARGV[1]) == 1 then
    forget(ARGV[1])
    return 1
end
return 0
