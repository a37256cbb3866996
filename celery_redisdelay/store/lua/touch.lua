-- touch.lua: a running call extends its deadline (a heartbeat). Under a lease, its own run timeout's hard
-- end (meta.x, see lease.lua) moves with it: a touch is the task saying it is alive.
-- ARGV: 1 id, 2 milliseconds from now
-- Returns: 1 if the call is in flight, else 0.
-- requires: clock, meta
local id = ARGV[1]
if redis.call('ZSCORE', INFLIGHT, id) then
    local deadline = now_ms() + tonumber(ARGV[2])
    redis.call('ZADD', INFLIGHT, deadline, id)
    local meta = load_meta(id)
    if tonumber(meta.x) and tonumber(meta.x) < deadline then
        meta.x = deadline
        save_meta(id, meta)
    end
    return 1
end
return 0
