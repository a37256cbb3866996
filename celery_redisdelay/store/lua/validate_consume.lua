-- validate_consume.lua: one delivery of a validation message (the consumer of validation.py).
-- Every fail_every-th delivery of the run fails (counted across the run, over the messages the consumer
-- takes); the others record the message as processed.
-- KEYS: 1 processed (hash: message number -> times processed), 2 counters (hash)
-- ARGV: 1 message number, 2 fail_every (0: never fail)
-- Returns: 1 processed, 0 failed on purpose.
local delivery = redis.call('HINCRBY', KEYS[2], 'deliveries', 1)
local fail_every = tonumber(ARGV[2])
if fail_every > 0 and delivery % fail_every == 0 then
    redis.call('HINCRBY', KEYS[2], 'failures', 1)
    return 0
end
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
return 1
