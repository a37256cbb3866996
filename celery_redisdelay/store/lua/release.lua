-- release.lua: the fast release path. Take due calls; a call stored as a broker message (wire.py)
-- whose metadata names one of the queue lists in KEYS ("l") is pushed onto that list in this same
-- step and is in flight with its queue deadline at once. Its first delivery is pushed exactly as
-- stored (delivery tag '<id>.1'), a later one with the tag '<id>.<delivery>'. Any other call, and a
-- message without its own tag (not ours), is claimed for the generic path, as claim.lua does.
-- A first delivery leaves the metadata as the park wrote it: in flight, that form means "queued, first
-- delivery" (see load_inflight_meta), so the only writes per call are the moves and the push.
-- KEYS[11..]: the queue lists this app's messages may go to (kombu's names, priorities included).
-- ARGV: 1 most calls to take, 2 claim timeout (ms), 3 default queue timeout (ms)
-- Returns: {examined, pushed, now, next due, batch due, id, payload, deliveries, list, ...}: due ids looked at,
-- calls pushed, the server's time (ms), when the next thing is due (the earliest call left in the delay set, or
-- a batch group's flush; '' when none) and 1 when a batch group is due now (else 0), so that a precise releaser
-- knows when to look again without asking; then the calls claimed for the generic path. Due ids without
-- payload are dead-lettered here.
local lists = {}
for i = 11, #KEYS do
    local wrong = check_type(KEYS[i], 'list')
    if wrong then
        return wrong
    end
    lists[KEYS[i]] = true
end

-- A later delivery says so (wire.py's ``redelivered``, byte for byte): "redelivered" and "x-delivery-count" (the
-- deliveries before it) at the start of the headers, "redelivered" at the start of delivery_info, the last
-- object opened in the message.
local HEADERS, DELIVERY_INFO = '"headers": {', '"delivery_info": {'
local function redelivered(message, earlier)
    local head = string.find(message, HEADERS, 1, true)
    local info, from = nil, 1
    while true do
        local found = string.find(message, DELIVERY_INFO, from, true)
        if not found then
            break
        end
        info, from = found, found + 1
    end
    if not head or not info or info < head then
        return message
    end
    local head_end, info_end = head + #HEADERS - 1, info + #DELIVERY_INFO - 1
    local marks = '"redelivered": true, "x-delivery-count": ' .. string.format('%d', earlier)
    if string.sub(message, head_end + 1, head_end + 1) ~= '}' then
        marks = marks .. ', '
    end
    local flag = '"redelivered": true'
    if string.sub(message, info_end + 1, info_end + 1) ~= '}' then
        flag = flag .. ', '
    end
    return string.sub(message, 1, head_end) .. marks .. string.sub(message, head_end + 1, info_end) .. flag
        .. string.sub(message, info_end + 1)
end

-- The message to push for this delivery, or nil when the payload is not a broker message of this call.
-- wire.py writes the delivery tag of the first delivery last: the message ends with it.
local function message_for(id, payload, delivery)
    local ending = '"delivery_tag": "' .. id .. '.1"}}'
    if string.sub(payload, 1, #MESSAGE_PREFIX) ~= MESSAGE_PREFIX or string.sub(payload, -#ending) ~= ending then
        return nil
    elseif delivery == 1 then
        return payload
    end
    local tagged = string.sub(payload, 1, -#ending - 1) .. '"delivery_tag": "' .. id .. '.' .. delivery .. '"}}'
    return redelivered(tagged, delivery - 1)
end

-- Where a first delivery goes, from its metadata as the park wrote it (the limits, the list, then
-- ',"d":0,"s":"delayed"}', no unique key): {list, queue timeout}, or false for the general case. Calls
-- of one task share their metadata text (and Lua shares equal strings), so each text is read once.
local FRESH = ',"d":0,"s":"delayed"}'
local FIRST_TAG_END = '.1"}}'
local default_queue_ms = tonumber(ARGV[3])
local routes = {}
local function route_of(raw)
    local route = routes[raw]
    if route == nil then
        route = false
        if string.sub(raw, -#FRESH) == FRESH and not string.find(raw, ',"k":', 1, true) then
            local key = string.match(raw, ',"l":"([^"\\]*)",')
            if key and lists[key] then
                route = {key, tonumber(string.match(raw, ',"q":(%d+),')) or default_queue_ms}
            end
        end
        routes[raw] = route
    end
    return route
end

-- Run a command with many arguments in chunks (Lua's unpack has a limit).
local function bulk(command, key, args)
    for i = 1, #args, 1000 do
        redis.call(command, key, unpack(args, i, math.min(i + 999, #args)))
    end
end

-- What a releaser needs to know when to look again: when the earliest call left or batch group is due, and
-- whether a batch group is due now.
local function looked_again(out, now)
    local call = tonumber(redis.call('ZRANGE', DELAYED, 0, 0, 'WITHSCORES')[2])
    local group = tonumber(redis.call('ZRANGE', BATCHES, 0, 0, 'WITHSCORES')[2])
    local earliest = call
    if group and (not earliest or group < earliest) then
        earliest = group
    end
    out[4] = earliest and string.format('%d', earliest) or ''
    out[5] = (group and group <= now) and 1 or 0
    return out
end

local now = now_ms()
redis.call('HSET', HISTORY, 'released_at', string.format('%d', now))  -- a releaser ran (an alert watches it)
local rows = redis.call('ZRANGEBYSCORE', DELAYED, '-inf', now, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[1]))
local ids = {}
for i = 1, #rows, 2 do
    ids[#ids + 1] = rows[i]
end
local out = {#ids, 0, now, '', 0}
if #ids == 0 then
    return looked_again(out, now)
end
local claim_deadline = now + tonumber(ARGV[2])
local payloads = redis.call('HMGET', PAYLOADS, unpack(ids))
local raw_metas = redis.call('HMGET', META, unpack(ids))
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
    local route = payload and raw and route_of(raw)
    -- A broker message of this very call: it starts as kombu's do and ends with its own first tag, the
    -- id whole between the tag's opening quote (byte 34) and '.1"}}' (as message_for checks, without
    -- building the string).
    if route and string.sub(payload, 1, #MESSAGE_PREFIX) == MESSAGE_PREFIX and string.sub(payload, -5) == FIRST_TAG_END
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
count_releases(rows, buried, now)
out[2] = pushed
return looked_again(out, now)
