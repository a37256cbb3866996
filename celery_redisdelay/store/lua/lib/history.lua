-- history.lua: Running totals and their per-minute history (the dashboard's charts).
-- requires: clock

-- History: every total is also counted per minute, so the dashboard can show what happened over time.
-- A minute is forgotten once it is HISTORY_MINUTES old (prune_history, run by the sweep of every tick).
local history_minute = nil  -- the minute of now_ms(), as the history's fields spell it

-- Add ``n`` to the running total ``name`` and to its count for the current minute.
local function count(name, n)
    redis.call('HINCRBY', COUNTERS, name, n)
    if not history_minute then
        history_minute = string.format('%d', math.floor(now_ms() / 60000))
    end
    redis.call('HINCRBY', HISTORY, history_minute .. ':' .. name, n)
end

-- The names counted per minute: every one a minute can hold, so a minute is forgotten in one HDEL.
local HISTORY_NAMES = {'parked', 'released', 'acked', 'revoked', 'expired', 'swept', 'dead_lettered', 'worker_lost',
    'cancelled', 'limited',
    'late_le_5', 'late_le_10', 'late_le_25', 'late_le_50', 'late_le_100', 'late_le_250', 'late_le_500',
    'late_le_1000', 'late_le_2500', 'late_le_5000', 'late_le_10000', 'late_le_30000', 'late_le_60000', 'late_le_inf'}
-- At most this many minutes are forgotten per call, so the work is bounded even after a long pause.
local PRUNE_MINUTES = 10

-- Forget the minutes that are HISTORY_MINUTES old, from the oldest not yet forgotten on.
local function prune_history(now)
    local horizon = math.floor(now / 60000) - HISTORY_MINUTES  -- the newest minute to forget
    local pruned = tonumber(redis.call('HGET', HISTORY, 'pruned'))
    if not pruned then
        -- The first sweep: what was counted before it is less than a day old, since a tick sweeps every few
        -- seconds wherever calls are released (NoReleaser alerts otherwise). Kept out of count(), which
        -- every ack runs.
        redis.call('HSET', HISTORY, 'pruned', string.format('%d', horizon))
        return
    end
    local last = math.min(pruned + PRUNE_MINUTES, horizon)
    if last <= pruned then
        return
    end
    local fields = {}
    for minute = pruned + 1, last do
        local prefix = string.format('%d', minute) .. ':'
        for _, name in ipairs(HISTORY_NAMES) do
            fields[#fields + 1] = prefix .. name
        end
    end
    redis.call('HDEL', HISTORY, unpack(fields))
    redis.call('HSET', HISTORY, 'pruned', string.format('%d', last))
end
