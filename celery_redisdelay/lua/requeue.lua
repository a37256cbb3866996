-- requeue.lua: give a dead-lettered call a fresh start, due at once.
-- ARGV: 1 id
-- Returns: 1 requeued, 0 not in the dead-letter set, -1 no payload to run (the entry stays dead).
local id = ARGV[1]
if not redis.call('ZSCORE', DEAD, id) then
    return 0
end
if redis.call('HEXISTS', PAYLOADS, id) == 0 then
    return -1
end
local now = now_ms()
mark_if_earliest(now, id)
revive(id, now)
return 1
