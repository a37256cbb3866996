-- prelude.lua: helpers prepended to every script of the call store.
--
-- Every script of the store receives the same five keys, all sharing one hash tag:
--   KEYS[1] delayed   zset  id -> due time (ms since the epoch, server clock)
--   KEYS[2] inflight  zset  id -> deadline (ms)
--   KEYS[3] dead      zset  id -> time it was dead-lettered (ms)
--   KEYS[4] payloads  hash  id -> envelope (opaque to Lua)
--   KEYS[5] meta      hash  id -> small JSON object:
--       d deliveries, m max deliveries, r run timeout (ms), q queue timeout (ms),
--       s state (delayed | claimed | queued | running | swept | dead), why (dead reason)

local DELAYED, INFLIGHT, DEAD, PAYLOADS, META = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local EXPECTED_TYPES = {'zset', 'zset', 'zset', 'hash', 'hash'}

-- Refuse to run on keys someone else overwrote: an error here happens before any write.
for i, expected in ipairs(EXPECTED_TYPES) do
    local found = redis.call('TYPE', KEYS[i])['ok']
    if found ~= 'none' and found ~= expected then
        return redis.error_reply('WRONGTYPE redisdelay key ' .. KEYS[i] .. ' holds a ' .. found
            .. ', expected a ' .. expected .. '; delete or rename it')
    end
end

local function now_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Corrupt metadata must not stop a loop: it decodes to an empty table. (A table that cannot be
-- encoded again, say a number out of range, would make save_meta fail the whole script.)
local function load_meta(id)
    local raw = redis.call('HGET', META, id)
    if not raw then
        return {}
    end
    local ok, meta = pcall(cjson.decode, raw)
    if ok and type(meta) == 'table' and pcall(cjson.encode, meta) then
        return meta
    end
    return {}
end

local function save_meta(id, meta)
    redis.call('HSET', META, id, cjson.encode(meta))
end

-- Move a call to the dead-letter set, keeping its payload for inspection and requeue.
local function bury(id, meta, why, now)
    redis.call('ZREM', DELAYED, id)
    redis.call('ZREM', INFLIGHT, id)
    meta.s = 'dead'
    meta.why = why
    save_meta(id, meta)
    redis.call('ZADD', DEAD, now, id)
end

local function forget(id)
    redis.call('HDEL', PAYLOADS, id)
    redis.call('HDEL', META, id)
end
