-- ack.lua: the call is finished as Celery sees it; forget it. A redelivery the sweep had scheduled is
-- dropped too. How it ended is counted: 'acked' (a worker ran it to an end: success, a failure Celery
-- does not retry, Ignore, Reject), 'revoked' or 'expired' (a worker discarded it unrun, as Celery
-- discards a revoked or expired message).
-- ARGV: 1 id, 2 the counter of the outcome ('acked' | 'revoked' | 'expired')
-- Returns: 1 if the call was tracked, else 0.
local id = ARGV[1]
local done = redis.call('ZREM', INFLIGHT, id)
if done == 0 and load_meta(id).s == 'swept' then
    done = redis.call('ZREM', DELAYED, id)
end
if done == 1 then
    forget(id)
    count(ARGV[2], 1)
end
return done
