-- meta.lua: A call's metadata (the META hash): read, written, and who holds the call.
--
-- META: id -> small JSON object (typed for Python in meta.py, CallMeta):
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
--       (s 'limited'); mi when the sweep first found it popped and held by no one, at delivery md (sweep.lua)

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

-- A call leaves the worker that held it (swept, deferred behind a lock, dead-lettered): no one holds it, and
-- its run's hard end goes with the run (see lease.lua).
local function unheld(meta)
    meta.h, meta.g, meta.x = nil, nil, nil
end
