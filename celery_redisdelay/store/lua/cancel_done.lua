-- cancel_done.lua: the calls cancel.lua dropped are recorded revoked; a cancel sent again finds nothing left to
-- record (it still answers that they are cancelled).
-- KEYS[FIXED_KEYS + 1]: the unrecorded hash of cancel.lua.
-- ARGV: the ids (1 to 1000)
-- Returns: how many were waiting to be recorded.
local wrong = check_type(KEYS[FIXED_KEYS + 1], 'hash')
if wrong then
    return wrong
end
if #ARGV < 1 or #ARGV > 1000 then
    return redis.error_reply('ERR cancel_done wants 1 to 1000 ids')
end
return redis.call('HDEL', KEYS[FIXED_KEYS + 1], unpack(ARGV))
