"""Celery's own integration tests (``t/integration`` of Celery's source distribution) run with the extension.

``python -m celery_suite`` (``python3 dev.py celery-suite``) fetches the sdist of the installed Celery, runs its
``test_tasks.py`` and ``test_canvas.py`` (``--full``: every file of ``t/integration`` that runs on a Redis broker
and backend, :mod:`.selection`) once per mode (:mod:`.modes`), compares the outcomes test by test and
fails when a test that passes with Celery alone does not pass with the extension, unless
:data:`.differences.DIFFERENCES` says why (a difference README "Differences" names). Nothing of Celery's is
copied into this repository: the sdist is kept in the gitignored ``.cache/``.
"""
