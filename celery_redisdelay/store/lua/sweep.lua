-- sweep.lua: calls in flight past their deadline go back to the delay set, due at once,
-- or to the dead-letter set once they have been delivered max-deliveries times. Each tick's sweep also
-- forgets the history's oldest minutes (a few at most).
-- A call a worker held under a lease (lease.lua) is free for any worker again; where the broker is this
-- Redis, the delivery that worker held (its kombu delivery tag, meta.g) leaves kombu's unacked hash and
-- index, so kombu does not restore it after its visibility timeout: the delivery the sweep schedules stands
-- for it.
-- Where the broker is this Redis, the sweep also takes back the calls a worker popped but never held: kombu
-- noted the delivery in its unacked index (scored with the time the worker popped it, by the worker's clock)
-- and the worker died before its lease thread took the call, a few milliseconds later. Such a call would
-- otherwise wait for its queue timeout. Each sweep reads the index onwards from where the last one stopped
-- ('unacked_seen' in the history hash), up to a lease ago, at most NEVER_HELD_STEP entries: every delivery
-- is looked at once, a lease after it was popped. A delivery of this store (its tag is '<id>.<delivery>',
-- release.lua) whose call is still queued, held by no one, is swept like a lapsed lease. A worker whose clock
-- is more than a lease behind the server's pops deliveries the cursor has passed: they wait for the queue
-- timeout, as before.
-- KEYS[FIXED_KEYS + 1], KEYS[FIXED_KEYS + 2] (where the broker is this Redis): kombu's unacked hash and its index.
-- ARGV: 1 most calls to look at, 2 default max deliveries, 3 the lease (ms; with KEYS[FIXED_KEYS + 1])
-- Returns: {calls put back, calls dead-lettered}.
local UNACKED, UNACKED_INDEX = KEYS[FIXED_KEYS + 1], KEYS[FIXED_KEYS + 2]
if UNACKED then
    local wrong = check_type(UNACKED, 'hash') or check_type(UNACKED_INDEX, 'zset')
    if wrong then
        return wrong
    end
end
local NEVER_HELD_STEP = 500
local now = now_ms()
local requeued, buried = 0, 0

-- Back to the delay set, due now, or to the dead-letter set out of deliveries.
local function sweep_call(id, meta)
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
        free_slots(id, meta)
        save_meta(id, meta)
        redis.call('ZADD', DELAYED, now, id)
        requeued = requeued + 1
    end
end

local ids = redis.call('ZRANGEBYSCORE', INFLIGHT, '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, id in ipairs(ids) do
    sweep_call(id, load_inflight_meta(id))
end

local lease = tonumber(ARGV[3])
if UNACKED and lease then
    local seen = redis.call('HGET', HISTORY, 'unacked_seen') or '-inf'
    local popped = redis.call('ZRANGEBYSCORE', UNACKED_INDEX, '(' .. seen, (now - lease) / 1000, 'WITHSCORES',
        'LIMIT', 0, NEVER_HELD_STEP)
    for i = 1, #popped, 2 do
        local tag = popped[i]
        local id, delivery = string.match(tag, '^(.+)%.(%d+)$')
        if id and redis.call('ZSCORE', INFLIGHT, id) then
            local meta = load_inflight_meta(id)
            if meta.h == nil and meta.s == 'queued' and tonumber(meta.d) == tonumber(delivery) then
                meta.g = tag  -- the delivery kombu holds for the dead worker goes with the sweep
                sweep_call(id, meta)
            end
        end
    end
    if #popped > 0 then
        redis.call('HSET', HISTORY, 'unacked_seen', popped[#popped])
    end
end

if requeued > 0 then
    count('swept', requeued)
end
prune_history(now)
return {requeued, buried}
