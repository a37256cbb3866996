-- requeue_many.lua: give dead-lettered calls a fresh start, due at once (one call is a list of one).
-- ARGV: the ids, 1 to 1000
-- Returns: {{ids requeued}, {ids left dead for want of a payload}}; ids not dead-lettered here are in neither.
-- requires: calls, clock, wake
if #ARGV < 1 or #ARGV > 1000 then
    return redis.error_reply('ERR requeue_many wants 1 to 1000 ids')
end
local now = now_ms()
local requeued, left = {}, {}
for _, id in ipairs(ARGV) do
    if redis.call('ZSCORE', DEAD, id) then
        if redis.call('HEXISTS', PAYLOADS, id) == 0 then
            left[#left + 1] = id
        else
            if #requeued == 0 then
                mark_if_earliest(now, id)  -- one marker covers them all: every requeued call is due now
            end
            revive(id, now)
            requeued[#requeued + 1] = id
        end
    end
end
return {requeued, left}
