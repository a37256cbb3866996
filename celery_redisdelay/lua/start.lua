-- start.lua: a worker starts running a call; its run deadline starts now.
-- A call the sweep had put back (because it waited too long) is taken back from the delay set,
-- so the late delivery that is running now is not followed by a second one.
-- ARGV: 1 id, 2 default run timeout (ms)
-- Returns: 1 tracked, 2 taken back from the delay set, 0 unknown (cancelled, acknowledged or never parked).
local id = ARGV[1]
local meta = load_meta(id)
local status = 0
if redis.call('ZSCORE', INFLIGHT, id) then
    status = 1
elseif meta.s == 'swept' and redis.call('ZREM', DELAYED, id) == 1 then
    status = 2
else
    return 0
end
meta.s = 'running'
save_meta(id, meta)
redis.call('ZADD', INFLIGHT, now_ms() + (tonumber(meta.r) or tonumber(ARGV[2])), id)
return status
