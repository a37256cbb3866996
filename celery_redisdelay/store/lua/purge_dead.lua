-- purge_dead.lua: delete the oldest dead-lettered calls for good, a bounded step at a time: the entry, its
-- payload, its metadata, and its unique/debounce index entry if that still names the call.
-- ARGV: 1 most entries to delete (1 to 1000), 2 only entries dead-lettered at or before this time (ms, or '+inf')
-- Returns: how many calls were deleted.
-- requires: calls
local limit = tonumber(ARGV[1])
if not limit or limit < 1 or limit > 1000 or not (ARGV[2] == '+inf' or tonumber(ARGV[2])) then
    return redis.error_reply('ERR purge_dead wants 1 to 1000 entries and a time in ms or +inf')
end
local ids = redis.call('ZRANGEBYSCORE', DEAD, '-inf', ARGV[2], 'LIMIT', 0, limit)
for _, id in ipairs(ids) do
    forget(id)
    redis.call('ZREM', DEAD, id)
end
return #ids
