-- delivery.lua: whether a delivery a worker received again is the call's current one. kombu restores the
-- deliveries a dead worker held after its visibility timeout, a broker such as RabbitMQ requeues them at once,
-- and the sweep delivers the call again once its lease runs out: a worker asks before it runs a message that
-- says it was redelivered (worker/stale.py), so that one delivery runs, not two.
-- A copy can also come while the delivery is still held: kombu restores a message a live worker has held
-- longer than the visibility timeout (kombu#337), and the messages of a connection that was dropped. The worker
-- that holds it under a lease that has not run out runs it; should that worker die, the lease runs out and the
-- sweep delivers the call again. So a copy another worker receives meanwhile is stale.
-- A retry (self.retry) parks the call again under its id, and its deliveries count from 1 again: a copy of an earlier
-- attempt's message (kombu restores those of a dropped connection) would pass for the retry's own delivery of the
-- same number. Its Celery 'retries' header tells them apart: it must be the stored message's.
-- An AMQP broker (RabbitMQ) redelivers a message itself only once the channel it went out on closed: whoever held the
-- call can no longer acknowledge that delivery. Such a copy (ARGV[5] '1') is not stale for the holder's lease, and
-- the call leaves its holder, so that the lease of the worker that received the copy takes it at once; else the
-- sweep would deliver the call again when the old lease ran out, while the copy waited in the new worker's prefetch.
-- But for a run started at most once (meta.c, Celery's early acknowledgement): the copy comes of an acknowledgement
-- the broker lost, and is stale.
-- ARGV: 1 id, 2 the delivery's number (its tag '<id>.<n>', or its x-redisdelay-delivery header), 3 the worker
-- asking ('' when not said), 4 the message's 'retries' header ('' when it has none), 5 '1' when the broker itself
-- redelivered the message (AMQP), else '' or absent
-- Returns: 1 current: the call is in flight, no later delivery was made and no other worker holds it under a
-- live lease, or the sweep put this delivery's call back and has not delivered it again yet (the start takes it
-- back); 0 stale: a later delivery was made, another worker holds it, the message is of another attempt, or the
-- call is finished, cancelled, parked again (a retry, a lock's deferral) or dead-lettered.
-- requires: clock, meta
local id, n, worker = ARGV[1], tonumber(ARGV[2]), ARGV[3] or ''
-- Whether the message is another attempt than the stored one: a broker message and an envelope both keep Celery's
-- headers under "headers". Unknown either way (no header, a batch, a payload that is not JSON): not another.
local function another_attempt()
    local retries = tonumber(ARGV[4] or '')
    local stored = retries and redis.call('HGET', PAYLOADS, id)
    if not stored then
        return false
    end
    local ok, data = pcall(cjson.decode, stored)
    local headers = ok and type(data) == 'table' and data.headers
    local kept = type(headers) == 'table' and tonumber(headers.retries)
    return kept ~= nil and kept ~= false and kept ~= retries
end
local deadline = redis.call('ZSCORE', INFLIGHT, id)
if deadline then
    local meta = load_inflight_meta(id)
    if (tonumber(meta.d) or 0) > n or another_attempt() then
        return 0
    end
    local holder = meta.h
    if ARGV[5] == '1' then
        if meta.s == 'running' and meta.c then
            -- The run started, and its task runs at most once past a start (Celery's early acknowledgement): the
            -- broker kept the message because that acknowledgement was lost (a broker restart, a dropped
            -- connection). Should the run be cut short, the sweep dead-letters it.
            return 0
        end
        if type(holder) == 'string' and holder ~= worker then
            meta.h, meta.g = nil, nil
            save_meta(id, meta)
        end
        return 1
    end
    return (type(holder) == 'string' and worker ~= '' and holder ~= worker and tonumber(deadline) >= now_ms()) and 0 or 1
end
local meta = load_meta(id)
if meta.s == 'swept' and redis.call('ZSCORE', DELAYED, id) and (tonumber(meta.d) or 0) == n and not another_attempt() then
    return 1
end
return 0
