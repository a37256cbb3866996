-- sweep.lua: calls in flight past their deadline go back to the delay set, due at once,
-- or to the dead-letter set once they have been delivered max-deliveries times. Each tick's sweep also
-- forgets the history's oldest minutes (a few at most).
-- A call a worker held under a lease (lease.lua) is free for any worker again; where the broker is this
-- Redis, the delivery that worker held (its kombu delivery tag, meta.g) leaves kombu's unacked hash and
-- index, so kombu does not restore it after its visibility timeout: the delivery the sweep schedules stands
-- for it.
-- Where the broker is this Redis, the sweep also takes back the calls a worker popped but never held.
-- * Popped and noted: kombu noted the delivery in its unacked index (scored with the time the worker popped
--   it, by the worker's clock) and the worker died before its lease thread took the call, a few milliseconds
--   later. Each sweep reads the index onwards from where the last one stopped ('unacked_seen' in the history
--   hash), up to a lease ago, at most NEVER_HELD_STEP entries: every delivery is looked at once, a lease after
--   it was popped. A delivery of a call still queued and held by no one is swept like a lapsed lease: a
--   delivery of this store's own (tag '<id>.<delivery>', release.lua) if it is the call's current one, a
--   delivery kombu tagged itself (a call published through kombu, such as a flushed batch) by the task id in
--   its headers. A worker whose clock is more than a lease behind the server's pops deliveries the cursor has
--   passed: they wait for the queue timeout, as before.
-- * Popped, never noted: the worker died between its pop and kombu's note (its BRPOP's reply was still
--   unread in its socket). Nothing but the store knows the call then. Each sweep reads the calls in flight
--   whose queue deadline says they were pushed a lease ago or more, onwards from 'queued_seen' (a score:
--   every call at or below it has been looked at), at most QUEUED_STEP of them. A call still queued, held by
--   no one, pushed by release.lua onto one of the lists in KEYS, whose delivery kombu has not noted, is looked
--   for in its list from the oldest end (LPOS over a list of at most LIST_SCAN entries, SCAN_BUDGET entries a
--   sweep in all): a call in neither place has been popped. A longer list is not looked through: it drains from
--   its oldest end, so a call pushed before the oldest message still in it (one of this store's, at its call's
--   current delivery, still queued) has been popped; one pushed with it or after it may still be there. A popped
--   call is swept once it has been found in neither place, and in no worker's hands, for a whole lease (meta.mi:
--   when it was first missed, at delivery meta.md): its worker takes it a moment after its pop, or at its next
--   renewal, so one that did not was lost with its worker. (Swept when first missed, a call a busy worker had
--   just popped, its take still on the way, ran twice: a backlog older than a lease made that likely.) A call
--   still in its list, or in a list too long to tell, holds the cursor before it, so that it is looked at again by
--   the next sweeps (the list drains in order) until it is RECHECK_LEASES leases old: the cursor then passes it,
--   and it waits for the queue timeout if it is lost later; a call missed holds it until it is taken or swept.
--   The calls after it in the page are still looked at.
--   Calls pushed through kombu, and calls a warm shutdown gave back (meta.b: kombu put them back in its own
--   form), cannot be looked for in a list, and wait for the queue timeout.
-- KEYS[FIXED_KEYS + 1], KEYS[FIXED_KEYS + 2] (where the broker is this Redis): kombu's unacked hash and its index;
-- KEYS[FIXED_KEYS + 3 ..]: the queue lists release.lua pushes onto.
-- ARGV: 1 most calls to look at, 2 default max deliveries, 3 the lease (ms; with KEYS[FIXED_KEYS + 1]),
-- 4 the default queue timeout (ms; with the lists)
-- Returns: {calls put back, calls dead-lettered}.
-- requires: calls, clock, history, limits, message, meta, wake
local UNACKED, UNACKED_INDEX = KEYS[FIXED_KEYS + 1], KEYS[FIXED_KEYS + 2]
if UNACKED then
    local wrong = check_type(UNACKED, 'hash') or check_type(UNACKED_INDEX, 'zset')
    if wrong then
        return wrong
    end
end
local queue_lists, wrong_list = list_keys(FIXED_KEYS + 3)
if wrong_list then
    return wrong_list
end
local NEVER_HELD_STEP, QUEUED_STEP, LIST_SCAN, SCAN_BUDGET, RECHECK_LEASES = 500, 100, 1000, 10000, 10
local now = now_ms()
local requeued, buried = 0, 0

