-- purge_many.lua: delete dead-lettered calls for good, by id: the entry, its payload, its metadata, and
-- its unique/debounce index entry if that still names the call (purge_dead.lua does the same for the
-- oldest). Ids not dead-lettered here are left alone.
-- ARGV: the ids (1 to 1000)
-- Returns: the ids deleted.
-- requires: calls
if #ARGV < 1 or #ARGV > 1000 then
    return redis.error_reply('ERR purge_many wants 1 to 1000 ids')
end
local purged = {}
for _, id in ipairs(ARGV) do
    if redis.call('ZREM', DEAD, id) == 1 then
        forget(id)
        purged[#purged + 1] = id
    end
end
return purged
