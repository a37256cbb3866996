"""The store: parked calls in Redis, and every change of their state as one atomic script.

:mod:`.keys` names the keys, :mod:`.meta` types a call's metadata, :mod:`.scripts` loads ``lua/`` (one
script per state change) and :mod:`.evalsha` sends them; :mod:`.calls` is one shard's store (made of one
part per Redis structure, each in its own module, on :mod:`.base`), :mod:`.shards` all of them;
:mod:`.connection` makes the Redis client (a server, a Cluster, Sentinel) and :mod:`.forks` keeps it
usable in a forked child.
"""
