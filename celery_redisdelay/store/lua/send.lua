-- send.lua: a call due now, tracked (redisdelay_track_due_now): stored and pushed onto its queue list in one step,
-- in flight with its queue deadline at once, as release.lua releases a call parked due now, without the wait in
-- the delay set. From here on it is a released call like any other: a worker holds it under a lease, the sweep
-- brings it back when its worker dies, and its acknowledgement forgets it.
-- The payload must be a broker message of this very call, its first delivery (tag '<id>.1'), and the metadata the
-- park form (meta_json: limits, list, then ',"d":0,"s":"delayed"}', no unique key), which in flight stands for
-- "queued, first delivery" (load_inflight_meta) as release.lua leaves it. Anything else is parked due now instead
-- and goes with the next release.
-- An id stored before (a retry of a running call with the same id sends its call again) gives up its key and the
-- slots it held, as store() does. The very same send again while its message waits (the same id, message and
-- metadata, in flight and not yet started: a client's retry after the reply to a send that landed was lost) pushes
-- nothing and counts nothing, as park.lua counts a park once: one message, one run. So does the same send again of a
-- call set aside on a pause.
-- KEYS[FIXED_KEYS + 1]: the queue list the message goes to (kombu's name, priority included).
-- ARGV: 1 id, 2 payload, 3 meta JSON, 4 default queue timeout (ms)
-- A call of a paused task or queue (see lib/pauses.lua) is stored and put aside on its pause, due now, instead
-- of pushed: it goes out when the pause ends.
-- Returns: {status, now}: status 1 pushed, 2 parked due now (not a message of this call, or paused)
-- requires: calls, clock, history, limits, message, meta, pauses, releases
local lists, wrong_list = list_keys(FIXED_KEYS + 1)
if wrong_list then
    return wrong_list
end
local id, payload, meta_json = ARGV[1], ARGV[2], ARGV[3]
local list = KEYS[FIXED_KEYS + 1]
local now = now_ms()
if not list or not message_for(id, payload, 1) or string.sub(meta_json, -#',"d":0,"s":"delayed"}') ~= ',"d":0,"s":"delayed"}'
        or string.find(meta_json, ',"k":', 1, true) then
    store(id, payload, meta_json, now)
    count('parked', 1)
    return {2, now}
end
local pauses = load_pauses(now)
if pauses and pauses.any_active then
    local ok, meta = pcall(cjson.decode, meta_json)
    local target = ok and type(meta) == 'table' and paused_target(pauses, meta.t, meta.l or list)
    if target then
        -- The very same send again, already set aside on this pause: its metadata is this one with the note.
        local raw = redis.call('HGET', META, id)
        local noted = raw and load_meta(id).pd
        if noted and raw == string.sub(meta_json, 1, -2) .. pause_note(target, tonumber(noted))
                and redis.call('ZSCORE', PAUSED, paused_member(target, tonumber(noted), id))
                and redis.call('HGET', PAYLOADS, id) == payload then
            return {2, now}
        end
        store(id, payload, meta_json, now)
        redis.call('ZREM', DELAYED, id)
        set_aside(target, now, id)
        count('parked', 1)
        return {2, now}
    end
end
if redis.call('HSETNX', META, id, meta_json) == 0 then
    if redis.call('HGET', META, id) == meta_json and redis.call('ZSCORE', INFLIGHT, id)
            and redis.call('HGET', PAYLOADS, id) == payload then
        return {1, now}
    end
    local before = load_meta(id)
    free_key(id, before)
    free_slots(id, before)
    redis.call('HSET', META, id, meta_json)
    redis.call('ZREM', DELAYED, id)
    redis.call('ZREM', DEAD, id)
end
redis.call('HSET', PAYLOADS, id, payload)
local queue_ms = tonumber(string.match(meta_json, ',"q":(%d+),')) or tonumber(ARGV[4])
redis.call('ZADD', INFLIGHT, now + queue_ms, id)
redis.call('LPUSH', list, payload)
count('parked', 1)
count_releases({id, now}, {}, now)
return {1, now}
