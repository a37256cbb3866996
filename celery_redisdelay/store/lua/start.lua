-- start.lua: a worker starts running a call (see start_call in lib/runs.lua); the run deadline starts now.
-- A worker's starts are written in batches by track.lua; this one is for a single call.
-- ARGV: 1 id, 2 default run timeout (ms), 3 lease (ms; 0: none), 4 the worker running it
-- Returns: 1 tracked, 2 taken back from the delay set, 0 unknown (cancelled, acknowledged or never parked).
-- requires: runs
return start_call(ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]) or 0, ARGV[4] or '')
