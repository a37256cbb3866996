-- start.lua: a worker starts running a call; its run deadline starts now.
-- A call the sweep had put back (because it waited too long) is taken back from the delay set,
-- so the late delivery that is running now is not followed by a second one.
-- Under a lease (ARGV[3] > 0, see lease.lua) the worker holds the call, unless another worker does: the
-- deadline is the lease's end, and the task's own run timeout (meta.o) is a hard end (meta.x) that no
-- renewal passes. Without one, the deadline is the run timeout.
-- ARGV: 1 id, 2 default run timeout (ms), 3 lease (ms; 0: none), 4 the worker running it
-- Returns: 1 tracked, 2 taken back from the delay set, 0 unknown (cancelled, acknowledged or never parked).
local id, lease, worker = ARGV[1], tonumber(ARGV[3]) or 0, ARGV[4] or ''
local meta, status
if redis.call('ZSCORE', INFLIGHT, id) then
    meta, status = load_inflight_meta(id), 1
else
    meta = load_meta(id)
    if meta.s ~= 'swept' or redis.call('ZREM', DELAYED, id) == 0 then
        return 0
    end
    status = 2
end
local now = now_ms()
local run = tonumber(meta.r) or tonumber(ARGV[2])
local deadline = now + run
meta.s = 'running'
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
