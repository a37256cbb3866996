-- release.lua: the fast release path. Take due calls; a call stored as a broker message (wire.py)
-- whose metadata names one of the queue lists in KEYS ("l") is pushed onto that list in this same
-- step and is in flight with its queue deadline at once. Its first delivery is pushed exactly as
-- stored (delivery tag '<id>.1'), a later one with the tag '<id>.<delivery>'. Any other call, and a
-- message without its own tag (not ours), is claimed for the generic path, as claim.lua does.
-- A first delivery leaves the metadata as the park wrote it: in flight, that form means "queued, first
-- delivery" (see load_inflight_meta), so the only writes per call are the moves and the push.
-- KEYS[FIXED_KEYS + 1 ..]: the queue lists this app's messages may go to (kombu's names, priorities included).
-- ARGV: 1 most calls to take, 2 claim timeout (ms), 3 default queue timeout (ms)
-- A due call under limits (meta.lg) goes to its gate instead (see lib/limits.lua); the gates that may
-- go now let their calls out, in due order, while their limits allow and the step has room left, and these
-- calls then go as any other.
-- A due call of a paused task or queue is moved aside instead (see lib/pauses.lua), once: it waits there, not in
-- the delay set, until its pause ends; the calls of ended pauses come back first, a step's worth at most.
-- Returns: {examined, pushed, now, next due, batch due, id, payload, deliveries, list, ...}: due ids looked at
-- (gated calls let out included), calls pushed, the server's time (ms), when the next thing is due (the
-- earliest call left in the delay set, a batch group's flush, or a gate's next look; '' when none) and 1 when a
-- batch group is due now (else 0), so that a precise releaser knows when to look again without asking; then
-- the calls claimed for the generic path. Due ids without payload are dead-lettered here.
-- requires: bulk, calls, clock, gates, history, lex, limits, message, meta, pauses, releases
local lists, wrong_list = list_keys(FIXED_KEYS + 1)
if wrong_list then
    return wrong_list
end

