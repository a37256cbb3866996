"""Which path a call takes: parked, tracked, or Celery's own.

Every call of an app with the extension comes to its ``send_task`` (``apply_async``, signatures, canvas, retries,
``send_task`` by name). What becomes of it is decided here, in one pure function of the facts the extension looks
up about the call (:class:`Call`), so that the rule has one place and a table can test every row of it
(``tests/test_paths.py`` reads the table of ``docs/how-it-works.rst``, section "Which path a call takes").
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Call", "Path", "may_leave_celery", "path"]


class Path(enum.Enum):
    """Where a call goes."""

    #: Celery's own ``send_task``: published to the broker as without the extension.
    CELERY = "celery"
    #: Parked in the delay set (its due time, or due now behind its limits), released by a tick or a releaser.
    PARK = "park"
    #: Due now, tracked: stored in flight and pushed onto its queue in one script (``send.lua``).
    TRACK = "track"


@dataclass(frozen=True, slots=True)
class Call:
    """The facts about one call that decide its path (each False unless said).

    ``ours``: a task of this extension (``@rd.delayed``, ``@rd.batched``, a task of ``rd.Task``) parking in this
    app's store. ``adopted``: a plain task of the app that the all-tasks mode may park (not Celery's own, not the
    extension's, not one with ``redisdelay_park = False``). ``protocol_1``: ``task_protocol = 1`` is set, whose
    messages cannot be stored. ``own_producer``: a park of ours going through Celery's ``send_task`` to build its
    message. The rest say what they say.
    """

    ours: bool = False
    own_producer: bool = False
    protocol_1: bool = False
    all_tasks: bool = False  # redisdelay_all_tasks
    adopted: bool = False
    later: bool = False  # a countdown or an eta in the future
    limited: bool = False  # the task is under limits (redisdelay_limit_* options, redisdelay_task_limits)
    tracked: bool = False  # its calls due now are tracked (redisdelay_track_due_now, the broker, the task's option)
    opted_out: bool = False  # this call says apply_async(..., redisdelay_track=False)


def path(call: Call) -> Path:
    """The path of ``call``; the rows of the table in ``docs/how-it-works.rst`` in order, the first that holds."""
    if call.own_producer:
        return Path.CELERY  # the message of one of our parks, being built: Celery's send_task hands it back to us
    if call.ours:
        return Path.PARK  # a delayed task's call always waits in Redis (protocol 1 is refused there, loudly)
    if call.protocol_1 or not (call.all_tasks and call.adopted):
        return Path.CELERY
    if call.later or call.limited:
        return Path.PARK  # a limited task's calls wait on their limits, due now too
    if call.tracked and not call.opted_out:
        return Path.TRACK  # due now, or at an eta already past
    return Path.CELERY


def may_leave_celery(
    *, explicit: bool, protocol_1: bool, all_tasks: bool, waits: bool, limited: bool, tracked: bool
) -> bool:
    """Whether a call may take another path than Celery's, from what is known before its arguments are bound:
    ``explicit``, a name of the extension's tasks; ``waits``, a countdown or an eta given at all (a call
    :func:`path` parks for being ``later`` has one); ``tracked``, as in :class:`Call`, and not opted out.
    False only where :func:`path` gives :attr:`Path.CELERY` whatever the rest (``tests/test_paths.py`` checks
    it for every combination): most calls of an app without the all-tasks mode stop here, at no cost."""
    if explicit:
        return True
    return not protocol_1 and all_tasks and (waits or limited or tracked)
