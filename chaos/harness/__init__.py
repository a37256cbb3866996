"""The harness both chaos runs stand on: the validation's (``python -m chaos``) and the battle's
(``python -m chaos.battle``).

Each module is one concern the two share, with the difference between them a parameter:

* :mod:`chaos.harness.console`: the lines a run says as it goes, timed from its start;
* :mod:`chaos.harness.lifecycle`: a run's seed and directory, SIGTERM made an exit, a failure reported;
* :mod:`chaos.harness.ledger`: what the producer was told was stored, the runs the workers made and the
  messages they received, as records written the moment they happen where no fault reaches (a file of the
  runner and a file per worker process for the validation, whose faults kill the store's Redis; a redis-server
  of its own for the battle), and read back;
* :mod:`chaos.harness.sending`: the producers' pace, and a send made again until Redis takes it, each
  refusal noted (what the ledger records as sent, and as sent twice);
* :mod:`chaos.harness.settle`: whether anything is left that could deliver a call, and the drain that
  waits until every call ran or nothing has been left in flight for a while;
* :mod:`chaos.harness.attribution`: Redis's own loss bound and the faults on a timeline, to which losses and
  duplicates are tied;
* :mod:`chaos.harness.report`: the summary table's layout, the fault counts, the verdict line, and the
  report written as JSON with the logs kept or deleted.

The validation judges its 0..N-1 (every message processed, a duplicate allowed when an acknowledgement
was lost); the battle judges the delivery contract (a run cut short of a task that acknowledges early is
dead-lettered, not lost). Those judgements stay with each (``chaos/outcome.py``, ``chaos/battle/analysis.py``).
"""
