-- wake.lua: Markers that wake precise releasers.

-- Precise releasers need no more markers than this: each one only says "look again now".
local MOST_MARKERS = 16

-- Tell precise releasers to look again now (a gate may go).
local function wake_releasers(now)
    redis.call('ZADD', WAKE, now, 'limits')
    redis.call('ZREMRANGEBYRANK', WAKE, MOST_MARKERS, -1)
end

-- Tell precise releasers (which wait on WAKE with BZPOPMIN) that a call (or a batch group's flush) is due
-- earlier than the call they sleep towards. Call it before adding the call to DELAYED.
local function mark_if_earliest(due, id)
    local first = redis.call('ZRANGE', DELAYED, 0, 0, 'WITHSCORES')
    if first[2] == nil or due < tonumber(first[2]) then
        redis.call('ZADD', WAKE, due, id)
        redis.call('ZREMRANGEBYRANK', WAKE, MOST_MARKERS, -1)
    end
end
