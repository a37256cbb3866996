-- requeue_dead.lua: give the oldest dead-lettered calls a fresh start, due at once, a bounded step at a time.
-- Entries without a payload have nothing to run: they stay dead, and their ids are returned so the caller
-- can pass over them (ARGV[2]) on its next step.
-- ARGV: 1 most entries to look at (1 to 1000), 2 entries to pass over first (those earlier steps left dead)
-- Returns: {calls requeued, entries looked at, id of each entry left dead for want of a payload...}
-- requires: calls, clock, wake
local limit, skip = tonumber(ARGV[1]), tonumber(ARGV[2])
if not limit or limit < 1 or limit > 1000 or not skip or skip < 0 then
    return redis.error_reply('ERR requeue_dead wants 1 to 1000 entries and an offset >= 0')
end
local ids = redis.call('ZRANGE', DEAD, skip, skip + limit - 1)
local now = now_ms()
local result = {0, #ids}
for _, id in ipairs(ids) do
    if redis.call('HEXISTS', PAYLOADS, id) == 0 then
        result[#result + 1] = id
    else
        if result[1] == 0 then
            mark_if_earliest(now, id)  -- one marker covers them all: every requeued call is due now
        end
        revive(id, now)
        result[1] = result[1] + 1
    end
end
return result
