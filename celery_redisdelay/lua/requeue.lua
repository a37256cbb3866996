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
local meta = load_meta(id)
meta.d = 0
meta.s = 'delayed'
meta.why = nil
save_meta(id, meta)
redis.call('ZREM', DEAD, id)
redis.call('ZADD', DELAYED, now_ms(), id)
return 1
