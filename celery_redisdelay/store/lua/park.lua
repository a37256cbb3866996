-- park.lua: store a call and schedule it; replaces any earlier call with the same id
-- (that is how a task's retry parks itself again).
-- The history counts a park once per call parked: the same call parked again while it waits (the same id
-- and the same envelope, say a client's retry after the reply to a park that landed was lost) moves its due
-- time but is not counted again. A retry by self.retry() is counted: its call was in flight, and its envelope
-- says it is a retry. A debounce replaces on purpose and is counted.
-- ARGV: 1 id, 2 envelope, 3 meta JSON, 4 'in' (ARGV[5] is a countdown) or 'at' (ARGV[5] is a due time),
--       5 milliseconds, 6 '' or 'unique' or 'debounce', 7 the unique/debounce key (already in meta.k),
--       then for a call under limits (meta.lg), each limit's name and its stored form as the code declares it
-- Returns: {status, due time (ms, server clock), id}
--   status 1: stored under ARGV[1]
--   status 0: unique: a call holding the key is parked already; nothing stored; its id is returned
--   status -1: debounce: the key is held by another id than ARGV[1], or ARGV[1] was used before and
--              is no longer parked; nothing stored; the holder's id (or '') is returned to retry with
-- requires: calls, clock, history
local id, mode, key = ARGV[1], ARGV[6], ARGV[7]
for i = 8, #ARGV, 2 do
    redis.call('HSET', LIMITS, 'code:' .. ARGV[i], ARGV[i + 1])
end
local due = due_time(ARGV[4], ARGV[5])
if mode == 'unique' or mode == 'debounce' then
    local current = holder(key)
    if mode == 'unique' and current then
        return {0, tonumber(redis.call('ZSCORE', DELAYED, current)), current}
    end
    if mode == 'debounce' and current ~= id and (current or redis.call('HEXISTS', PAYLOADS, id) == 1) then
        return {-1, 0, current or ''}
    end
    store(id, ARGV[2], ARGV[3], due)
    redis.call('HSET', INDEX, key, id)
    count('parked', 1)
else
    local again = redis.call('ZSCORE', DELAYED, id) and redis.call('HGET', PAYLOADS, id) == ARGV[2]
    store(id, ARGV[2], ARGV[3], due)
    if not again then
        count('parked', 1)
    end
end
return {1, due, id}
