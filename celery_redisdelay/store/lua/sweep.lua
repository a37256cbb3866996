-- sweep.lua: calls in flight past their deadline go back to the delay set, due at once,
-- or to the dead-letter set once they have been delivered max-deliveries times. Each tick's sweep also
-- forgets the history's oldest minutes (a few at most).
-- A call a worker held under a lease (lease.lua) is free for any worker again; where the broker is this
-- Redis, the delivery that worker held (its kombu delivery tag, meta.g) leaves kombu's unacked hash and
-- index, so kombu does not restore it after its visibility timeout: the delivery the sweep schedules stands
-- for it.
-- KEYS[11], KEYS[12] (where the broker is this Redis): kombu's unacked hash and its index.
-- ARGV: 1 most calls to look at, 2 default max deliveries
-- Returns: {calls put back, calls dead-lettered}.
local UNACKED, UNACKED_INDEX = KEYS[11], KEYS[12]
if UNACKED then
    local wrong = check_type(UNACKED, 'hash') or check_type(UNACKED_INDEX, 'zset')
    if wrong then
        return wrong
    end
end
local now = now_ms()
local ids = redis.call('ZRANGEBYSCORE', INFLIGHT, '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local requeued, buried = 0, 0
for _, id in ipairs(ids) do
    local meta = load_inflight_meta(id)
    local deliveries = tonumber(meta.d) or 0
    local limit = tonumber(meta.m) or tonumber(ARGV[2])
    if UNACKED and type(meta.g) == 'string' then
        redis.call('HDEL', UNACKED, meta.g)
        redis.call('ZREM', UNACKED_INDEX, meta.g)
    end
    if redis.call('HEXISTS', PAYLOADS, id) == 0 then
        bury(id, meta, 'payload missing at sweep', now)
        buried = buried + 1
    elseif limit > 0 and deliveries >= limit then
        bury(id, meta, 'not acknowledged after ' .. deliveries .. ' deliveries (last seen ' .. tostring(meta.s) .. ')', now)
        buried = buried + 1
    else
        redis.call('ZREM', INFLIGHT, id)
        meta.s = 'swept'
        unheld(meta)
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
