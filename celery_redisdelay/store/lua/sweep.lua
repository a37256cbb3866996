-- sweep.lua: calls in flight past their deadline go back to the delay set, due at once,
-- or to the dead-letter set once they have been delivered max-deliveries times. Each tick's sweep also
-- forgets the history's oldest minutes (a few at most).
-- ARGV: 1 most calls to look at, 2 default max deliveries
-- Returns: {calls put back, calls dead-lettered}.
local now = now_ms()
local ids = redis.call('ZRANGEBYSCORE', INFLIGHT, '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local requeued, buried = 0, 0
for _, id in ipairs(ids) do
    local meta = load_inflight_meta(id)
    local deliveries = tonumber(meta.d) or 0
    local limit = tonumber(meta.m) or tonumber(ARGV[2])
    if redis.call('HEXISTS', PAYLOADS, id) == 0 then
        bury(id, meta, 'payload missing at sweep', now)
        buried = buried + 1
    elseif limit > 0 and deliveries >= limit then
        bury(id, meta, 'not acknowledged after ' .. deliveries .. ' deliveries (last seen ' .. tostring(meta.s) .. ')', now)
        buried = buried + 1
    else
        redis.call('ZREM', INFLIGHT, id)
        meta.s = 'swept'
        save_meta(id, meta)
        redis.call('ZADD', DELAYED, now, id)
        requeued = requeued + 1
    end
end
if requeued > 0 then
    count('swept', requeued)
end
prune_history(now)
return {requeued, buried}
