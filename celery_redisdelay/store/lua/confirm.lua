-- confirm.lua: the broker has the claimed calls; give each the deadline for waiting in the broker queue.
-- ARGV: 1 default queue timeout (ms), 2 the longest wait (ms; 0: none, the call's own queue timeout), 3.. ids
-- Returns: how many calls were confirmed.
-- requires: clock, meta
local now = now_ms()
local confirmed = 0
local longest = tonumber(ARGV[2]) or 0
for i = 3, #ARGV do
    local id = ARGV[i]
    local meta = load_meta(id)
    if meta.s == 'claimed' and redis.call('ZSCORE', INFLIGHT, id) then
        meta.s = 'queued'
        save_meta(id, meta)
        local wait = tonumber(meta.q) or tonumber(ARGV[1])
        if longest > 0 and longest < wait then
            wait = longest
        end
        redis.call('ZADD', INFLIGHT, now + wait, id)
        confirmed = confirmed + 1
    end
end
return confirmed
