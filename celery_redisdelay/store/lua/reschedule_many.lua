-- reschedule_many.lua: move parked calls to one new due time ("run now" is a due time of now; one call
-- is a list of one). A call deferred behind a lock no longer waits for it once moved by hand.
-- ARGV: 1 'in' (ARGV[2] is a countdown) or 'at' (ARGV[2] is a due time), 2 milliseconds, 3.. the ids (1 to 1000)
-- Returns: {the due time (ms, server clock), id of each call moved...}; ids not parked here are left out.
-- requires: clock, meta, wake
if #ARGV < 3 or #ARGV > 1002 or not tonumber(ARGV[2]) then
    return redis.error_reply('ERR reschedule_many wants a due time and 1 to 1000 ids')
end
local due = due_time(ARGV[1], ARGV[2])
local moved = {due}
for i = 3, #ARGV do
    local id = ARGV[i]
    if redis.call('ZSCORE', DELAYED, id) then
        local meta = load_meta(id)
        if meta.s == 'deferred' then
            meta.s = 'delayed'
            save_meta(id, meta)
        end
        moved[#moved + 1] = id
    end
end
if #moved > 1 then
    mark_if_earliest(due, moved[2])  -- one marker covers them all: they share the due time
    for i = 2, #moved do
        redis.call('ZADD', DELAYED, due, moved[i])
    end
end
return moved
