-- track.lua: the starts and acknowledgements one worker process gathered (worker/outbox.py), written in
-- one call, in the order they happened (see start_call and ack_call in lib/runs.lua).
-- ARGV: 1 default run timeout (ms), 2 lease (ms; 0: none), 3 the worker, then for each entry (at most a
--       thousand) an op and an id: op 's' start, 'S' a start of a run that is dead-lettered if it is cut short
--       with its worker (the task's contract, worker/contract.py), or the outcome of an acknowledgement
--       ('acked' | 'revoked' | 'expired')
-- Returns: the ids of the entries that found no call here (a start or an acknowledgement of a call this
-- shard does not know: the caller looks on the other shards while calls move between shards).
-- requires: runs
local default_run, lease, worker = tonumber(ARGV[1]), tonumber(ARGV[2]) or 0, ARGV[3]
local missed = {}
for i = 4, #ARGV, 2 do
    local op, id = ARGV[i], ARGV[i + 1]
    local found
    if op == 's' or op == 'S' then
        found = start_call(id, default_run, lease, worker, op == 'S')
    else
        found = ack_call(id, op)
    end
    if found == 0 then
        missed[#missed + 1] = id
    end
end
return missed
