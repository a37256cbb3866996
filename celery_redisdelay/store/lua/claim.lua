-- claim.lua: take due calls for publishing. A claimed call is in flight with a short deadline,
-- so a releaser that dies before publishing loses nothing: the sweep brings the call back.
-- ARGV: 1 most calls to take, 2 claim timeout (ms)
-- A due call of a paused task or queue is moved aside instead (see lib/pauses.lua), and the calls of ended
-- pauses come back first, as release.lua does.
-- Returns: {examined, id, envelope, deliveries, list, ...}: how many due ids the
-- script looked at, then the claimed calls. A due id without an envelope is dead-lettered here and
-- not returned, so fewer calls than examined ids does not mean the backlog is empty.
-- requires: calls, clock, meta, pauses, releases
local now = now_ms()
local pauses = load_pauses(now)
if pauses then
    drain_pauses(pauses, tonumber(ARGV[1]))
end
local active = pauses and pauses.any_active and pauses
local rows = redis.call('ZRANGEBYSCORE', DELAYED, '-inf', now, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[1]))
local deadline = now + tonumber(ARGV[2])
local out = {#rows / 2}
local buried = {}
for i = 1, #rows, 2 do
    local id = rows[i]
    local meta = load_meta(id)
    local envelope = redis.call('HGET', PAYLOADS, id)
    local target = envelope and active and paused_target(active, meta.t, meta.l)
    if target then
        redis.call('ZREM', DELAYED, id)
        set_aside(target, tonumber(rows[i + 1]), id)
        buried[(i + 1) / 2] = true  -- not released
    elseif not envelope then
        bury(id, meta, 'payload missing at release', now)
        buried[(i + 1) / 2] = true
    else
        redis.call('ZREM', DELAYED, id)
        free_key(id, meta)
        meta.d = (tonumber(meta.d) or 0) + 1
        meta.s = 'claimed'
        save_meta(id, meta)
        redis.call('ZADD', INFLIGHT, deadline, id)
        out[#out + 1] = id
        out[#out + 1] = envelope
        out[#out + 1] = meta.d
        out[#out + 1] = type(meta.l) == 'string' and meta.l or ''
    end
end
count_releases(rows, buried, now)
return out
