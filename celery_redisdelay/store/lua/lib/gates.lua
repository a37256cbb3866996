-- gates.lua: the release's admissions of calls under limits through their gates (release.lua alone).
-- requires: bulk, lex, limits

-- Gates: whether a gate's limits let one more call go now (then taken: its paces move on and the call
-- holds its slots), else when to look again. A gate waiting for a slot is also noted in WAITS, so that the
-- slot given back wakes it. What a step reads of paces and slots it keeps in each limit instance (arrivals:
-- each rate's arrival time, false for none; held_field: its field of HELD; held: the slots held, this step's
-- and those of earlier releases included; taken: the slots this step gave), and writes it once at the end
-- (write_limits): the step is one instant.
local changed = {}  -- the limit instances this step's admissions changed, once each
local holds = {TABLE_FIELD, TABLE_VALUE}  -- HOLDERS' fields this step adds: id, the instances whose slots it holds, ...
local let_out, held_out = {}, {}  -- limit name -> calls it let go this step ('limit_released:<name>'); slots given

local function arrival_of(limit, number)
    local arrivals = limit.arrivals
    if not arrivals then
        arrivals = {}
        limit.arrivals = arrivals
    end
    local arrival = arrivals[number]
    if arrival == nil then
        arrival = tonumber(redis.call('ZSCORE', PACES, limit.paces[number])) or false
        arrivals[number] = arrival
    end
    return arrival
end

-- The slots of an instance held now (read once per step, with those of earlier releases; see old_slots_held).
local function held_of(limit)
    local held = limit.held
    if not held then
        local field = limit.held_field
        if not field then
            field = tonumber(redis.call('HGET', HELD, limit.instance)) or 0
            limit.held_field = field
        end
        held = field + old_slots_held(limit.instance)
        limit.held = held
    end
    return held
end

-- The instances of a gate whose slots a call it lets out holds (those with a concurrency), one per line.
local function held_text(gate, limits)
    local text = limits.held_text
    if text == nil then
        local parts = {}
        for _, limit in ipairs(limits) do
            if limit.most then
                parts[#parts + 1] = limit.instance
            end
        end
        text = #parts == #limits and gate or table.concat(parts, '\n')
        limits.held_text = text
    end
    return text
end

-- Read the paces and the slots held of these gates' limits, each in one call, before their calls are looked at
-- one by one.
local function read_limits(gates)
    local members, paced, numbers, counted, instances = {}, {}, {}, {}, {}
    for _, gate in ipairs(gates) do
        for _, limit in ipairs(gate_limits(gate)) do
            if not limit.arrivals and #limit.paces > 0 then
                limit.arrivals = {}
                for number, member in ipairs(limit.paces) do
                    members[#members + 1] = member
                    paced[#members], numbers[#members] = limit, number
                end
            end
            if limit.most and not limit.held_field then
                limit.held_field = 0
                counted[#counted + 1] = limit
                instances[#counted] = limit.instance
            end
        end
    end
    bulk_read('ZMSCORE', PACES, members, function(j, score)
        paced[j].arrivals[numbers[j]] = tonumber(score) or false
    end)
    bulk_read('HMGET', HELD, instances, function(j, field)
        counted[j].held_field = tonumber(field) or 0
    end)
end

local function admit(gate, id, now)
    local limits = gate_limits(gate)
    local again = nil
    for _, limit in ipairs(limits) do
        for number, interval in ipairs(limit.intervals) do
            local arrival, early = arrival_of(limit, number), interval / 4
            if arrival and arrival - early > now then
                again = math.max(again or 0, arrival - early)
            end
        end
        local most = limit.most
        if most and held_of(limit) >= most then
            redis.call('ZADD', WAITS, 0, limit.instance .. NUL .. gate)
            again = math.max(again or 0, now + LIMIT_RECHECK)
        end
    end
    if again then
        return false, math.ceil(again)
    end
    for _, limit in ipairs(limits) do
        local name = limit.name
        let_out[name] = (let_out[name] or 0) + 1
        local arrivals = limit.arrivals
        for number, interval in ipairs(limit.intervals) do
            arrivals[number] = math.max(arrivals[number] or now, now) + interval
        end
        if limit.most then
            limit.held = limit.held + 1
            limit.taken = limit.taken + 1
            held_out[name] = (held_out[name] or 0) + 1
        end
        if not limit.changed and (arrivals or limit.most) then
            limit.changed = true
            changed[#changed + 1] = limit
        end
    end
    local text = held_text(gate, limits)
    if text ~= '' then
        holds[#holds + 1] = id
        holds[#holds + 1] = text
    end
    return true
end

-- Write what the step's admissions changed.
local function write_limits()
    local moved, held = {}, {TABLE_FIELD, TABLE_VALUE}
    for _, limit in ipairs(changed) do
        for number, member in ipairs(limit.paces) do
            moved[#moved + 1] = limit.arrivals[number]
            moved[#moved + 1] = member
        end
        if limit.taken > 0 then
            held[#held + 1] = limit.instance
            held[#held + 1] = limit.held_field + limit.taken
        end
    end
    bulk('ZADD', PACES, moved)
    if #held > 2 then
        bulk('HSET', HELD, held)
    end
    if #holds > 2 then
        bulk('HSET', HOLDERS, holds)
    end
    for name, n in pairs(held_out) do
        redis.call('HINCRBY', HELD, NUL .. name, n)
    end
    for name, n in pairs(let_out) do
        redis.call('HINCRBY', COUNTERS, 'limit_released:' .. name, n)
    end
end

-- The gate in a call's stored metadata, or false. The park writes it last before the end of a parked call's
-- metadata (meta.py's gated_meta), so that it is read without decoding the JSON when it holds no escape but
-- a tab or newline; else, and in metadata the scripts wrote again, it is decoded.
local GATE_FIELD, GATE_END = ',"lg":"', '",' .. string.sub(FRESH, 2)
local UNESCAPE = {t = '\t', n = '\n'}
local gates_in_raw = {}
-- The metadata of a gated call up to its gate, when read without decoding (the comma before the gate included):
-- its route is that of the same metadata without the gate, and calls of one task share that text (route_of reads
-- it once).
local ungated = {}
local function gate_in(raw)
    local gate = gates_in_raw[raw]
    if gate == nil then
        local from = string.find(raw, GATE_FIELD, 1, true)
        local text = from and string.find(raw, GATE_END, -#GATE_END, true)
            and string.sub(raw, from + #GATE_FIELD, -#GATE_END - 1)
        -- One pass for the tabs and newlines; any other escape (a backslash left) is for cjson.
        local plain = text and not string.find(text, '"', 1, true) and string.gsub(text, '\\([tn])', UNESCAPE)
        if plain and not string.find(plain, '\\', 1, true) then
            gate = plain
            ungated[raw] = string.sub(raw, 1, from)
        else
            local ok, decoded = pcall(cjson.decode, raw)
            gate = ok and type(decoded) == 'table' and type(decoded.lg) == 'string' and decoded.lg or false
        end
        gates_in_raw[raw] = gate
    end
    return gate
end

-- A gate with no call left waiting is forgotten, with its notes in WAITS.
local function close_gate(gate)
    redis.call('ZREM', GATES, gate)
    for _, limit in ipairs(gate_limits(gate)) do
        redis.call('ZREM', WAITS, limit.instance .. NUL .. gate)
    end
end
