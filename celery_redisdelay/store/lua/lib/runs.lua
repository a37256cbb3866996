-- runs.lua: A worker starts a call, and it ends (start.lua, ack.lua, track.lua).
-- requires: calls, clock, history, meta

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
