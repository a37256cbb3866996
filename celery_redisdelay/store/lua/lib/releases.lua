-- releases.lua: What each release counts: lateness per bucket.
-- requires: history

-- Release lateness for metrics: how long after its due time each call left the delay set, counted
-- per bucket (upper bounds in ms; the last bucket is unbounded), with the total. ``rows`` is a
-- ZRANGEBYSCORE ... WITHSCORES reply, oldest first, so lateness only falls along it: the calls no later
-- than a bound are a tail of the rows, found by bisection. ``skipped[i]`` marks the i-th call as not
-- released (dead-lettered instead); with any, or when the rows are ``unsorted``, each call is looked at instead.
local function count_releases(rows, skipped, now, unsorted)
    local n = #rows / 2
    local counts, total, sum = {}, 0, 0
    if next(skipped) == nil and not unsorted then
        -- cumulative[b]: calls at most LATENESS_BOUNDS[b] late, the rows from the first due at or
        -- after now - bound (a bisection over the due times)
        local previous = 0
        for b, bound in ipairs(LATENESS_BOUNDS) do
            local low, high = 1, n + 1
            while low < high do
                local middle = math.floor((low + high) / 2)
                if tonumber(rows[2 * middle]) >= now - bound then
                    high = middle
                else
                    low = middle + 1
                end
            end
            local within = n + 1 - low
            counts[b] = within - previous
            previous = within
        end
        counts[#LATENESS_BOUNDS + 1] = n - previous
        for i = 2, #rows, 2 do
            sum = sum + tonumber(rows[i])
        end
        total, sum = n, n * now - sum
    else
        local bucket = #LATENESS_BOUNDS + 1  -- the unbounded one; walks down as lateness falls
        for i = 2, #rows, 2 do
            if not skipped[i / 2] then
                local late = math.max(now - tonumber(rows[i]), 0)
                while bucket > 1 and late <= LATENESS_BOUNDS[bucket - 1] do
                    bucket = bucket - 1
                end
                counts[bucket] = (counts[bucket] or 0) + 1
                total = total + 1
                sum = sum + late
            end
        end
    end
    if total > 0 then
        count('released', total)
        redis.call('HINCRBY', COUNTERS, 'late_ms_sum', sum)
        for index, n in pairs(counts) do
            if n > 0 then
                count('late_le_' .. (LATENESS_BOUNDS[index] or 'inf'), n)
            end
        end
    end
end
