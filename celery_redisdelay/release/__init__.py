"""The release: due calls go to the broker, and calls whose run timed out come back.

:mod:`.releaser` is one tick (sweep, batch flush, release; the fast path pushes stored broker messages in
the release script itself), :mod:`.precise` the releaser that sleeps until the next call is due.
"""
