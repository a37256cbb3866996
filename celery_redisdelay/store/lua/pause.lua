-- pause.lua: pause and resume a task or a queue on this shard, and hold a call a worker received while its target is
-- paused (see lib/pauses.lua). Run by CallStore's pause methods (store/pauses.py), not by STORE_SCRIPTS.
-- ARGV: 1 op, then
--   pause: 2 target, 3 kind ('task' or 'queue'), 4 name, 5 duration (ms; '' for until resumed), 6 reason, 7.. a queue's
--          lists. A target paused already keeps its since; its until becomes the new one, and its reason the new one
--          unless that is ''. Returns {since, until or ''}.
--   resume: 2 target. The pause ends: its calls go back with the next releases. Returns 1 if it was paused, else 0.
--   hold: 2 id, 3 worker, 4 the delivery's number (0: not known). A worker received a delivery of a call in flight whose target is paused (its message is then
--          acknowledged, not run): the call leaves flight for its pause, due now, and goes out again (a later delivery)
--          when the pause ends. Returns 1 held, 0 not in flight here or held by another worker, -1 not paused (run it).
-- requires: clock, lex, limits, meta, pauses, wake
local op = ARGV[1]
local now = now_ms()
if op == 'pause' then
    local target, kind, name, duration, reason = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
    local since, old_reason = now, nil
    local ok, before = pcall(cjson.decode, redis.call('HGET', PAUSES, target) or '')
    if ok and type(before) == 'table' and not before.r and not (tonumber(before.u) and tonumber(before.u) <= now) then
        since = tonumber(before.s) or now
        old_reason = before.why
    end
    local record = {k = kind, n = name, s = since, why = reason}
    if reason == '' and type(old_reason) == 'string' then
        record.why = old_reason
    end
    if duration ~= '' then
        record.u = now + tonumber(duration)
    end
    if #ARGV >= 7 then
        record.ls = {unpack(ARGV, 7)}
    end
    redis.call('HSET', PAUSES, target, cjson.encode(record))
    return {since, record.u or ''}
elseif op == 'resume' then
    local target = ARGV[2]
    local raw = redis.call('HGET', PAUSES, target)
    local ok, record = pcall(cjson.decode, raw or '')
    local was = raw ~= false and ok and type(record) == 'table' and not record.r
        and not (tonumber(record.u) and tonumber(record.u) <= now)
    local low, high = lex_range(target)
    if #redis.call('ZRANGEBYLEX', PAUSED, low, high, 'LIMIT', 0, 1) == 0 then
        redis.call('HDEL', PAUSES, target)  -- nothing waits on it: forgotten at once
    else
        -- Its calls go back with the next releases (release.lua), which forget the record once none is left.
        if not ok or type(record) ~= 'table' then
            record = {}
        end
        record.r = 1
        redis.call('HSET', PAUSES, target, cjson.encode(record))
        wake_releasers(now)
    end
    return was and 1 or 0
elseif op == 'hold' then
    local id, worker, n = ARGV[2], ARGV[3], tonumber(ARGV[4]) or 0
    local meta, score = nil, redis.call('ZSCORE', INFLIGHT, id)
    if score then
        meta = load_inflight_meta(id)
    else
        -- The sweep may have put the call back, its delivery still on its way (a late one; its start would take it back).
        meta = load_meta(id)
        if meta.s ~= 'swept' or not redis.call('ZSCORE', DELAYED, id) then
            return 0
        end
    end
    if (meta.h ~= nil and meta.h ~= worker) or (n > 0 and (tonumber(meta.d) or 0) ~= n) then
        return 0  -- another worker's, or not this delivery's (a copy of an older one: stale, see delivery.lua)
    end
    local pauses = load_pauses(now)
    local target = pauses and paused_target(pauses, meta.t, meta.l)
    if not target then
        return -1
    end
    redis.call('ZREM', score and INFLIGHT or DELAYED, id)
    free_slots(id, meta)
    unheld(meta)
    meta.s, meta.b = 'paused', nil
    save_meta(id, meta)
    set_aside(target, now, id)
    return 1
end
return redis.error_reply('ERR pause.lua: unknown op ' .. tostring(op))
