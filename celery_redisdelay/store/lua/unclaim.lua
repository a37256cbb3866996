-- unclaim.lua: publishing failed; give claimed calls back, due at once, without counting a delivery (and the
-- concurrency slots they took).
-- ARGV: id, delivery for each call: the delivery its claim made (0: any). A releaser whose claim ran out (the sweep
-- put the call back, another releaser claimed it again) must not give back the other's claim.
-- Returns: how many calls went back.
-- requires: clock, limits, meta
local now = now_ms()
local returned = 0
for i = 1, #ARGV, 2 do
    local id, delivery = ARGV[i], tonumber(ARGV[i + 1])
    local meta = load_meta(id)
    if meta.s == 'claimed' and (delivery == 0 or tonumber(meta.d) == delivery) and redis.call('ZREM', INFLIGHT, id) == 1 then
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
