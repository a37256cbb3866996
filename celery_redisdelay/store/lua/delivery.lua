-- delivery.lua: whether a delivery a worker received again is the call's current one. kombu restores the
-- deliveries a dead worker held after its visibility timeout, a broker such as RabbitMQ requeues them at once,
-- and the sweep delivers the call again once its lease runs out: a worker asks before it runs a message that
-- says it was redelivered (worker/stale.py), so that one delivery runs, not two.
-- ARGV: 1 id, 2 the delivery's number (its tag '<id>.<n>', or 1 + its x-delivery-count header)
-- Returns: 1 current: the call is in flight and no later delivery was made, or the sweep put this delivery's
-- call back and has not delivered it again yet (the start takes it back); 0 stale: a later delivery was made,
-- or the call is finished, cancelled, parked again (a retry, a lock's deferral) or dead-lettered.
local id, n = ARGV[1], tonumber(ARGV[2])
if redis.call('ZSCORE', INFLIGHT, id) then
    return (tonumber(load_inflight_meta(id).d) or 0) <= n and 1 or 0
end
local meta = load_meta(id)
if meta.s == 'swept' and redis.call('ZSCORE', DELAYED, id) and (tonumber(meta.d) or 0) == n then
    return 1
end
return 0