-- Back to the delay set, due now, or to the dead-letter set: out of deliveries, or a run cut short with its worker
-- whose task runs at most once past its start (meta.c, see start_call): Celery had acknowledged that message, and
-- would not run it again; neither does the sweep, but it keeps the call, saying what happened.
local function sweep_call(id, meta)
    local deliveries = tonumber(meta.d) or 0
    local limit = tonumber(meta.m) or tonumber(ARGV[2])
    if UNACKED and type(meta.g) == 'string' then
        redis.call('HDEL', UNACKED, meta.g)
        redis.call('ZREM', UNACKED_INDEX, meta.g)
    end
    if redis.call('HEXISTS', PAYLOADS, id) == 0 then
        bury(id, meta, 'payload missing at sweep', now)
        buried = buried + 1
    elseif meta.s == 'running' and meta.c then
        local started = tonumber(meta.st)
        bury(id, meta, 'worker lost: the run of delivery ' .. deliveries .. ' that started on '
            .. tostring(meta.h or 'a worker') .. (started and (' at ' .. utc_text(started)) or '') .. ' had not'
            .. ' reported its end when its worker was lost; its task runs a call at most once past its start'
            .. ' (redisdelay_worker_lost), so it is not run again: check whether the run did its work, then requeue'
            .. ' it to run it again', now)
        count('worker_lost', 1)
        buried = buried + 1
    elseif limit > 0 and deliveries >= limit then
        bury(id, meta, 'not acknowledged after ' .. deliveries .. ' deliveries (last seen ' .. tostring(meta.s) .. ')', now)
        buried = buried + 1
    else
        redis.call('ZREM', INFLIGHT, id)
        meta.s, meta.b, meta.mi, meta.md = 'swept', nil, nil, nil
        unheld(meta)
        free_slots(id, meta)
        save_meta(id, meta)
        redis.call('ZADD', DELAYED, now, id)
        requeued = requeued + 1
    end
end

