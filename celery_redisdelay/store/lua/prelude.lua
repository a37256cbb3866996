-- prelude.lua: helpers prepended to every script of the call store. Ahead of it scripts.py defines
-- MESSAGE_PREFIX and BATCH_PREFIX, how a stored broker message and a flushed batch begin (stored.py).
--
-- Every script of the store receives the same twenty keys first, all sharing one hash tag:
--   KEYS[1] delayed   zset  id -> due time (ms since the epoch, server clock)
--   KEYS[2] inflight  zset  id -> deadline (ms)
--   KEYS[3] dead      zset  id -> time it was dead-lettered (ms)
--   KEYS[4] payloads  hash  id -> envelope (opaque to Lua), or a batch stub (see batch_add.lua)
--   KEYS[5] meta      hash  id -> small JSON object (typed for Python in meta.py, CallMeta):
--       d deliveries, m max deliveries, r run timeout (ms), q queue timeout (ms), t task name,
--       s state (delayed | limited | claimed | queued | running | swept | deferred | dead), why (dead reason);
--       in flight, 'delayed' with d 0 stands for queued, d 1 (see load_inflight_meta),
--       k the unique/debounce key the call holds while it is parked, w deferrals behind a busy lock,
--       l the queue list a stored broker message goes to (the fast release path, see release.lua),
--       o 1 when r is the task's own timeout; under a lease (lease.lua): h the worker holding the call,
--       g kombu's delivery tag of the delivery it holds, x the hard end of its run (start + r, when o);
--       b 1 when a warm shutdown gave it back (kombu put its message back in its own form, see sweep.lua);
--       rj the delivery its worker rejected with requeue (lease.lua's reject; a late start of it is stale);
--       c 1 when its run, if cut short with its worker, is dead-lettered rather than run again (the task's
--       contract, worker/contract.py; set by the start), st when that run started (ms);
--       lg the call's gate when it is under limits (see "Limits"), lw its due time while it waits in the gate
--       (s 'limited')
--   KEYS[6] index     hash  unique/debounce key -> id of the parked call holding it
--   KEYS[7] batches   zset  batch group -> when the group is flushed (ms): its first item + max wait
--   KEYS[8] counters  hash  batch_items (items waiting in all groups), and running totals for metrics:
--       released, late_ms_sum, late_le_<ms> (release lateness, see count_releases), swept, dead_lettered,
--       acked, revoked, expired (discarded unrun by a worker), worker_lost (runs cut short with their worker
--       and dead-lettered by their task's contract, see sweep.lua), cancelled, batches_flushed, lock_deferrals,
--       lock_takeovers (locks taken over from a holder whose run was gone, see lock_take.lua),
--       limit_released:<limit> (calls a limit let go); lock_lines (locks with a non-empty line of waiters)
--   KEYS[9] wake      zset  markers for precise releasers: a call parked earlier than every other
--   KEYS[10] history  hash  the same totals per minute, '<minute>:<name>' -> count (minute: ms // 60000),
--       for the last HISTORY_MINUTES minutes; 'pruned' the last minute forgotten (see prune_history),
--       'unacked_seen' how far the sweep has read kombu's unacked index, 'queued_seen' how far it has read the
--       calls pushed onto the broker's lists, 'holders_seen' where it has read the holders of slots (see sweep.lua),
--       'released_at' when a releaser last ran (ms)
-- The limits of calls (see "Limits" below and docs/limits.rst):
--   KEYS[11] limits  hash  'code:<limit>' -> the limit as the code declares it (written by each park of a call
--       under it), 'set:<limit>' -> the limit as an operator set it (wins); JSON {"r": [[calls, per ms], ...],
--       "c": most calls in flight}
--   KEYS[12] gates   zset  gate -> when its first waiting call may be looked at again (ms)
--   KEYS[13] gated   zset  (lex, score 0) gate NUL due (15 digits) NUL id: the due calls waiting in each gate
--   KEYS[14] slots   zset  (lex, score 0) limit instance NUL id: slot holders as earlier releases wrote them;
--       counted while any is left, and moved into held and holders by the sweep (sweep.lua)
--   KEYS[15] paces   zset  limit instance NUL rate number -> the rate's theoretical arrival time (GCRA, ms)
--   KEYS[16] waits   zset  (lex, score 0) limit instance NUL gate: gates waiting for a slot of that instance
--   KEYS[17] held    hash  limit instance -> calls in flight holding one of its concurrency slots; NUL limit -> the
--       same summed over the limit's instances (a field that reaches 0 is deleted)
--   KEYS[18] holders hash  id -> the limit instances whose slots the call in flight holds, one per line
-- Pauses (see "Pauses" below, pause.lua and docs/pausing.rst):
--   KEYS[19] pauses  hash  target ('task:<name>' or 'queue:<name>') -> the pause's record, JSON {"k": kind, "n": name,
--       "s": since (ms), "u": until (ms; none: until resumed), "why": reason, "ls": a queue's lists, "r": 1 resumed}
--   KEYS[20] paused  zset  (lex, score 0) target NUL due (15 digits) NUL id: the calls waiting on a pause
-- Scripts that work on one batch group or one lock get its keys after these (same hash tag).

local DELAYED, INFLIGHT, DEAD, PAYLOADS, META = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local INDEX, BATCHES, COUNTERS, WAKE, HISTORY = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local LIMITS, GATES, GATED, SLOTS, PACES, WAITS = KEYS[11], KEYS[12], KEYS[13], KEYS[14], KEYS[15], KEYS[16]
local HELD, HOLDERS = KEYS[17], KEYS[18]
local PAUSES, PAUSED = KEYS[19], KEYS[20]
local EXPECTED_TYPES = {'zset', 'zset', 'zset', 'hash', 'hash', 'hash', 'zset', 'hash', 'zset', 'hash',
    'hash', 'zset', 'zset', 'zset', 'zset', 'zset', 'hash', 'hash', 'hash', 'zset'}
local FIXED_KEYS = #EXPECTED_TYPES  -- a script's own keys come after these
-- Precise releasers need no more markers than this: each one only says "look again now".
local MOST_MARKERS = 16

-- Refuse to run on keys someone else overwrote: an error here happens before any write.
local function check_type(key, expected, also)
    local found = redis.call('TYPE', key)['ok']
    if found ~= 'none' and found ~= expected and found ~= also then
        return redis.error_reply('WRONGTYPE redisdelay key ' .. key .. ' holds a ' .. found
            .. ', expected a ' .. expected .. '; delete or rename it')
    end
end

for i, expected in ipairs(EXPECTED_TYPES) do
    local wrong = check_type(KEYS[i], expected)
    if wrong then
        return wrong
    end
end

-- The set of KEYS[first ..], each a list or missing; or, as a second value, the error for a key of another type.
local function list_keys(first)
    local lists = {}
    for i = first, #KEYS do
        local wrong = check_type(KEYS[i], 'list')
        if wrong then
            return nil, wrong
        end
        lists[KEYS[i]] = true
    end
    return lists
end

-- The Redis clock, read once per script: a script is one instant (and one TIME is all it costs).
local script_now = nil
local function now_ms()
    if not script_now then
        local t = redis.call('TIME')
        script_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
    return script_now
end

-- History: every total is also counted per minute, so the dashboard can show what happened over time.
-- A minute is forgotten once it is HISTORY_MINUTES old (prune_history, run by the sweep of every tick).
local HISTORY_MINUTES = 1440
local history_minute = nil  -- the minute of now_ms(), as the history's fields spell it

-- Add ``n`` to the running total ``name`` and to its count for the current minute.
local function count(name, n)
    redis.call('HINCRBY', COUNTERS, name, n)
    if not history_minute then
        history_minute = string.format('%d', math.floor(now_ms() / 60000))
    end
    redis.call('HINCRBY', HISTORY, history_minute .. ':' .. name, n)
end

-- The names counted per minute: every one a minute can hold, so a minute is forgotten in one HDEL.
local HISTORY_NAMES = {'parked', 'released', 'acked', 'revoked', 'expired', 'swept', 'dead_lettered', 'worker_lost',
    'cancelled', 'limited',
    'late_le_5', 'late_le_10', 'late_le_25', 'late_le_50', 'late_le_100', 'late_le_250', 'late_le_500',
    'late_le_1000', 'late_le_2500', 'late_le_5000', 'late_le_10000', 'late_le_30000', 'late_le_60000', 'late_le_inf'}
-- At most this many minutes are forgotten per call, so the work is bounded even after a long pause.
local PRUNE_MINUTES = 10

-- Forget the minutes that are HISTORY_MINUTES old, from the oldest not yet forgotten on.
local function prune_history(now)
    local horizon = math.floor(now / 60000) - HISTORY_MINUTES  -- the newest minute to forget
    local pruned = tonumber(redis.call('HGET', HISTORY, 'pruned'))
    if not pruned then
        -- The first sweep: what was counted before it is less than a day old, since a tick sweeps every few
        -- seconds wherever calls are released (NoReleaser alerts otherwise). Kept out of count(), which
        -- every ack runs.
        redis.call('HSET', HISTORY, 'pruned', string.format('%d', horizon))
        return
    end
    local last = math.min(pruned + PRUNE_MINUTES, horizon)
    if last <= pruned then
        return
    end
    local fields = {}
    for minute = pruned + 1, last do
        local prefix = string.format('%d', minute) .. ':'
        for _, name in ipairs(HISTORY_NAMES) do
            fields[#fields + 1] = prefix .. name
        end
    end
    redis.call('HDEL', HISTORY, unpack(fields))
    redis.call('HSET', HISTORY, 'pruned', string.format('%d', last))
end

-- A due time from a script's (mode, ms) arguments: 'in' ms from now by the Redis clock, or 'at' ms.
local function due_time(mode, ms)
    if mode == 'in' then
        return now_ms() + tonumber(ms)
    end
    return tonumber(ms)
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

-- The metadata of a call in flight. release.lua leaves a first delivery's metadata as the park wrote
-- it (one write less per call), so in flight 'delayed' with no delivery means queued, delivery 1.
local function load_inflight_meta(id)
    local meta = load_meta(id)
    if meta.s == 'delayed' and (tonumber(meta.d) or 0) == 0 then
        meta.s = 'queued'
        meta.d = 1
    end
    return meta
end

local function save_meta(id, meta)
    redis.call('HSET', META, id, cjson.encode(meta))
end

-- The broker message of a call stored as one (wire.py): release.lua pushes it, sweep.lua looks for it in its list.
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

-- A parked call gives up its unique/debounce key when it leaves the delay set (released,
-- cancelled, dead-lettered), so a new call with that key can be parked.
local function free_key(id, meta)
    if type(meta.k) == 'string' and redis.call('HGET', INDEX, meta.k) == id then
        redis.call('HDEL', INDEX, meta.k)
    end
end

-- Limits. A call under limits (meta.lg) is parked as any other; once due, the release puts it in its gate
-- (GATED, in due order) instead of the broker, and lets it out when every limit of the gate allows it. A gate
-- is the call's limit instances, one per line; an instance is a limit's name, a tab, and the key the call's
-- arguments gave ('' for a limit that is not per key). Two calls with the same gate wait in one line, in
-- due order; gates take turns by when each may go next (GATES).
-- - A rate of n calls per p ms is a GCRA with no burst: a call may go when now >= TAT - T/4 (T = p / n, the
--   quarter absorbs a releaser's wake-up delay), and the TAT becomes max(TAT, now) + T. In any window of p
--   ms at most n + 1 calls go.
-- - A concurrency of c allows c calls in flight (released and not finished). A call holds a slot from its
--   release until it leaves INFLIGHT: acknowledged, swept back (its worker died), dead-lettered, deferred
--   behind a lock, given back unpublished or parked again. Each of these gives its slots back at once
--   (free_slots) and wakes the gates waiting for them. The count of an instance's slots (HELD) is kept with its
--   holders (HOLDERS) in the same scripts, so it is exact: one field read tells whether a call may go. A
--   holder no longer in flight (a script of an earlier release let it go, or a hand removed it) is found by the
--   sweep, which looks at a few holders each time, in turns (sweep.lua).
local NUL, AFTER_NUL = '\0', '\1'
local WAKE_GATES = 8  -- gates woken, at most, per slot given back
local LIMIT_RECHECK = 2000  -- a gate waiting for a slot looks again after this long (ms), woken or not

local limit_specs, gate_limits_seen = {}, {}

-- A limit as set ('set:') or declared ('code:'): {r = {{calls, per ms}, ...}, c = most in flight, suffixes and
-- intervals: for each rate, what its pace's member has after the instance, and T (ms)}; false for none (a limit
-- nobody declares any more holds nothing back). Only positive numbers are taken from it: a damaged part holds
-- nothing back, and no script fails on it; a setting that is not JSON leaves the code's.
local function limit_spec(name)
    local spec = limit_specs[name]
    if spec == nil then
        spec = false
        local ok, decoded = pcall(cjson.decode, redis.call('HGET', LIMITS, 'set:' .. name) or '')
        if not ok or type(decoded) ~= 'table' then  -- none set (or not JSON): the code's
            ok, decoded = pcall(cjson.decode, redis.call('HGET', LIMITS, 'code:' .. name) or '')
        end
        if ok and type(decoded) == 'table' then
            spec = {r = {}, c = tonumber(decoded.c), suffixes = {}, intervals = {}}
            if spec.c and spec.c < 1 then
                spec.c = nil
            end
            for _, rate in ipairs(type(decoded.r) == 'table' and decoded.r or {}) do
                local calls, per = type(rate) == 'table' and tonumber(rate[1]), type(rate) == 'table' and tonumber(rate[2])
                if calls and per and calls > 0 and per > 0 then
                    spec.r[#spec.r + 1] = {calls, per}
                    spec.suffixes[#spec.r] = NUL .. #spec.r
                    spec.intervals[#spec.r] = per / calls
                end
            end
        end
        limit_specs[name] = spec
    end
    return spec
end

-- A limit instance as the scripts use it: its name, its limit's name, its paces (a member of PACES per rate),
-- their intervals (ms) and its concurrency (most). Worked out once per script.
local instances_seen = {}
local NO_RATES = {}
local function limit_instance(instance)
    local found = instances_seen[instance]
    if not found then
        local name = string.match(instance, '^[^\t]*')
        local spec = limit_spec(name)
        local paces = NO_RATES
        if spec and #spec.suffixes > 0 then
            paces = {}
            for number, suffix in ipairs(spec.suffixes) do
                paces[number] = instance .. suffix
            end
        end
        -- With every field the release keeps in it (see release.lua), so that the table is sized once.
        found = {instance = instance, name = name, paces = paces, intervals = spec and spec.intervals or NO_RATES,
            most = spec and spec.c or false, arrivals = false, held_field = false, held = false, taken = 0,
            changed = false}
        instances_seen[instance] = found
    end
    return found
end

-- A gate's limit instances (see limit_instance).
local function gate_limits(gate)
    local found = gate_limits_seen[gate]
    if not found then
        if not string.find(gate, '\n', 1, true) then  -- the common case: one limit instance
            found = {limit_instance(gate)}
        else
            found = {}
            for instance in string.gmatch(gate, '[^\n]+') do
                found[#found + 1] = limit_instance(instance)
            end
        end
        gate_limits_seen[gate] = found
    end
    return found
end

local function lex_range(prefix)
    return '[' .. prefix .. NUL, '(' .. prefix .. AFTER_NUL
end

-- Slot holders as earlier releases wrote them (SLOTS): counted beside HELD until the sweep has moved them
-- all (sweep.lua). Whether any is left is asked once per script.
local old_slots = nil
local function any_old_slots()
    if old_slots == nil then
        old_slots = redis.call('EXISTS', SLOTS) == 1
    end
    return old_slots
end

local function old_slots_held(instance)
    if not any_old_slots() then
        return 0
    end
    local low, high = lex_range(instance)
    return redis.call('ZLEXCOUNT', SLOTS, low, high)
end

-- HELD and HOLDERS are read and written hundreds of fields at a time. Redis keeps a small hash (up to
-- hash-max-listpack-entries fields, 512 by default) in a compact encoding whose every lookup is a linear scan:
-- at a few hundred fields, ten times what a lookup costs in a hash table. A value longer than
-- hash-max-listpack-value (64 bytes by default) makes Redis convert the hash to a table for good, so each
-- release step that writes them writes this field too; nothing else reads it.
local TABLE_FIELD = ''
local TABLE_VALUE = string.rep('(a long value keeps this hash a hash table; see prelude.lua) ', 4)

-- The field of HELD that sums a limit's instances.
local function limit_total(instance)
    return NUL .. string.match(instance, '^[^\t]*')
end

-- Add n (which may be negative) to the slots held of an instance and of its limit; a count that reaches 0 goes.
local function add_held(instance, n)
    if redis.call('HINCRBY', HELD, instance, n) <= 0 then
        redis.call('HDEL', HELD, instance)
    end
    local total = limit_total(instance)
    if redis.call('HINCRBY', HELD, total, n) <= 0 then
        redis.call('HDEL', HELD, total)
    end
end

-- Tell precise releasers to look again now (a gate may go).
local function wake_releasers(now)
    redis.call('ZADD', WAKE, now, 'limits')
    redis.call('ZREMRANGEBYRANK', WAKE, MOST_MARKERS, -1)
end

-- A slot of an instance was given back: the gates waiting for one (a few) may look again now. True if any.
local function wake_waiting(instance)
    local low, high = lex_range(instance)
    local woken = false
    for _, member in ipairs(redis.call('ZRANGEBYLEX', WAITS, low, high, 'LIMIT', 0, WAKE_GATES)) do
        redis.call('ZREM', WAITS, member)
        redis.call('ZADD', GATES, 'XX', now_ms(), string.sub(member, #instance + 2))
        woken = true
    end
    return woken
end

-- A holder gives back the slots it holds (``instances``: its field of HOLDERS). True if a gate was woken.
local function give_back(id, instances)
    redis.call('HDEL', HOLDERS, id)
    local woken = false
    for instance in string.gmatch(instances, '[^\n]+') do
        add_held(instance, -1)
        woken = wake_waiting(instance) or woken
    end
    return woken
end

-- A call leaves flight: it gives back the slots it holds, and the gates waiting for them may look again.
local function free_slots(id, meta)
    if type(meta.lg) ~= 'string' then
        return
    end
    local instances = redis.call('HGET', HOLDERS, id)
    local woken = instances and give_back(id, instances)
    if any_old_slots() then
        for _, limit in ipairs(gate_limits(meta.lg)) do
            if redis.call('ZREM', SLOTS, limit.instance .. NUL .. id) == 1 then
                woken = wake_waiting(limit.instance) or woken
            end
        end
    end
    if woken then
        wake_releasers(now_ms())
    end
end

-- The member of GATED that stands for a call waiting in its gate.
local function gated_member(gate, due, id)
    return gate .. NUL .. string.format('%015d', due) .. NUL .. id
end

-- Pauses. An operator pauses a task or a queue (pause.lua): its record in PAUSES. A call of a paused target that falls
-- due is not released: the release moves it aside, into PAUSED (target NUL due NUL id, in due order per target), its
-- metadata as it was but for a note of where it waits (set_aside), so that it goes out as it would have. A pause ends
-- when it is resumed (its record says so, "r") or its "until" passes; the release then moves its calls back into the
-- delay set at their due times, a step's worth at a time, and forgets the record once none is left. With no pause set,
-- all this costs one EXISTS a script.
local pauses_seen = nil  -- false: none; else {active = {target -> record}, lists = {list -> target}, ended = {...}}

-- The pauses as this script sees them, read once (nil when there is none). A record that is not JSON ends (its calls
-- go back): a damaged pause must hold nothing back for ever.
local function load_pauses(now)
    if pauses_seen == nil then
        pauses_seen = false
        if redis.call('EXISTS', PAUSES) == 1 then
            local seen = {active = {}, lists = {}, ended = {}, any_active = false, next_end = false}
            local fields = redis.call('HGETALL', PAUSES)
            for i = 1, #fields, 2 do
                local target = fields[i]
                local ok, record = pcall(cjson.decode, fields[i + 1])
                if not ok or type(record) ~= 'table' then
                    record = {r = 1}
                end
                local ends = tonumber(record.u)
                if record.r or (ends and ends <= now) then
                    seen.ended[#seen.ended + 1] = target
                else
                    seen.active[target] = record
                    seen.any_active = true
                    if type(record.ls) == 'table' then
                        for _, list in ipairs(record.ls) do
                            seen.lists[list] = target
                        end
                    end
                    if ends and (not seen.next_end or ends < seen.next_end) then
                        seen.next_end = ends
                    end
                end
            end
            pauses_seen = seen
        end
    end
    return pauses_seen or nil
end

-- The paused target a call of ``task`` for the broker list ``list`` waits on, or nil.
local function paused_target(pauses, task, list)
    if type(task) == 'string' and pauses.active['task:' .. task] then
        return 'task:' .. task
    end
    if type(list) == 'string' then
        return pauses.lists[list]
    end
    return nil
end

-- The same from a call's stored metadata text (decoded once per text: calls of one task share theirs); false for none.
local pause_of_raw = {}
local function paused_raw(pauses, raw)
    local target = pause_of_raw[raw]
    if target == nil then
        local ok, meta = pcall(cjson.decode, raw)
        target = ok and type(meta) == 'table' and paused_target(pauses, meta.t, meta.l) or false
        pause_of_raw[raw] = target
    end
    return target
end

-- The member of PAUSED of a call set aside on ``target``, due at ``due``.
local function paused_member(target, due, id)
    return target .. NUL .. string.format('%015d', due) .. NUL .. id
end

-- A call set aside notes where in its metadata: "pz" its target, "pd" its due time (so cancel.lua removes its
-- member at once, and CallStore.find and stats see it). The note is added at the end of the metadata's text as it
-- is, and bring_back takes exactly that away again: a call comes back with its metadata as it left.
local function pause_note(target, due)
    return ',"pz":' .. cjson.encode(target) .. ',"pd":' .. string.format('%d', due) .. '}'
end

-- Put a call aside on its target's pause (it has left DELAYED, INFLIGHT or its gate), its metadata saved before.
local function set_aside(target, due, id)
    redis.call('ZADD', PAUSED, 0, paused_member(target, due, id))
    local raw = redis.call('HGET', META, id)
    if not raw then
        return
    end
    local ok, meta = pcall(cjson.decode, raw)
    if ok and type(meta) == 'table' and meta.pz == nil and meta.pd == nil and string.sub(raw, -1) == '}'
            and next(meta) ~= nil then
        redis.call('HSET', META, id, string.sub(raw, 1, -2) .. pause_note(target, due))
    else
        meta = load_meta(id)  -- empty, or noted before: written again whole
        meta.pz, meta.pd = target, due
        save_meta(id, meta)
    end
end

-- The note of set_aside taken away from a call's metadata (it is back in the delay set, or gone).
local function unnote(id, target, due)
    local raw = redis.call('HGET', META, id)
    if not raw then
        return
    end
    local note = pause_note(target, due)
    if #raw > #note and string.sub(raw, -#note) == note then
        redis.call('HSET', META, id, string.sub(raw, 1, -#note - 1) .. '}')
    elseif string.find(raw, '"pz":', 1, true) then
        local meta = load_meta(id)
        meta.pz, meta.pd = nil, nil
        save_meta(id, meta)
    end
end

-- Move up to ``most`` calls of an ended pause back into the delay set, at their due times, their notes taken away (a
-- call gone meanwhile, with no payload left, is dropped); the record goes once none is left. How many were looked at.
local function bring_back(target, most)
    local low, high = lex_range(target)
    local members = redis.call('ZRANGEBYLEX', PAUSED, low, high, 'LIMIT', 0, most)
    for _, member in ipairs(members) do
        redis.call('ZREM', PAUSED, member)
        local due, id = string.match(string.sub(member, #target + 2), '^(%d+)%z(.+)$')
        if id and redis.call('HEXISTS', PAYLOADS, id) == 1 then
            redis.call('ZADD', DELAYED, tonumber(due), id)
            unnote(id, target, tonumber(due))
        end
    end
    if #members < most then
        redis.call('HDEL', PAUSES, target)
    end
    return #members
end

-- The release's first step when pauses exist: the calls of ended pauses go back, ``most`` at most. How many.
local function drain_pauses(pauses, most)
    local looked = 0
    for _, target in ipairs(pauses.ended) do
        if looked >= most then
            break
        end
        looked = looked + bring_back(target, most - looked)
    end
    return looked
end

-- A call leaves the worker that held it (swept, deferred behind a lock, dead-lettered): no one holds it, and
-- its run's hard end goes with the run (see lease.lua).
local function unheld(meta)
    meta.h, meta.g, meta.x = nil, nil, nil
end

-- Move a call to the dead-letter set, keeping its payload for inspection and requeue.
-- ``ms`` (since the epoch) as UTC ISO 8601 text, to the millisecond: the civil date of a day count (H. Hinnant's
-- days_from_civil, inverted), which Redis's Lua has no os.date for.
local function utc_text(ms)
    local seconds = math.floor(ms / 1000)
    local z = math.floor(seconds / 86400) + 719468
    local era = math.floor(z / 146097)
    local doe = z - era * 146097
    local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
    local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
    local mp = math.floor((5 * doy + 2) / 153)
    local month = mp < 10 and mp + 3 or mp - 9
    local year = yoe + era * 400 + (month <= 2 and 1 or 0)
    local rest = seconds % 86400
    return string.format('%04d-%02d-%02dT%02d:%02d:%02d.%03dZ', year, month, doe - (365 * yoe + math.floor(yoe / 4)
        - math.floor(yoe / 100)) - math.floor((153 * mp + 2) / 5) + 1, math.floor(rest / 3600),
        math.floor(rest % 3600 / 60), rest % 60, ms % 1000)
end

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

-- Tell precise releasers (which wait on WAKE with BZPOPMIN) that a call (or a batch group's flush) is due
-- earlier than the call they sleep towards. Call it before adding the call to DELAYED.
local function mark_if_earliest(due, id)
    local first = redis.call('ZRANGE', DELAYED, 0, 0, 'WITHSCORES')
    if first[2] == nil or due < tonumber(first[2]) then
        redis.call('ZADD', WAKE, due, id)
        redis.call('ZREMRANGEBYRANK', WAKE, MOST_MARKERS, -1)
    end
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

-- Release lateness for metrics: how long after its due time each call left the delay set, counted
-- per bucket (upper bounds in ms; the last bucket is unbounded), with the total. ``rows`` is a
-- ZRANGEBYSCORE ... WITHSCORES reply, oldest first, so lateness only falls along it: the calls no later
-- than a bound are a tail of the rows, found by bisection. ``skipped[i]`` marks the i-th call as not
-- released (dead-lettered instead); with any, or when the rows are ``unsorted``, each call is looked at instead.
local LATENESS_BOUNDS = {5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000}
local function count_releases(rows, skipped, now, unsorted)
    local n = #rows / 2
    local counts, total, sum = {}, 0, 0
    if next(skipped) == nil and not unsorted then
        -- cumulative[b]: calls at most LATENESS_BOUNDS[b] late, the rows from the first due at or
        -- after now - bound (a bisection over the due times)
        local previous = 0
        for b, bound in ipairs(LATENESS_BOUNDS) do
            local low, high = 1, n + 1
            while low < high do
                local middle = math.floor((low + high) / 2)
                if tonumber(rows[2 * middle]) >= now - bound then
                    high = middle
                else
                    low = middle + 1
                end
            end
            local within = n + 1 - low
            counts[b] = within - previous
            previous = within
        end
        counts[#LATENESS_BOUNDS + 1] = n - previous
        for i = 2, #rows, 2 do
            sum = sum + tonumber(rows[i])
        end
        total, sum = n, n * now - sum
    else
        local bucket = #LATENESS_BOUNDS + 1  -- the unbounded one; walks down as lateness falls
        for i = 2, #rows, 2 do
            if not skipped[i / 2] then
                local late = math.max(now - tonumber(rows[i]), 0)
                while bucket > 1 and late <= LATENESS_BOUNDS[bucket - 1] do
                    bucket = bucket - 1
                end
                counts[bucket] = (counts[bucket] or 0) + 1
                total = total + 1
                sum = sum + late
            end
        end
    end
    if total > 0 then
        count('released', total)
        redis.call('HINCRBY', COUNTERS, 'late_ms_sum', sum)
        for index, n in pairs(counts) do
            if n > 0 then
                count('late_le_' .. (LATENESS_BOUNDS[index] or 'inf'), n)
            end
        end
    end
end

-- A lock's line of waiters (KEYS[12] of the lock scripts) became empty: one lock fewer with waiters.
-- Lines that were already waiting before the count was kept are not in it, so it never goes below 0.
local function line_emptied(waiters)
    if redis.call('EXISTS', waiters) == 0 and tonumber(redis.call('HGET', COUNTERS, 'lock_lines') or '0') > 0 then
        redis.call('HINCRBY', COUNTERS, 'lock_lines', -1)
    end
end

-- A worker starts running a call (start.lua, and track.lua's batches); its run deadline starts now.
-- A call the sweep had put back (because it waited too long) is taken back from the delay set, so the
-- late delivery that is running now is not followed by a second one. Under a lease (lease > 0, see
-- lease.lua) the worker holds the call, unless another worker does: the deadline is the lease's end, and
-- the task's own run timeout (meta.o) is a hard end (meta.x) that no renewal passes. Without one, the
-- deadline is the run timeout (meta.r, else default_run).
-- Returns: 1 tracked, 2 taken back from the delay set, 0 unknown (cancelled, acknowledged or never parked).
local function start_call(id, default_run, lease, worker, once)
    local meta, status
    if redis.call('ZSCORE', INFLIGHT, id) then
        meta, status = load_inflight_meta(id), 1
    else
        meta = load_meta(id)
        -- A start of a delivery its worker rejected with requeue (lease.lua's reject) is stale: that run ended.
        local rejected = meta.rj ~= nil and tonumber(meta.rj) == tonumber(meta.d)
        if meta.s ~= 'swept' or rejected or redis.call('ZREM', DELAYED, id) == 0 then
            return 0
        end
        status = 2
    end
    local now = now_ms()
    local deadline = now + (tonumber(meta.r) or default_run)
    meta.s, meta.rj = 'running', nil
    -- Run at most once past this start: a run cut short with its worker is dead-lettered (sweep.lua), not run again.
    meta.c, meta.st = once and 1 or nil, now
    if meta.o then
        meta.x = deadline
    end
    if lease > 0 and worker ~= '' then
        if meta.h == nil or meta.h == worker then
            meta.h = worker
            deadline = meta.o and math.min(now + lease, deadline) or now + lease
        else
            deadline = nil  -- another worker's lease stands: it renews the call, or the sweep takes it back
        end
    end
    save_meta(id, meta)
    if deadline then
        redis.call('ZADD', INFLIGHT, deadline, id)
    elseif status == 2 then
        redis.call('ZADD', INFLIGHT, now + lease, id)
    end
    return status
end

-- The call is finished as Celery sees it (ack.lua, and track.lua's batches): forget it. A redelivery the
-- sweep had scheduled is dropped too. How it ended is counted: 'acked' (a worker ran it to an end), 'revoked'
-- or 'expired' (a worker discarded it unrun). Returns 1 if the call was tracked, else 0.
local function ack_call(id, outcome)
    local done = redis.call('ZREM', INFLIGHT, id)
    if done == 0 then
        local meta = load_meta(id)
        if meta.s == 'swept' then
            done = redis.call('ZREM', DELAYED, id)
        elseif meta.s == 'dead' and meta.c then
            -- Dead-lettered as cut short with its worker, and the run ended after all (a worker that lost Redis
            -- for longer than its lease): it is no dead letter.
            done = redis.call('ZREM', DEAD, id)
        end
    end
    if done == 1 then
        forget(id)
        count(outcome, 1)
    end
    return done
end
