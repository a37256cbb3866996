-- clock.lua: The Redis clock, read once per script, and times as scripts take and write them.

-- The Redis clock, read once per script: a script is one instant (and one TIME is all it costs).
local script_now = nil
local function now_ms()
    if not script_now then
        local t = redis.call('TIME')
        script_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
    return script_now
end

-- A due time from a script's (mode, ms) arguments: 'in' ms from now by the Redis clock, or 'at' ms.
local function due_time(mode, ms)
    if mode == 'in' then
        return now_ms() + tonumber(ms)
    end
    return tonumber(ms)
end

-- days_from_civil, inverted), which Redis's Lua has no os.date for.
local function utc_text(ms)
    local seconds = math.floor(ms / 1000)
    local z = math.floor(seconds / 86400) + 719468
    local era = math.floor(z / 146097)
    local doe = z - era * 146097
    local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
    local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
    local mp = math.floor((5 * doy + 2) / 153)
    local month = mp < 10 and mp + 3 or mp - 9
    local year = yoe + era * 400 + (month <= 2 and 1 or 0)
    local rest = seconds % 86400
    return string.format('%04d-%02d-%02dT%02d:%02d:%02d.%03dZ', year, month, doe - (365 * yoe + math.floor(yoe / 4)
        - math.floor(yoe / 100)) - math.floor((153 * mp + 2) / 5) + 1, math.floor(rest / 3600),
        math.floor(rest % 3600 / 60), rest % 60, ms % 1000)
end
