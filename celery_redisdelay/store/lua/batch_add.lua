-- batch_add.lua: add one item to a batch group; the add that brings the group to its size turns
-- those items into one parked call (due now) in the same step, so no other add can slip in between.
-- Each add comes with an id of its own (the id its call takes if it fills the group), kept among the group's recent
-- adds: the same add again (its reply lost to a dropped connection, and the client sending it once more) adds
-- nothing and answers as the first did.
-- KEYS[FIXED_KEYS + 1]: the group's item list; KEYS[FIXED_KEYS + 2]: the ids of the group's last RECENT_ADDS adds
-- (a list, newest first; it expires a minute after the group's last add).
-- ARGV: 1 group ([task, key] as JSON), 2 item (JSON), 3 size, 4 max wait (ms),
--       5 the add's id: the id of the call if this add fills the group, 6 meta JSON of that call
-- Returns: {items now waiting in the group, id of the call released by this add or ''}
-- requires: calls, clock, wake
local RECENT_ADDS, RECENT_MS = 1000, 60000
local ITEMS, RECENT = KEYS[FIXED_KEYS + 1], KEYS[FIXED_KEYS + 2]
local wrong = check_type(ITEMS, 'list') or check_type(RECENT, 'list')
if wrong then
    return wrong
end
if redis.call('LPOS', RECENT, ARGV[5], 'MAXLEN', RECENT_ADDS) then
    return {redis.call('LLEN', ITEMS), redis.call('HEXISTS', PAYLOADS, ARGV[5]) == 1 and ARGV[5] or ''}
end
redis.call('LPUSH', RECENT, ARGV[5])
redis.call('LTRIM', RECENT, 0, RECENT_ADDS - 1)
redis.call('PEXPIRE', RECENT, RECENT_MS)
local group, size = ARGV[1], tonumber(ARGV[3])
local now = now_ms()
local waiting = redis.call('RPUSH', ITEMS, ARGV[2])
redis.call('HINCRBY', COUNTERS, 'batch_items', 1)
local flush_at = now + tonumber(ARGV[4])
if redis.call('ZADD', BATCHES, 'NX', flush_at, group) == 1 then
    mark_if_earliest(flush_at, group)  -- a precise releaser sleeping towards a later time looks again
end
if waiting >= size then
    flush_group(ITEMS, group, size, ARGV[5], ARGV[6], now)
    return {redis.call('LLEN', ITEMS), ARGV[5]}
end
return {waiting, ''}
