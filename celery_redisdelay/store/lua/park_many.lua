-- park_many.lua: store many new calls of one task with the same limits and one due time (task.park_many).
-- ARGV: 1 'in' (ARGV[2] is a countdown) or 'at' (ARGV[2] is a due time), 2 milliseconds,
--       3 the meta JSON they share, then id, envelope for each call (at most a thousand calls per script)
-- Returns: the due time (ms, server clock).
-- The ids are fresh, so unlike park.lua there is no earlier call to replace: three commands in all.
-- requires: clock, history, wake
local due = due_time(ARGV[1], ARGV[2])
local meta = ARGV[3]
local payloads, metas, scores = {}, {}, {}
for i = 4, #ARGV, 2 do
    payloads[#payloads + 1] = ARGV[i]
    payloads[#payloads + 1] = ARGV[i + 1]
    metas[#metas + 1] = ARGV[i]
    metas[#metas + 1] = meta
    scores[#scores + 1] = due
    scores[#scores + 1] = ARGV[i]
end
if #scores > 0 then
    mark_if_earliest(due, ARGV[4])
    redis.call('HSET', PAYLOADS, unpack(payloads))
    redis.call('HSET', META, unpack(metas))
    redis.call('ZADD', DELAYED, unpack(scores))
    count('parked', #scores / 2)
end
return due
