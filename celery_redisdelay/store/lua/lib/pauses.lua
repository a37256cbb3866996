-- pauses.lua: Paused tasks and queues, and the calls set aside on them.
-- requires: lex, meta
--
-- Pauses (see "Pauses" below, pause.lua and docs/pausing.rst):
--   PAUSES  hash  target ('task:<name>' or 'queue:<name>') -> the pause's record, JSON {"k": kind, "n": name,
--       "s": since (ms), "u": until (ms; none: until resumed), "why": reason, "ls": a queue's lists, "r": 1 resumed}
--   PAUSED  zset  (lex, score 0) target NUL due (15 digits) NUL id: the calls waiting on a pause

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
