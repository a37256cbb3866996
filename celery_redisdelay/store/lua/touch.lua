-- touch.lua: a running call extends its deadline (a heartbeat).
-- ARGV: 1 id, 2 milliseconds from now
-- Returns: 1 if the call is in flight, else 0.
if redis.call('ZSCORE', INFLIGHT, ARGV[1]) then
    redis.call('ZADD', INFLIGHT, now_ms() + tonumber(ARGV[2]), ARGV[1])
    return 1
end
return 0
