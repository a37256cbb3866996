-- batch_flush.lua: the tick flushes a group whose first item has waited its max wait. Several ticks
-- may race for the same group: the one that finds it still due flushes it, the others do nothing.
-- KEYS[FIXED_KEYS + 1]: the group's item list.
-- ARGV: 1 group, 2 most items in the call (the task's size), 3 id for the call, 4 meta JSON
-- Returns: how many items went into the call (0: not due, or already flushed).
-- requires: calls, clock
local wrong = check_type(KEYS[FIXED_KEYS + 1], 'list')
if wrong then
    return wrong
end
local group = ARGV[1]
local due = redis.call('ZSCORE', BATCHES, group)
local now = now_ms()
if not due or tonumber(due) > now then
    return 0
end
return flush_group(KEYS[FIXED_KEYS + 1], group, tonumber(ARGV[2]), ARGV[3], ARGV[4], now)
