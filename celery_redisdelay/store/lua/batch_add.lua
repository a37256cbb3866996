-- batch_add.lua: add one item to a batch group; the add that brings the group to its size turns
-- those items into one parked call (due now) in the same step, so no other add can slip in between.
-- KEYS[FIXED_KEYS + 1]: the group's item list.
-- ARGV: 1 group ([task, key] as JSON), 2 item (JSON), 3 size, 4 max wait (ms),
--       5 id for the call if this add fills the group, 6 meta JSON of that call
-- Returns: {items now waiting in the group, id of the call released by this add or ''}
local wrong = check_type(KEYS[FIXED_KEYS + 1], 'list')
if wrong then
    return wrong
end
local group, size = ARGV[1], tonumber(ARGV[3])
local now = now_ms()
local waiting = redis.call('RPUSH', KEYS[FIXED_KEYS + 1], ARGV[2])
redis.call('HINCRBY', COUNTERS, 'batch_items', 1)
local flush_at = now + tonumber(ARGV[4])
if redis.call('ZADD', BATCHES, 'NX', flush_at, group) == 1 then
    mark_if_earliest(flush_at, group)  -- a precise releaser sleeping towards a later time looks again
end
if waiting >= size then
    flush_group(KEYS[FIXED_KEYS + 1], group, size, ARGV[5], ARGV[6], now)
    return {redis.call('LLEN', KEYS[FIXED_KEYS + 1]), ARGV[5]}
end
return {waiting, ''}
