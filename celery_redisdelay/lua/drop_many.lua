-- drop_many.lua: delete calls for good, by id, from one set: still parked (the operator's cancel, as
-- cancel.lua does for one) or dead-lettered (purge, as purge_dead.lua does for the oldest). With the
-- entry go its payload, its metadata, and its unique/debounce index entry if that still names the call.
-- ARGV: 1 'delayed' or 'dead', 2.. the ids (1 to 1000)
-- Returns: the ids deleted (the others were not in that set here).
local from = ({delayed = DELAYED, dead = DEAD})[ARGV[1]]
if not from or #ARGV < 2 or #ARGV > 1001 then
    return redis.error_reply("ERR drop_many wants 'delayed' or 'dead' and 1 to 1000 ids")
end
local dropped = {}
for i = 2, #ARGV do
    local id = ARGV[i]
    if redis.call('ZREM', from, id) == 1 then
        forget(id)
        dropped[#dropped + 1] = id
    end
end
return dropped
