-- cancel.lua: drop a call that is still waiting in the delay set, and count it.
-- ARGV: 1 id
-- Returns: {1, payload} if the call was parked (its payload, so the caller can mark its result revoked
-- as Celery would), else {0}.
local id = ARGV[1]
if redis.call('ZREM', DELAYED, id) == 1 then
    local payload = redis.call('HGET', PAYLOADS, id) or ''
    forget(id)
    redis.call('HINCRBY', COUNTERS, 'cancelled', 1)
    return {1, payload}
end
return {0}
