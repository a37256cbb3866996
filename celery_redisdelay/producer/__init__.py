"""The producer side: the task classes whose calls park instead of publishing, and what parking needs.

:mod:`.task` (``DelayedTask``), :mod:`.batch` (``BatchedTask``), :mod:`.bulk` (``park_many``); a call is
parked through Celery's ``send_task`` with :mod:`.parking_producer`, or rendered from a kept template
(:mod:`.templates`, :mod:`.kept`) by :mod:`.parking`; :mod:`.schedule` turns countdown and eta into a due
time, :mod:`.locks` is the lock calls hold while they run.
"""
