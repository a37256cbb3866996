-- release.lua: the fast release path. Take due calls; a call stored as a broker message (wire.py)
-- whose metadata names one of the queue lists in KEYS ("l") is pushed onto that list in this same
-- step and is in flight with its queue deadline at once. Its first delivery is pushed exactly as
-- stored (delivery tag '<id>.1'), a later one with the tag '<id>.<delivery>'. Any other call, and a
-- message without its own tag (not ours), is claimed for the generic path, as claim.lua does.
-- KEYS[10..]: the queue lists this app's messages may go to (kombu's names, priorities included).
-- ARGV: 1 most calls to take, 2 claim timeout (ms), 3 default queue timeout (ms)
-- Returns: {examined, pushed, id, payload, deliveries, list, ...}: due ids looked at, calls pushed, then the
-- calls claimed for the generic path. Due ids without payload are dead-lettered here.
local lists = {}
for i = 10, #KEYS do
    local wrong = check_type(KEYS[i], 'list')
    if wrong then
        return wrong
    end
    lists[KEYS[i]] = true
end

-- The message to push for this delivery, or nil when the payload is not a broker message of this call.
-- wire.py writes the delivery tag of the first delivery last: the message ends with it.
local function message_for(id, payload, delivery)
    local ending = '"delivery_tag": "' .. id .. '.1"}}'
    if string.sub(payload, 1, 10) ~= '{"body": "' or string.sub(payload, -#ending) ~= ending then
        return nil
    elseif delivery == 1 then
        return payload
    end
    return string.sub(payload, 1, -#ending - 1) .. '"delivery_tag": "' .. id .. '.' .. delivery .. '"}}'
end

-- Run a command with many arguments in chunks (Lua's unpack has a limit).
local function bulk(command, key, args)
    for i = 1, #args, 1000 do
        redis.call(command, key, unpack(args, i, math.min(i + 999, #args)))
    end
end

local now = now_ms()
local rows = redis.call('ZRANGEBYSCORE', DELAYED, '-inf', now, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[1]))
local ids = {}
for i = 1, #rows, 2 do
    ids[#ids + 1] = rows[i]
end
local out = {#ids, 0}
if #ids == 0 then
    return out
end
local claim_deadline = now + tonumber(ARGV[2])
local default_queue_ms = tonumber(ARGV[3])
local payloads = redis.call('HMGET', PAYLOADS, unpack(ids))
local raw_metas = redis.call('HMGET', META, unpack(ids))
local taken, deadlines, metas, pushes, buried = {}, {}, {}, {}, {}
local pushed = 0
-- The common case, without decoding JSON: the first delivery of a call whose metadata is exactly as
-- the park wrote it (limits, the list, then ',"d":0,"s":"delayed"}'; no unique key). Returns the list,
-- the new metadata and the queue timeout, or nil for the general case below.
local FRESH = ',"d":0,"s":"delayed"}'
local function first_delivery(raw)
    if not raw or string.sub(raw, -#FRESH) ~= FRESH or string.find(raw, ',"k":', 1, true) then
        return nil
    end
    local key = string.match(raw, ',"l":"([^"\\]*)",')
    if not key or not lists[key] then
        return nil
    end
    local queue_ms = tonumber(string.match(raw, ',"q":(%d+),')) or default_queue_ms
    return key, string.sub(raw, 1, -#FRESH - 1) .. ',"d":1,"s":"queued"}', queue_ms
end

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
    local payload = payloads[i]
    local fresh_key, fresh_meta, queue_ms
    if payload then
        fresh_key, fresh_meta, queue_ms = first_delivery(raw_metas[i])
    end
    local message = fresh_key and message_for(id, payload, 1)
    if message then
        taken[#taken + 1] = id
        push(fresh_key, message)
        deadlines[#deadlines + 1] = now + queue_ms
        deadlines[#deadlines + 1] = id
        metas[#metas + 1] = id
        metas[#metas + 1] = fresh_meta
    elseif not payload then
        bury(id, load_meta(id), 'payload missing at release', now)
        buried[i] = true
    else
        local ok, meta = pcall(cjson.decode, raw_metas[i] or '{}')
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
    bulk('HSET', META, metas)
    for key, messages in pairs(pushes) do
        bulk('LPUSH', key, messages)
    end
end
count_releases(rows, buried, now)
out[2] = pushed
return out
