-- lock_extend.lua: give a held lock a new expiry, if the token still holds it.
-- KEYS[1]: the lock. ARGV: 1 token, 2 expiry (ms)
-- Returns: 1 extended, 0 not held by this token.
local held = redis.call('GET', KEYS[1])
if held and (held == ARGV[1] or string.sub(held, 1, #ARGV[1] + 1) == ARGV[1] .. '|') then  -- 'token|delivery|id': lock_take.lua
    redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
    return 1
end
return 0
