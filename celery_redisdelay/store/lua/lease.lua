-- lease.lua: a worker's main process holds the calls it has received (reserved or running) under a lease,
-- and renews all of them in one call per renewal period (worker/leases.py). A call whose lease runs out is
-- past its in-flight deadline, and the sweep delivers it again: a dead worker's calls come back within a
-- lease, not after the queue or run timeout. Metadata (see lib/meta.lua): h the worker holding the call,
-- g kombu's delivery tag of the delivery it holds, x the hard end of its run (the task's own timeout, set
-- at start).
-- KEYS[FIXED_KEYS + 1]: the workers hash, worker -> {"n": calls it holds here, "at": when it last renewed (ms)}.
-- ARGV: 1 worker, 2 lease (ms), 3 'hold', 'give', 'requeue' or 'reject', 4 calls the worker holds in this store in all (-1: not
--       said, the workers hash is left as it is), then id, delivery tag for each call (at most a thousand)
--   hold: take each call in flight that no other worker holds, or renew it; its deadline becomes
--         now + lease, or later if touch() set a later one, and never past x.
--   give: the worker gives back the calls it holds that have not started (a warm shutdown: kombu puts
--         their messages back in the queue): each is queued again with its queue timeout.
--   requeue: the worker puts back calls whose messages kombu does not keep (redisdelay_skip_unacked, see
--         worker/unacked.py): a call whose run was rejected with requeue, or that its channel held
--         unacknowledged when it closed (a warm shutdown, a lost connection).
--         Each goes back to the delay set due now, as the sweep puts a call back, and the next release
--         delivers it again.
--   reject: the same for calls whose runs were rejected with requeue, and the call notes which delivery
--         was rejected (rj): a start of that delivery that reaches Redis after it (a pool process writes its
--         starts in batches) is stale and does not take the call back, as a late start does after the sweep
--         (start_call). A start at channel close is not stale: the worker may not have heard yet that a pool
--         process started the call.
-- Returns: the ids of the calls not held (hold: unknown, finished, held by another worker, delivered again
-- since the delivery the worker names, or a renewal of a call sent again since (an attempt no worker took yet); give: not held by this worker; requeue and reject: held by another
-- worker, or delivered again since).
-- requires: clock, limits, meta, wake
local WORKERS = KEYS[FIXED_KEYS + 1]
local wrong = check_type(WORKERS, 'hash')
if wrong then
    return wrong
end
local worker, lease, op = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local now = now_ms()
local missed = {}
-- Whether a tag of ours ('<id>.<n>', as the release gives it) names an earlier delivery than the call's current
-- one: the sweep delivered the call again since, so the worker that received it then no longer has it (it may
-- still renew it for a while) and must not take it, or the new delivery would find it held and be dropped as
-- stale. A tag of another form (kombu's own) says nothing.
local function earlier_delivery(id, tag, meta)
    if string.sub(tag, 1, #id + 1) ~= id .. '.' then
        return false
    end
    local n = tonumber(string.sub(tag, #id + 2))
    return n ~= nil and n < (tonumber(meta.d) or 0)
end
-- A renewal (ARGV[4] 0 or more; a take says -1) of a call that no worker has taken or started since it was sent or
-- released (its metadata still in the park form, see load_inflight_meta) comes from the worker of an earlier attempt
-- under the same tag: a call retried with countdown 0 is sent again as '<id>.1', and its first worker renews it for a
-- while after its run ended. A lease belongs to one attempt: only a take (the worker received this attempt) holds it.
local renewal = tonumber(ARGV[4]) >= 0
local function untaken(id)
    local meta = load_meta(id)
    return meta.s == 'delayed' and (tonumber(meta.d) or 0) == 0
end
for i = 5, #ARGV, 2 do
    local id, tag = ARGV[i], ARGV[i + 1]
    local score = redis.call('ZSCORE', INFLIGHT, id)
    local meta = score and not (op == 'hold' and renewal and untaken(id)) and load_inflight_meta(id)
    if not meta or (meta.h ~= nil and meta.h ~= worker) or (meta.h == nil and earlier_delivery(id, tag, meta)) then
        missed[#missed + 1] = id
    elseif op == 'hold' then
        local deadline = now + lease
        if meta.h == worker then
            deadline = math.max(tonumber(score), deadline)  -- a renewal keeps what touch() gave
        else
            meta.h = worker
            if tag ~= '' then
                meta.g = tag
            end
            save_meta(id, meta)
        end
        local hard = meta.s == 'running' and tonumber(meta.x)
        if hard and hard < deadline then
            deadline = hard
        end
        if deadline ~= tonumber(score) then
            redis.call('ZADD', INFLIGHT, deadline, id)
        end
    elseif op == 'requeue' or op == 'reject' then
        redis.call('ZREM', INFLIGHT, id)
        meta.s, meta.b = 'swept', nil
        if op == 'reject' then
            meta.rj = tonumber(meta.d)
        end
        unheld(meta)
        free_slots(id, meta)
        save_meta(id, meta)
        mark_if_earliest(now, id)
        redis.call('ZADD', DELAYED, now, id)
    elseif meta.h == worker and meta.s ~= 'running' then
        meta.h, meta.g, meta.s, meta.b = nil, nil, 'queued', 1  -- b: its list holds kombu's form of it (sweep.lua)
        save_meta(id, meta)
        redis.call('ZADD', INFLIGHT, now + (tonumber(meta.q) or lease), id)
    else
        missed[#missed + 1] = id
    end
end
-- What each worker holds, for status and metrics, written by renewals (a take, ARGV[4] -1, leaves it); a
-- worker that holds nothing, or has not renewed for three leases (it died), is forgotten. One field per live
-- worker: the walk is as long as the fleet, once per renewal.
local held = tonumber(ARGV[4])
if held < 0 then
    return missed
elseif op == 'hold' and held > 0 then
    redis.call('HSET', WORKERS, worker, cjson.encode({n = held, at = now}))
else
    redis.call('HDEL', WORKERS, worker)
end
local fields = redis.call('HGETALL', WORKERS)
for i = 1, #fields, 2 do
    local ok, seen = pcall(cjson.decode, fields[i + 1])
    if not ok or type(seen) ~= 'table' or (tonumber(seen.at) or 0) < now - 3 * lease then
        redis.call('HDEL', WORKERS, fields[i])
    end
end
return missed
