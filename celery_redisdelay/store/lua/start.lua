-- start.lua: a worker starts running a call; its run deadline starts now.
-- A call the sweep had put back (because it waited too long) is taken back from the delay set,
-- so the late delivery that is running now is not followed by a second one.
-- ARGV: 1 id, 2 default run timeout (ms)
-- Returns: 1 tracked, 2 taken back from the delay set, 0 unknown (cancelled, acknowledged or never parked).
local id = ARGV[1]
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
meta.s = 'running'
save_meta(id, meta)
redis.call('ZADD', INFLIGHT, now_ms() + (tonumber(meta.r) or tonumber(ARGV[2])), id)
return status
