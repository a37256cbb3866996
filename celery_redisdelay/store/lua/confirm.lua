-- confirm.lua: the broker has the claimed calls; give each the deadline for waiting in the broker queue.
-- ARGV: 1 default queue timeout (ms), 2 the longest wait (ms; 0: none, the call's own queue timeout), then id,
-- delivery for each call: the delivery its claim made (0: any). A releaser whose claim ran out before it got here
-- (the sweep put the call back, another releaser claimed it again) must not confirm the other's claim.
-- Returns: how many calls were confirmed.
-- requires: clock, meta
local now = now_ms()
local confirmed = 0
local longest = tonumber(ARGV[2]) or 0
for i = 3, #ARGV, 2 do
    local id, delivery = ARGV[i], tonumber(ARGV[i + 1])
    local meta = load_meta(id)
    if meta.s == 'claimed' and (delivery == 0 or tonumber(meta.d) == delivery) and redis.call('ZSCORE', INFLIGHT, id) then
        meta.s = 'queued'
        save_meta(id, meta)
        -- A worker may have received the call and taken it under its lease before the releaser got here (an AMQP
        -- broker confirms each publish before the store hears of it): its lease's deadline stands.
        if meta.h == nil then
            local wait = tonumber(meta.q) or tonumber(ARGV[1])
            if longest > 0 and longest < wait then
                wait = longest
            end
            redis.call('ZADD', INFLIGHT, now + wait, id)
        end
        confirmed = confirmed + 1
    end
end
return confirmed
