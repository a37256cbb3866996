"""The worker side: a released call is tracked from its start to its end, and revokes are made durable.

:mod:`.tracking` hooks Celery's task signals (start, acknowledgement, the failures a worker records
itself); :mod:`.revocation` ends a parked call unrun as Celery ends a revoked task.
"""
