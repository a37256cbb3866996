-- release.lua: the fast release path. Take due calls; a call stored as a broker message (wire.py)
-- for one of the queue lists in KEYS is pushed onto that list in this same step and is in flight
-- with its queue deadline at once. Any other call is claimed for the generic path, as claim.lua does.
-- KEYS[10..]: the queue lists this app's messages may go to (kombu's names, priorities included).
-- ARGV: 1 most calls to take, 2 claim timeout (ms), 3 default queue timeout (ms)
-- Returns: {examined, pushed, id, payload, deliveries, ...}: due ids looked at, calls pushed, then the
-- calls claimed for the generic path. Due ids without payload are dead-lettered here.
local lists = {}
for i = 10, #KEYS do
    local wrong = check_type(KEYS[i], 'list')
    if wrong then
        return wrong
    end
    lists[KEYS[i]] = true
end

-- 'RDW1:<len>:<key><len>:<head><tail>' -> key, head, tail (nil when malformed).
local function split(payload)
    local colon = string.find(payload, ':', 6, true)
    local key_len = colon and tonumber(string.sub(payload, 6, colon - 1))
    if not key_len then
        return nil
    end
    local key = string.sub(payload, colon + 1, colon + key_len)
    local rest = colon + key_len + 1
    colon = string.find(payload, ':', rest, true)
    local head_len = colon and tonumber(string.sub(payload, rest, colon - 1))
    if not head_len or colon + head_len > #payload then
        return nil
    end
    return key, string.sub(payload, colon + 1, colon + head_len), string.sub(payload, colon + head_len + 1)
end

-- Run a command with many arguments in chunks (Lua's unpack has a limit).
local function bulk(command, key, args)
    for i = 1, #args, 1000 do
        redis.call(command, key, unpack(args, i, math.min(i + 999, #args)))
    end
end

local now = now_ms()
local ids = redis.call('ZRANGEBYSCORE', DELAYED, '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local out = {#ids, 0}
if #ids == 0 then
    return out
end
local claim_deadline = now + tonumber(ARGV[2])
local default_queue_ms = tonumber(ARGV[3])
local payloads = redis.call('HMGET', PAYLOADS, unpack(ids))
local raw_metas = redis.call('HMGET', META, unpack(ids))
local taken, deadlines, metas, pushes = {}, {}, {}, {}
local pushed = 0
for i, id in ipairs(ids) do
    local ok, meta = pcall(cjson.decode, raw_metas[i] or '{}')
    if not ok or type(meta) ~= 'table' then
        meta = {}  -- corrupt metadata must not stop the release
    end
    local payload = payloads[i]
    if not payload then
        bury(id, load_meta(id), 'payload missing at release', now)
    else
        taken[#taken + 1] = id
        free_key(id, meta)
        meta.d = (tonumber(meta.d) or 0) + 1
        local key, head, tail
        if string.sub(payload, 1, 5) == 'RDW1:' then
            key, head, tail = split(payload)
        end
        local deadline
        if key and lists[key] then
            meta.s = 'queued'
            deadline = now + (tonumber(meta.q) or default_queue_ms)
            local list = pushes[key]
            if not list then
                list = {}
                pushes[key] = list
            end
            list[#list + 1] = head .. id .. '.' .. meta.d .. tail
            pushed = pushed + 1
        else
            meta.s = 'claimed'
            deadline = claim_deadline
            out[#out + 1] = id
            out[#out + 1] = payload
            out[#out + 1] = meta.d
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
out[2] = pushed
return out
