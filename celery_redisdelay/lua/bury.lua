-- bury.lua: dead-letter one call with a reason (for example, an envelope the releaser cannot decode).
-- ARGV: 1 id, 2 reason
-- Returns: 1
bury(ARGV[1], load_meta(ARGV[1]), ARGV[2], now_ms())
return 1
