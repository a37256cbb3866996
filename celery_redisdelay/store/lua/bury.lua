-- bury.lua: dead-letter one call with a reason (for example, an envelope the releaser cannot decode,
-- or a task the worker does not know). An id the store does not hold is left alone: a late bury
-- (say, after a slow publish) must not resurrect a call that was acknowledged or cancelled meanwhile.
-- ARGV: 1 id, 2 reason, 3 '1' to bury only a call that is in flight (else any call we hold)
-- Returns: 1 buried, 0 not held (or, with ARGV[3] = '1', not in flight); nothing changed then.
-- requires: calls, clock, meta
local id = ARGV[1]
local inflight = redis.call('ZSCORE', INFLIGHT, id)
if ARGV[3] == '1' and not inflight then
    return 0
end
if not (inflight or redis.call('ZSCORE', DELAYED, id) or redis.call('ZSCORE', DEAD, id)) then
    return 0
end
bury(id, inflight and load_inflight_meta(id) or load_meta(id), ARGV[2], now_ms())
return 1
