-- confirm.lua: the broker has the claimed calls; give each the deadline for waiting in the broker queue.
-- ARGV: 1 default queue timeout (ms), 2.. ids
-- Returns: how many calls were confirmed.
-- requires: clock, meta
local now = now_ms()
local confirmed = 0
for i = 2, #ARGV do
    local id = ARGV[i]
    local meta = load_meta(id)
    if meta.s == 'claimed' and redis.call('ZSCORE', INFLIGHT, id) then
        meta.s = 'queued'
        save_meta(id, meta)
        redis.call('ZADD', INFLIGHT, now + (tonumber(meta.q) or tonumber(ARGV[1])), id)
        confirmed = confirmed + 1
    end
end
return confirmed
