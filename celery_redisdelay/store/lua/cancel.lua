-- cancel.lua: drop calls that are still waiting in the delay set (or in their gate, or on a pause), with their payload,
-- metadata and unique/debounce index entry; each is counted. Ids not parked here are left alone.
-- A cancel is remembered for a while, so that a cancel sent again (its reply lost to a dropped connection, and
-- redis-py or the caller sending it once more) is answered as the first was, and the caller can still record the
-- call revoked: the first attempt's caller never saw the payload it needs for that.
-- KEYS[FIXED_KEYS + 1] cancelled   zset  id -> when it was cancelled here (ms), for ARGV[1] ms
-- KEYS[FIXED_KEYS + 2] unrecorded  hash  id -> payload of a cancelled call not yet recorded revoked by its caller
--                                        (cancel_done.lua deletes it once recorded)
-- ARGV: 1 how long a cancel is remembered (ms), 2 '1' to take over the recording of remembered cancels (a cancel sent
--       again), '0' to leave it to their caller (the workers that all hear one revoke), 3.. the ids (1 to 1000)
-- Returns: {id, payload, record, ...} for each call cancelled, now or within ARGV[1] ms: record '1' when the caller
-- is to record it revoked (payload is then its payload, so the caller can record its result as revoked the way
-- Celery would), '0' when that is done or left to another caller.
-- requires: calls, clock, history, limits, meta, pauses
local CANCELLED, UNRECORDED = KEYS[FIXED_KEYS + 1], KEYS[FIXED_KEYS + 2]
local wrong = check_type(CANCELLED, 'zset') or check_type(UNRECORDED, 'hash')
if wrong then
    return wrong
end
local remember = tonumber(ARGV[1])
if not remember or remember < 1 or #ARGV < 3 or #ARGV > 1002 then
    return redis.error_reply('ERR cancel wants how long to remember (ms), whether to take over, and 1 to 1000 ids')
end
local take_over = ARGV[2] == '1'
local now = now_ms()
-- Forget the cancels older than that, a bounded number per call (each call adds at most 1000).
local old = redis.call('ZRANGEBYSCORE', CANCELLED, '-inf', now - remember, 'LIMIT', 0, 2000)
if #old > 0 then
    redis.call('ZREM', CANCELLED, unpack(old))
    redis.call('HDEL', UNRECORDED, unpack(old))
end

local answer, fresh = {}, 0
-- A call waiting in its gate (due, held back by its limits; see lib/limits.lua) is still parked, and so is a call set
-- aside on a pause (its metadata notes its member of PAUSED, see set_aside).
local function unpark(id)
    if redis.call('ZREM', DELAYED, id) == 1 then
        return true
    end
    local meta = load_meta(id)
    if meta.s == 'limited' and type(meta.lg) == 'string' and tonumber(meta.lw)
            and redis.call('ZREM', GATED, gated_member(meta.lg, tonumber(meta.lw), id)) == 1 then
        return true
    end
    return type(meta.pz) == 'string' and tonumber(meta.pd) ~= nil
        and redis.call('ZREM', PAUSED, paused_member(meta.pz, tonumber(meta.pd), id)) == 1
end

for i = 3, #ARGV do
    local id = ARGV[i]
    if unpark(id) then
        local payload = redis.call('HGET', PAYLOADS, id) or ''
        forget(id)
        redis.call('ZADD', CANCELLED, now, id)
        redis.call('HSET', UNRECORDED, id, payload)
        answer[#answer + 1], answer[#answer + 2], answer[#answer + 3] = id, payload, '1'
        fresh = fresh + 1
    elseif redis.call('ZSCORE', CANCELLED, id) then
        local payload = take_over and redis.call('HGET', UNRECORDED, id)
        answer[#answer + 1], answer[#answer + 2], answer[#answer + 3] = id, payload or '', payload and '1' or '0'
    end
end
if fresh > 0 then
    count('cancelled', fresh)
    -- Both go with the last cancel's memory: nothing is left of them once no cancel is remembered.
    redis.call('PEXPIRE', CANCELLED, remember)
    redis.call('PEXPIRE', UNRECORDED, remember)
end
return answer
