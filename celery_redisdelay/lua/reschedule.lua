-- reschedule.lua: move a parked call to a new due time.
-- ARGV: 1 id, 2 'in' (ARGV[3] is a countdown) or 'at' (ARGV[3] is a due time), 3 milliseconds
-- Returns: the new due time (ms, server clock), or -1 when the call is not parked (released, gone).
local id = ARGV[1]
if not redis.call('ZSCORE', DELAYED, id) then
    return -1
end
local due = due_time(ARGV[2], ARGV[3])
local meta = load_meta(id)
if meta.s == 'deferred' then
    -- Moved by hand: it no longer waits for its lock, so the lock's release must not wake it early.
    meta.s = 'delayed'
    save_meta(id, meta)
end
redis.call('ZADD', DELAYED, due, id)
return due
