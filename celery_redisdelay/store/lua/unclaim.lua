-- unclaim.lua: publishing failed; give claimed calls back, due at once, without counting a delivery (and the
-- concurrency slots they took).
-- ARGV: ids
-- Returns: how many calls went back.
-- requires: clock, limits, meta
local now = now_ms()
local returned = 0
for _, id in ipairs(ARGV) do
    local meta = load_meta(id)
    if meta.s == 'claimed' and redis.call('ZREM', INFLIGHT, id) == 1 then
        meta.s = 'delayed'
        meta.d = math.max((tonumber(meta.d) or 1) - 1, 0)
        free_slots(id, meta)
        save_meta(id, meta)
        redis.call('ZADD', DELAYED, now, id)
        if type(meta.k) == 'string' then
            redis.call('HSETNX', INDEX, meta.k, id)  -- parked again: it holds its key unless a newer call took it
        end
        returned = returned + 1
    end
end
return returned
