-- bury.lua: dead-letter one call with a reason (for example, an envelope the releaser cannot decode,
-- or a task the worker does not know).
-- ARGV: 1 id, 2 reason, 3 '1' to bury only a call that is in flight (else any call we hold)
-- Returns: 1 buried, 0 not in flight (with ARGV[3] = '1'; nothing changed).
if ARGV[3] == '1' and not redis.call('ZSCORE', INFLIGHT, ARGV[1]) then
    return 0
end
bury(ARGV[1], load_meta(ARGV[1]), ARGV[2], now_ms())
return 1