local ids = redis.call('ZRANGEBYSCORE', INFLIGHT, '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, id in ipairs(ids) do
    sweep_call(id, load_inflight_meta(id))
end

-- The task id in the headers of a delivery kombu noted (its hash holds [message, exchange, routing key] as
-- JSON, the message's headers before its properties), or nil.
local function task_id_of(noted)
    if type(noted) ~= 'string' then
        return nil
    end
    local headers = string.find(noted, '"headers": {', 1, true)
    return headers and string.match(noted, '"id": "([^"]+)"', headers)
end

local lease = tonumber(ARGV[3])
if UNACKED and lease then
    local seen = redis.call('HGET', HISTORY, 'unacked_seen') or '-inf'
    local popped = redis.call('ZRANGEBYSCORE', UNACKED_INDEX, '(' .. seen, (now - lease) / 1000, 'WITHSCORES',
        'LIMIT', 0, NEVER_HELD_STEP)
    for i = 1, #popped, 2 do
        local tag = popped[i]
        local id, delivery = string.match(tag, '^(.+)%.(%d+)$')
        if not id then
            id = task_id_of(redis.call('HGET', UNACKED, tag))  -- a message kombu tagged: its call is its task
        end
        if id and redis.call('ZSCORE', INFLIGHT, id) then
            local meta = load_inflight_meta(id)
            if meta.h == nil and meta.s == 'queued' and (delivery == nil or tonumber(meta.d) == tonumber(delivery)) then
                meta.g = tag  -- the delivery kombu holds for the dead worker goes with the sweep
                sweep_call(id, meta)
            end
        end
    end
    if #popped > 0 then
        redis.call('HSET', HISTORY, 'unacked_seen', popped[#popped])
    end
end

-- Calls popped by a worker that died before kombu noted them (see the top of this file).
local default_queue_ms = tonumber(ARGV[4])
if UNACKED and lease and default_queue_ms and next(queue_lists) then
    local recheck_before = now - RECHECK_LEASES * lease  -- pushed before this: looked at once, not again
    local budget = SCAN_BUDGET  -- list entries LPOS may still compare in this sweep
    -- When the message at the oldest end of ``list`` was pushed (ms), if it is one of this store's messages at
    -- its call's current delivery, still queued; nil if that cannot be told.
    local oldest_pushed = {}
    local function oldest_push(list)
        if oldest_pushed[list] == nil then
            oldest_pushed[list] = false
            local oldest = redis.call('LINDEX', list, -1)
            local tag = oldest and string.match(oldest, '"delivery_tag": "([^"]*)"}}$')
            local other, delivery = string.match(tag or '', '^(.+)%.(%d+)$')
            local score = other and redis.call('ZSCORE', INFLIGHT, other)
            if score then
                local meta = load_inflight_meta(other)
                if meta.s == 'queued' and meta.h == nil and meta.b == nil and tonumber(meta.d) == tonumber(delivery) then
                    oldest_pushed[list] = tonumber(score) - (tonumber(meta.q) or default_queue_ms)
                end
            end
        end
        return oldest_pushed[list] or nil
    end
    -- 'there' (in its list, in a list too long to tell, or out of budget), or 'gone'; nil: nothing to tell
    local function whereabouts(id, meta, score)
        local list, delivery = meta.l, tonumber(meta.d)
        if meta.h ~= nil or meta.s ~= 'queued' or meta.b ~= nil or type(list) ~= 'string' or not queue_lists[list]
            or not delivery or redis.call('HEXISTS', UNACKED, id .. '.' .. string.format('%d', delivery)) == 1 then
            return nil
        end
        local payload = redis.call('HGET', PAYLOADS, id)
        local message = payload and message_for(id, payload, delivery)
        if not message then
            return nil
        end
        local length = redis.call('LLEN', list)
        if length == 0 then
            return 'gone'
        end
        if length > LIST_SCAN or length > budget then
            local oldest = oldest_push(list)
            local pushed = score - (tonumber(meta.q) or default_queue_ms)
            return (oldest and pushed < oldest) and 'gone' or 'there'
        end
        budget = budget - length
        -- From the oldest end, where a call pushed a lease ago is, if it is still there (MAXLEN: never more).
        return redis.call('LPOS', list, message, 'RANK', -1, 'MAXLEN', length) and 'there' or 'gone'
    end
    -- When a call was first found in neither its list nor a worker's hands, at its current delivery (ms): noted now
    -- if it was not. A worker that popped it takes it under its lease a moment later, or at its next renewal if that
    -- take did not reach Redis (under load, or in an outage): a call still missing a lease after it was first
    -- missed was lost with its worker. Swept at once, a call a busy worker had just popped would run twice. The
    -- note is written into the metadata as it is stored (a first delivery keeps the form the park gave it).
    local function missing_since(id, meta)
        local stored = load_meta(id)
        local since = tonumber(stored.mi)
        if since and tonumber(stored.md) == tonumber(meta.d) then
            return since
        end
        stored.mi, stored.md = now, meta.d
        save_meta(id, stored)
        return now
    end
    local seen = redis.call('HGET', HISTORY, 'queued_seen') or '-inf'
    -- A step of the release gives its calls one deadline: a page holds more than a step, so that the cursor,
    -- which moves from one whole score to the next, finds the end of one.
    local page = QUEUED_STEP + tonumber(ARGV[1])
    local rows = redis.call('ZRANGEBYSCORE', INFLIGHT, '(' .. seen, now - lease + default_queue_ms, 'WITHSCORES',
        'LIMIT', 0, page)
    local done, blocked = nil, nil  -- the last score read whole; the first score holding a call to look at again
    for i = 1, #rows, 2 do
        local id, score = rows[i], tonumber(rows[i + 1])
        if not blocked and i > 1 and score ~= tonumber(rows[i - 1]) then
            done = rows[i - 1]
        end
        local meta = load_inflight_meta(id)
        local where = whereabouts(id, meta, score)
        local missing = where == 'gone' and missing_since(id, meta)
        if missing and now - missing >= lease then
            sweep_call(id, meta)
        elseif (missing or where == 'there') and not blocked and (missing or score - default_queue_ms > recheck_before) then
            blocked = score  -- the cursor stays before it; the calls after it are still looked at
        end
    end
    if not blocked and #rows > 0 and (#rows < 2 * page or done == nil) then
        done = rows[#rows]  -- every call up to the last score was read (or one score fills the page)
    end
    if done then
        redis.call('HSET', HISTORY, 'queued_seen', done)
    end
end

-- Concurrency slots: holders no longer in flight give their slots back, HOLDER_CHECKS looked at per sweep, onwards
-- from where the last sweep stopped ('holders_seen' in the history hash: an HSCAN cursor, which visits every
-- holder that stays in the hash). Slot holders of earlier releases (SLOTS) move into HELD and HOLDERS, OLD_SLOT_MOVES
-- per sweep: a holder still in flight keeps its slot, the others are dropped.
local HOLDER_CHECKS, OLD_SLOT_MOVES = 200, 200
local woken = false
local cursor = redis.call('HGET', HISTORY, 'holders_seen') or '0'
local scanned = redis.call('HSCAN', HOLDERS, cursor, 'COUNT', HOLDER_CHECKS)
for i = 1, #scanned[2], 2 do
    local id = scanned[2][i]
    if id ~= TABLE_FIELD and not redis.call('ZSCORE', INFLIGHT, id) then
        woken = give_back(id, scanned[2][i + 1]) or woken
    end
end
if scanned[1] ~= cursor then
    redis.call('HSET', HISTORY, 'holders_seen', scanned[1])
end
if any_old_slots() then
    for _, member in ipairs(redis.call('ZRANGE', SLOTS, 0, OLD_SLOT_MOVES - 1)) do
        redis.call('ZREM', SLOTS, member)
        local instance, id = string.match(member, '^([^%z]*)%z(.+)$')
        if id and redis.call('ZSCORE', INFLIGHT, id) then
            local holds = redis.call('HGET', HOLDERS, id)
            if not holds or not string.find('\n' .. holds .. '\n', '\n' .. instance .. '\n', 1, true) then
                redis.call('HSET', HOLDERS, id, holds and holds .. '\n' .. instance or instance)
                add_held(instance, 1)
            end
        else
            woken = (instance and wake_waiting(instance)) or woken
        end
    end
end
if woken then
    wake_releasers(now)
end

if requeued > 0 then
    count('swept', requeued)
end
prune_history(now)
return {requeued, buried}
