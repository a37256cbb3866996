-- park.lua: store a call and schedule it; replaces any earlier call with the same id
-- (that is how a task's retry parks itself again).
-- ARGV: 1 id, 2 envelope, 3 meta JSON, 4 'in' (ARGV[5] is a countdown) or 'at' (ARGV[5] is a due time),
--       5 milliseconds
-- Returns: the due time (ms, server clock).
local id = ARGV[1]
local due
if ARGV[4] == 'in' then
    due = now_ms() + tonumber(ARGV[5])
else
    due = tonumber(ARGV[5])
end
redis.call('HSET', PAYLOADS, id, ARGV[2])
redis.call('HSET', META, id, ARGV[3])
redis.call('ZREM', INFLIGHT, id)
redis.call('ZREM', DEAD, id)
redis.call('ZADD', DELAYED, due, id)
return due
