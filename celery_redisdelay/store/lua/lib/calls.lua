-- calls.lua: A call's life in the store: stored, buried, revived, forgotten.
-- requires: history, limits, meta, wake

-- A parked call gives up its unique/debounce key when it leaves the delay set (released,
-- cancelled, dead-lettered), so a new call with that key can be parked.
local function free_key(id, meta)
    if type(meta.k) == 'string' and redis.call('HGET', INDEX, meta.k) == id then
        redis.call('HDEL', INDEX, meta.k)
    end
end

-- Move a call to the dead-letter set, keeping its payload for inspection and requeue.
-- ``ms`` (since the epoch) as UTC ISO 8601 text, to the millisecond: the civil date of a day count (H. Hinnant's

local function bury(id, meta, why, now)
    count('dead_lettered', 1)
    free_key(id, meta)
    free_slots(id, meta)
    redis.call('ZREM', DELAYED, id)
    redis.call('ZREM', INFLIGHT, id)
    meta.s = 'dead'
    meta.why = why
    unheld(meta)
    save_meta(id, meta)
    redis.call('ZADD', DEAD, now, id)
end

-- Give a dead-lettered call a fresh start, due at ``now`` (its payload is there: the caller checked).
local function revive(id, now)
    local meta = load_meta(id)
    meta.d = 0
    meta.s = 'delayed'
    meta.why, meta.c, meta.st = nil, nil, nil
    save_meta(id, meta)
    redis.call('ZREM', DEAD, id)
    redis.call('ZADD', DELAYED, now, id)
end

local function forget(id, meta)
    meta = meta or load_meta(id)
    free_key(id, meta)
    free_slots(id, meta)
    redis.call('HDEL', PAYLOADS, id)
    redis.call('HDEL', META, id)
end

-- The id of the call parked under a unique/debounce key, or nil when no parked call holds it.
local function holder(key)
    local id = redis.call('HGET', INDEX, key)
    if id and redis.call('ZSCORE', DELAYED, id) then
        return id
    end
    return nil
end

-- Store a call and put it in the delay set, due at ``due``.
local function store(id, envelope, meta_json, due)
    if redis.call('HSETNX', META, id, meta_json) == 0 then
        -- An id parked before (a retry parks its call again): it gives up the key and the slots it held.
        local before = load_meta(id)
        free_key(id, before)
        free_slots(id, before)
        redis.call('HSET', META, id, meta_json)
    end
    redis.call('HSET', PAYLOADS, id, envelope)
    redis.call('ZREM', INFLIGHT, id)
    redis.call('ZREM', DEAD, id)
    mark_if_earliest(due, id)
    redis.call('ZADD', DELAYED, due, id)
end

-- Turn the first ``size`` items of a batch group into one parked call, due now. The payload is a
-- stub the releaser turns into the task's message: the group ([task, key], JSON) and the items, each
-- already JSON. Returns how many items went into the call.
local function flush_group(items_key, group, size, id, meta_json, now)
    local items = redis.call('LRANGE', items_key, 0, size - 1)
    if #items > 0 then
        redis.call('LTRIM', items_key, #items, -1)
        local payload = BATCH_PREFIX .. ',"group":' .. group .. ',"items":[' .. table.concat(items, ',') .. ']}'
        store(id, payload, meta_json, now)
        redis.call('HINCRBY', COUNTERS, 'batch_items', -#items)
        redis.call('HINCRBY', COUNTERS, 'batches_flushed', 1)
        count('parked', 1)
    end
    if redis.call('LLEN', items_key) == 0 then
        redis.call('ZREM', BATCHES, group)
    else
        redis.call('ZADD', BATCHES, now, group)  -- more than one batch was waiting: flush the rest next
    end
    return #items
end

-- A lock's line of waiters (KEYS[12] of the lock scripts) became empty: one lock fewer with waiters.
-- Lines that were already waiting before the count was kept are not in it, so it never goes below 0.
local function line_emptied(waiters)
    if redis.call('EXISTS', waiters) == 0 and tonumber(redis.call('HGET', COUNTERS, 'lock_lines') or '0') > 0 then
        redis.call('HINCRBY', COUNTERS, 'lock_lines', -1)
    end
end