-- Where a first delivery goes, from its metadata as the park wrote it (the limits, the list, then
-- ',"d":0,"s":"delayed"}', no unique key): {list, queue timeout}, or false for the general case. Calls
-- of one task share their metadata text (and Lua shares equal strings), so each text is read once. ``fresh``:
-- the text is a gated call's metadata up to its gate (see gate_in), whose end was checked there.
local FIRST_TAG_END = '.1"}}'
local default_queue_ms = tonumber(ARGV[3])
local routes = {}
local function route_of(raw, fresh)
    local route = routes[raw]
    if route == nil then
        route = false
        if (fresh or string.sub(raw, -#FRESH) == FRESH) and not string.find(raw, ',"k":', 1, true) then
            local key = string.match(raw, ',"l":"([^"\\]*)",')
            if key and lists[key] then
                route = {key, tonumber(string.match(raw, ',"q":(%d+),')) or default_queue_ms}
            end
        end
        routes[raw] = route
    end
    return route
end

-- When a pause ends (its until) or has calls left to bring back (now); false for never.
local pause_next = false

-- What a releaser needs to know when to look again: when the earliest call left or batch group is due, and
-- whether a batch group is due now.
local function looked_again(out, now)
    local call = tonumber(redis.call('ZRANGE', DELAYED, 0, 0, 'WITHSCORES')[2])
    local group = tonumber(redis.call('ZRANGE', BATCHES, 0, 0, 'WITHSCORES')[2])
    local gate = tonumber(redis.call('ZRANGE', GATES, 0, 0, 'WITHSCORES')[2])
    local earliest = call
    if group and (not earliest or group < earliest) then
        earliest = group
    end
    if gate and (not earliest or gate < earliest) then
        earliest = gate
    end
    if pause_next and (not earliest or pause_next < earliest) then
        earliest = pause_next
    end
    out[4] = earliest and string.format('%d', earliest) or ''
    out[5] = (group and group <= now) and 1 or 0
    return out
end


local now = now_ms()
redis.call('HSET', HISTORY, 'released_at', string.format('%d', now))  -- a releaser ran (an alert watches it)
-- Paces in the past hold nothing back: a few are forgotten each step, once they are PACE_KEPT old, so that the
-- pace of a key in use is moved on where it is rather than dropped and written again.
local PACE_KEPT = 60000
local stale_paces = redis.call('ZRANGEBYSCORE', PACES, '-inf', now - PACE_KEPT, 'LIMIT', 0, 100)
if #stale_paces > 0 then
    redis.call('ZREM', PACES, unpack(stale_paces))
end
local most_calls = tonumber(ARGV[1])
local pauses = load_pauses(now)
if pauses then
    if drain_pauses(pauses, most_calls) > 0 then
        pause_next = now
    end
    pause_next = pause_next or pauses.next_end
end
local rows = redis.call('ZRANGEBYSCORE', DELAYED, '-inf', now, 'WITHSCORES', 'LIMIT', 0, most_calls)
local ids, dues = {}, {}
for i = 1, #rows, 2 do
    ids[#ids + 1] = rows[i]
    dues[#dues + 1] = rows[i + 1]
end
local out = {#ids, 0, now, '', 0}
local payloads = #ids > 0 and redis.call('HMGET', PAYLOADS, unpack(ids)) or {}
local raw_metas = #ids > 0 and redis.call('HMGET', META, unpack(ids)) or {}

-- Due calls under limits: a call whose gate has none waiting goes at once if its limits allow it (as any other
-- call, below); else it goes to its gate, behind the calls waiting there. The rest of the step lets gated
-- calls out.
local skipped, gated = {}, {}
-- Due calls of paused targets are moved aside first, and skipped from here on.
local paused = {}
if pauses and pauses.any_active then
    for i, id in ipairs(ids) do
        local raw = raw_metas[i]
        local target = payloads[i] and raw and paused_raw(pauses, raw)
        if target then
            set_aside(target, tonumber(dues[i]), id)
            paused[#paused + 1] = id
            skipped[i] = true
        end
    end
    if #paused > 0 then
        bulk('ZREM', DELAYED, paused)
    end
end
local gate_of, step_gates = {}, {}  -- the gate of each due call under limits; the gates, once each
for i = 1, #ids do
    local raw = raw_metas[i]
    if not skipped[i] and payloads[i] and raw and string.find(raw, ',"lg":', 1, true) then
        local gate = gate_in(raw)
        if gate then
            gate_of[i] = gate
            if not gate_limits_seen[gate] then
                step_gates[#step_gates + 1] = gate
            end
            gate_limits(gate)
        end
    end
end
read_limits(step_gates)
-- Whether each gate has calls waiting (none has when no gate is open: no need to ask).
local busy, any_gate = {}, redis.call('EXISTS', GATES) == 1
for i, id in ipairs(ids) do
    local raw = raw_metas[i]
    local gate = gate_of[i]
    if gate then
        local waiting = busy[gate]
        if waiting == nil and any_gate then
            waiting = redis.call('ZSCORE', GATES, gate) ~= false
            busy[gate] = waiting
        end
        local admitted, again = false, nil
        if not waiting then
            admitted, again = admit(gate, id, now)
        end
        if not admitted then
            local due = tonumber(dues[i])
            local ok, waiting = pcall(cjson.decode, raw)
            if not ok or type(waiting) ~= 'table' then
                waiting = {lg = gate}  -- damaged metadata must not stop the release; the gate is known
            end
            waiting.s, waiting.lw = 'limited', due
            save_meta(id, waiting)
            redis.call('ZADD', GATED, 0, gated_member(gate, due, id))
            if again then
                redis.call('ZADD', GATES, again, gate)
            else
                redis.call('ZADD', GATES, 'NX', now, gate)
            end
            busy[gate] = true
            gated[#gated + 1] = id
            skipped[i] = true
        end
    end
end
if #gated > 0 then
    redis.call('ZREM', DELAYED, unpack(gated))
    count('limited', #gated)
end
local released_rows = {}  -- gated calls let out: {id, due, ...}, for the lateness counts
local room = most_calls - #ids + #gated + #paused
if room > 0 then
    for _, gate in ipairs(redis.call('ZRANGEBYSCORE', GATES, '-inf', now, 'LIMIT', 0, room)) do
        local low, high = lex_range(gate)
        while room > 0 do
            local first = redis.call('ZRANGEBYLEX', GATED, low, high, 'LIMIT', 0, 1)[1]
            if not first then
                close_gate(gate)
                break
            end
            local due_text, id = string.match(string.sub(first, #gate + 2), '^(%d+)%z(.+)$')
            local admitted, again = false, nil
            -- A call of a paused target leaves its gate for its pause, its limits untouched.
            local raw = id and pauses and pauses.any_active and redis.call('HGET', META, id)
            local target = raw and paused_raw(pauses, raw)
            if target then
                redis.call('ZREM', GATED, first)
                local meta = load_meta(id)
                meta.s, meta.lw = 'delayed', nil
                save_meta(id, meta)
                set_aside(target, tonumber(due_text), id)
                room = room - 1
            elseif id then
                admitted, again = admit(gate, id, now)
            else
                redis.call('ZREM', GATED, first)  -- not written by this script: it names no call
                room = room - 1  -- looked at, so the step stays bounded
            end
            if not admitted and again then
                redis.call('ZADD', GATES, again, gate)
                break
            end
            if admitted then
                redis.call('ZREM', GATED, first)
                ids[#ids + 1] = id
                dues[#dues + 1] = due_text
                payloads[#ids] = redis.call('HGET', PAYLOADS, id)
                local meta = load_meta(id)
                meta.s, meta.lw = 'delayed', nil
                raw_metas[#ids] = cjson.encode(meta)
                released_rows[#released_rows + 1] = id
                released_rows[#released_rows + 1] = tonumber(due_text)
                room = room - 1
            end
        end
        if room == 0 then
            break
        end
    end
end
out[1] = #ids
write_limits()
if #ids == #gated + #paused then
    return looked_again(out, now)
end
local claim_deadline = now + tonumber(ARGV[2])
local taken, deadlines, metas, pushes, buried = {}, {}, {}, {}, {}
local pushed = 0

local function push(key, message)
    local list = pushes[key]
    if not list then
        list = {}
        pushes[key] = list
    end
    list[#list + 1] = message
    pushed = pushed + 1
end

for i, id in ipairs(ids) do
    local payload, raw = payloads[i], raw_metas[i]
    local before_gate = ungated[raw]
    local route = payload and raw and not skipped[i] and route_of(before_gate or raw, before_gate ~= nil)
    -- A broker message of this very call: it starts as kombu's do and ends with its own first tag, the
    -- id whole between the tag's opening quote (byte 34) and '.1"}}' (as message_for checks, without
    -- building the string).
    if skipped[i] then
        -- in its gate
    elseif route and string.sub(payload, 1, #MESSAGE_PREFIX) == MESSAGE_PREFIX and string.sub(payload, -5) == FIRST_TAG_END
        and string.find(payload, id, -(#id + 5), true) and string.byte(payload, -(#id + 6)) == 34 then
        taken[#taken + 1] = id
        push(route[1], payload)
        local deadline = route[3]
        if deadline == nil then
            -- The same deadline for every call of a route, as text once: ZADD would format the number
            -- again for each call (about a fifth of what the ZADD costs).
            deadline = string.format('%d', now + route[2])
            route[3] = deadline
        end
        deadlines[#deadlines + 1] = deadline
        deadlines[#deadlines + 1] = id
    elseif not payload then
        bury(id, load_meta(id), 'payload missing at release', now)
        buried[i] = true
    else
        local ok, meta = pcall(cjson.decode, raw or '{}')
        if not ok or type(meta) ~= 'table' then
            meta = {}  -- corrupt metadata must not stop the release
        end
        taken[#taken + 1] = id
        free_key(id, meta)
        meta.d = (tonumber(meta.d) or 0) + 1
        local key = meta.l
        local message = type(key) == 'string' and lists[key] and message_for(id, payload, meta.d)
        local deadline
        if message then
            meta.s = 'queued'
            deadline = now + (tonumber(meta.q) or default_queue_ms)
            push(key, message)
        else
            meta.s = 'claimed'
            deadline = claim_deadline
            out[#out + 1] = id
            out[#out + 1] = payload
            out[#out + 1] = meta.d
            out[#out + 1] = type(key) == 'string' and key or ''
        end
        deadlines[#deadlines + 1] = deadline
        deadlines[#deadlines + 1] = id
        local encoded
        ok, encoded = pcall(cjson.encode, meta)
        metas[#metas + 1] = id
        metas[#metas + 1] = ok and encoded or cjson.encode({d = meta.d, s = meta.s})
    end
end
if #taken > 0 then
    bulk('ZREM', DELAYED, taken)
    bulk('ZADD', INFLIGHT, deadlines)
    if #metas > 0 then
        bulk('HSET', META, metas)
    end
    for key, messages in pairs(pushes) do
        bulk('LPUSH', key, messages)
    end
end
-- Lateness is counted for the calls that left: gated ones when they leave their gate (their wait in it
-- included), from their due time.
for i in pairs(skipped) do
    buried[i] = true
end
count_releases(rows, buried, now)
if #released_rows > 0 then
    local let_out, offset = {}, #rows / 2
    for i = 1, #released_rows, 2 do
        if not buried[offset + (i + 1) / 2] then
            let_out[#let_out + 1] = released_rows[i]
            let_out[#let_out + 1] = released_rows[i + 1]
        end
    end
    count_releases(let_out, {}, now, true)
end
out[2] = pushed
return looked_again(out, now)
