-- cancel.lua: drop calls that are still waiting in the delay set (or in their gate, or on a pause), with their payload,
-- metadata and unique/debounce index entry; each is counted. Ids not parked here are left alone.
-- ARGV: the ids (1 to 1000)
-- Returns: {id, payload, ...} for each call dropped (its payload, so the caller can record its result
-- as revoked the way Celery would).
if #ARGV < 1 or #ARGV > 1000 then
    return redis.error_reply('ERR cancel wants 1 to 1000 ids')
end
local dropped = {}
-- A call waiting in its gate (due, held back by its limits; see prelude.lua) is still parked, and so is a call set
-- aside on a pause (its metadata notes its member of PAUSED, see set_aside).
local function unpark(id)
    if redis.call('ZREM', DELAYED, id) == 1 then
        return true
    end
    local meta = load_meta(id)
    if meta.s == 'limited' and type(meta.lg) == 'string' and tonumber(meta.lw)
            and redis.call('ZREM', GATED, gated_member(meta.lg, tonumber(meta.lw), id)) == 1 then
        return true
    end
    return type(meta.pz) == 'string' and tonumber(meta.pd) ~= nil
        and redis.call('ZREM', PAUSED, paused_member(meta.pz, tonumber(meta.pd), id)) == 1
end

for _, id in ipairs(ARGV) do
    if unpark(id) then
        dropped[#dropped + 1] = id
        dropped[#dropped + 1] = redis.call('HGET', PAYLOADS, id) or ''
        forget(id)
    end
end
if #dropped > 0 then
    count('cancelled', #dropped / 2)
end
return dropped
