-- ack.lua: a worker finished the call; forget it. A redelivery the sweep had scheduled is dropped too.
-- ARGV: 1 id
-- Returns: 1 if the call was tracked, else 0.
local id = ARGV[1]
local done = redis.call('ZREM', INFLIGHT, id)
if done == 0 and load_meta(id).s == 'swept' then
    done = redis.call('ZREM', DELAYED, id)
end
if done == 1 then
    forget(id)
    redis.call('HINCRBY', COUNTERS, 'acked', 1)
end
return done
