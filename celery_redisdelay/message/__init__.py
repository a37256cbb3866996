"""What a parked call is: Celery's message as built, kept in the form its broker takes.

:mod:`.envelope` is the message minus its eta (any broker), :mod:`.wire` the exact message kombu's Redis
transport pushes (the fast release path), :mod:`.stored` the one place that writes and reads either, and
a flushed batch. Nothing here talks to Redis.
"""
