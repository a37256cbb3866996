-- lock_take.lua: take a lock with a unique token and an expiry. When it is busy and a tracked call
-- asked for it, the call is deferred in the same step: back to the delay set, without counting a
-- delivery, and in line among the lock's waiters, so that the holder's release wakes it at once; the
-- first in line is due after the retry interval at the latest, the others later (see below).
-- A tracked call holds the lock as 'token|delivery|id': a lock whose holder is no longer in flight, or whose
-- lease or deadline ran out (its worker died), is taken over by the next asker rather than left held until
-- it expires; so is one that a later delivery of the holder asks for (its old run is gone, or the sweep would
-- not have delivered it again). A copy of the holding delivery (kombu restored its message) finds it busy
-- and is not deferred: the run that holds the lock finishes the call. A holder that still lives then finds,
-- at its release, that it lost the lock, as when it expires under it.
-- KEYS[FIXED_KEYS + 1]: the lock (string: the holder's token; for a tracked call '|', its delivery, '|', its id),
-- KEYS[FIXED_KEYS + 2]: its waiters (zset: id -> first deferral)
-- A delivery older than the call's current one asks in vain: the sweep delivered the call again after this one was
-- received (its worker was slow to start it), and the later delivery runs it. Taking the lock or deferring the call
-- for it would leave two copies of the current delivery (a deferral counts the delivery back), and both would run.
-- ARGV: 1 token, 2 expiry (ms), 3 id of the call asking ('' outside a task), 4 retry interval (ms), 5 the asking
--       delivery's number (0 or missing: not known)
-- Returns: {status, the lock's remaining ms}; status 1 taken, 2 taken over from a holder whose run is gone,
--          0 busy (the call, if any, is deferred, unless it is the holder), -1 busy and the call is not in flight
--          here, -2 the asking delivery is not the call's current one (in both, nothing changed).
-- requires: calls, clock, limits, meta, wake
local LOCK, WAITERS = KEYS[FIXED_KEYS + 1], KEYS[FIXED_KEYS + 2]
local wrong = check_type(LOCK, 'string') or check_type(WAITERS, 'zset')
if wrong then
    return wrong
end
local token, id = ARGV[1], ARGV[3]
local tracked = id ~= '' and redis.call('ZSCORE', INFLIGHT, id)
local delivery = tracked and tostring(tonumber(load_inflight_meta(id).d) or 0)
local value = tracked and table.concat({token, delivery, id}, '|') or token
local now = now_ms()
local asked = tonumber(ARGV[5]) or 0
if tracked and asked > 0 and asked < tonumber(delivery) then
    return {-2, redis.call('PTTL', LOCK)}
end

-- The taker leaves the line; whoever is first in it now is the one that polls (within the retry interval),
-- so that a holder that dies without releasing is noticed.
local function taken(status)
    if id ~= '' and redis.call('ZREM', WAITERS, id) == 1 then
        line_emptied(WAITERS)
    end
    local first, retry = redis.call('ZRANGE', WAITERS, 0, 0)[1], tonumber(ARGV[4])
    local score = first and retry > 0 and redis.call('ZSCORE', DELAYED, first)
    if score and tonumber(score) > now + retry and load_meta(first).s == 'deferred' then
        mark_if_earliest(now + retry, first)
        redis.call('ZADD', DELAYED, now + retry, first)
    end
    return {status, 0}
end

if redis.call('SET', LOCK, value, 'NX', 'PX', tonumber(ARGV[2])) then
    return taken(1)
end
local held = redis.call('GET', LOCK) or ''
if held == value then
    -- The same take again (a token is one take's): its reply was lost and the client sent it once more. It holds
    -- the lock; answered busy, a task would wait behind itself and a Lock until the expiry.
    return taken(1)
end
local held_delivery, holder = string.match(held, '^[^|]*|(%d+)|(.+)$')
if holder then
    local deadline = redis.call('ZSCORE', INFLIGHT, holder)
    if not deadline or tonumber(deadline) < now or (holder == id and delivery ~= held_delivery) then
        redis.call('SET', LOCK, value, 'PX', tonumber(ARGV[2]))
        redis.call('HINCRBY', COUNTERS, 'lock_takeovers', 1)
        return taken(2)
    end
end
local ttl = redis.call('PTTL', LOCK)
if id == '' or holder == id then
    return {0, ttl}  -- (a copy of the delivery that holds it: nothing to defer, the holding run finishes the call)
end
if not tracked then
    return {-1, ttl}
end
if redis.call('ZADD', WAITERS, 'NX', now, id) == 1 and redis.call('ZCARD', WAITERS) == 1 then
    redis.call('HINCRBY', COUNTERS, 'lock_lines', 1)  -- a new line: one more lock with waiters
end
-- The first in line tries again after the retry interval (the holder may die without releasing); the others
-- wait for the releases to wake them in turn. Should that chain break (a woken waiter cancelled), the n-th in
-- line tries again after the lock's expiry and n retry intervals at the latest (an hour at most): a line of
-- N waiters polls about ln(N) / retry times a second, not N / retry.
local retry = tonumber(ARGV[4])
local wait = retry
if ttl >= 0 then
    local rank = redis.call('ZRANK', WAITERS, id)
    wait = rank == 0 and math.min(retry, ttl + 1) or math.min(ttl + 1 + rank * retry, math.max(ttl + 1, 3600000))
end
local meta = load_inflight_meta(id)
meta.s = 'deferred'
unheld(meta)
free_slots(id, meta)
meta.d = math.max((tonumber(meta.d) or 1) - 1, 0)  -- a deferral is not a failed delivery
meta.w = (tonumber(meta.w) or 0) + 1
save_meta(id, meta)
redis.call('ZREM', INFLIGHT, id)
redis.call('ZADD', DELAYED, now + wait, id)
redis.call('HINCRBY', COUNTERS, 'lock_deferrals', 1)
return {0, ttl}
