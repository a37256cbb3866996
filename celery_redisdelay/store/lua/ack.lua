-- ack.lua: the call is finished as Celery sees it; forget it (see ack_call in lib/runs.lua), counting how it
-- ended: 'acked' (a worker ran it to an end: success, a failure Celery does not retry, Ignore, Reject),
-- 'revoked' or 'expired' (a worker discarded it unrun, as Celery discards a revoked or expired message).
-- A worker's acknowledgements are written in batches by track.lua; this one is for a single call.
-- ARGV: 1 id, 2 the counter of the outcome ('acked' | 'revoked' | 'expired')
-- Returns: 1 if the call was tracked, else 0.
-- requires: runs
return ack_call(ARGV[1], ARGV[2])
