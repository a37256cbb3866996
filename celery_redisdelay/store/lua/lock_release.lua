-- lock_release.lua: release a lock if the token still holds it (compare and delete), then wake the
-- first waiter: a deferred call is made due now, a blocking waiter outside tasks gets a wake-up.
-- KEYS[FIXED_KEYS + 1]: the lock, KEYS[FIXED_KEYS + 2]: its waiters, KEYS[FIXED_KEYS + 3]: the wake-up list of blocking waiters
-- ARGV: 1 token
-- Returns: 1 released, 0 the lock had expired or another token holds it (nothing changed).
-- requires: calls, clock, meta, wake
local LOCK, WAITERS, WAKE_LIST = KEYS[FIXED_KEYS + 1], KEYS[FIXED_KEYS + 2], KEYS[FIXED_KEYS + 3]
local wrong = check_type(LOCK, 'string') or check_type(WAITERS, 'zset') or check_type(WAKE_LIST, 'list')
if wrong then
    return wrong
end
local held = redis.call('GET', LOCK)
if held ~= ARGV[1] and (not held or string.sub(held, 1, #ARGV[1] + 1) ~= ARGV[1] .. '|') then
    return 0  -- a tracked call holds it as 'token|delivery|id' (lock_take.lua)
end
redis.call('DEL', LOCK)
-- Waiters that are gone (cancelled, finished, dead-lettered) or no longer deferred are dropped on the
-- way; bounded.
for _ = 1, 100 do
    local first = redis.call('ZRANGE', WAITERS, 0, 0)[1]
    if not first then
        break
    end
    if redis.call('ZSCORE', DELAYED, first) and load_meta(first).s == 'deferred' then
        local now = now_ms()
        mark_if_earliest(now, first)
        redis.call('ZADD', DELAYED, now, first)
        break
    elseif redis.call('ZSCORE', INFLIGHT, first) then
        break  -- already on its way to try again
    end
    -- Gone, or parked again / rescheduled by hand (no longer waiting for this lock): drop it.
    redis.call('ZREM', WAITERS, first)
    line_emptied(WAITERS)
end
redis.call('DEL', WAKE_LIST)
redis.call('RPUSH', WAKE_LIST, 1)
redis.call('PEXPIRE', WAKE_LIST, 10000)
return 1
