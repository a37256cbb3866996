-- limits.lua: Limits of calls: gates, rates and concurrency slots.
-- requires: clock, lex, wake
--
-- The limits of calls (see "Limits" below and docs/limits.rst):
--   LIMITS  hash  'code:<limit>' -> the limit as the code declares it (written by each park of a call
--       under it), 'set:<limit>' -> the limit as an operator set it (wins); JSON {"r": [[calls, per ms], ...],
--       "c": most calls in flight}
--   GATES   zset  gate -> when its first waiting call may be looked at again (ms)
--   GATED   zset  (lex, score 0) gate NUL due (15 digits) NUL id: the due calls waiting in each gate
--   SLOTS   zset  (lex, score 0) limit instance NUL id: slot holders as earlier releases wrote them;
--       counted while any is left, and moved into held and holders by the sweep (sweep.lua)
--   PACES   zset  limit instance NUL rate number -> the rate's theoretical arrival time (GCRA, ms)
--   WAITS   zset  (lex, score 0) limit instance NUL gate: gates waiting for a slot of that instance
--   HELD    hash  limit instance -> calls in flight holding one of its concurrency slots; NUL limit -> the
--       same summed over the limit's instances (a field that reaches 0 is deleted)
--   HOLDERS hash  id -> the limit instances whose slots the call in flight holds, one per line

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
-- (The value is written as the first releases wrote it, which named the file these helpers were in then.)
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
