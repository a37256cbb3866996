-- adopt.lua: take a call that waited in the broker (a worker received it with an eta, or `redisdelay adopt`
-- found it in a queue) into the store, due at its eta, unless the store knows its id already (parked, in
-- flight or dead): the same message taken twice is one call. Where the broker is the store's Redis, the
-- broker's copy goes in the same step, so a process killed right after leaves neither two copies nor none:
-- the message in its queue list, or the delivery in kombu's unacked hash and index.
-- KEYS (after the store's ten): with ARGV[5] 'list': 11 the queue list; with 'unacked': 11 kombu's unacked
--       hash, 12 its index
-- ARGV: 1 id, 2 payload, 3 meta JSON, 4 due time (ms), 5 '' | 'list' | 'unacked', 6 the message as it is in
--       the list, or the delivery tag
-- Returns: 1 taken; 0 the store knows the id (nothing stored; the broker's copy is dropped all the same);
--          -1 the broker's copy was gone (another consumer took it): nothing stored
-- requires: calls, history
local id, where, copy = ARGV[1], ARGV[5], ARGV[6]
if where == 'list' then
    if redis.call('LREM', KEYS[FIXED_KEYS + 1], 1, copy) == 0 then
        return -1
    end
elseif where == 'unacked' then
    if redis.call('HDEL', KEYS[FIXED_KEYS + 1], copy) == 0 then
        return -1
    end
    redis.call('ZREM', KEYS[FIXED_KEYS + 2], copy)
end
if redis.call('HEXISTS', PAYLOADS, id) == 1 then
    return 0
end
store(id, ARGV[2], ARGV[3], tonumber(ARGV[4]))
count('parked', 1)
return 1
