-- cancel.lua: drop calls that are still waiting in the delay set, with their payload, metadata and
-- unique/debounce index entry; each is counted. Ids not parked here are left alone.
-- ARGV: the ids (1 to 1000)
-- Returns: {id, payload, ...} for each call dropped (its payload, so the caller can record its result
-- as revoked the way Celery would).
if #ARGV < 1 or #ARGV > 1000 then
    return redis.error_reply('ERR cancel wants 1 to 1000 ids')
end
local dropped = {}
for _, id in ipairs(ARGV) do
    if redis.call('ZREM', DELAYED, id) == 1 then
        dropped[#dropped + 1] = id
        dropped[#dropped + 1] = redis.call('HGET', PAYLOADS, id) or ''
        forget(id)
    end
end
if #dropped > 0 then
    count('cancelled', #dropped / 2)
end
return dropped
