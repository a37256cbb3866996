"""A web request's view of ``delay_on_commit``: ``python -m tests.django_proj.scenario KEY`` prints JSON."""

from __future__ import annotations

import json
import sys

import django
from django.db import transaction


def main(key: str) -> None:
    django.setup()
    from tests.django_proj.celery_app import rd, record

    with transaction.atomic():
        record.delay_on_commit(key, "committed")
        inside = rd.stats()["delayed"]
    after_commit = rd.stats()["delayed"]
    try:
        with transaction.atomic():
            record.delay_on_commit(key, "rolled back")
            raise RuntimeError("the view failed")
    except RuntimeError:
        pass
    print(
        json.dumps(
            {
                "inside": inside,
                "after_commit": after_commit,
                "after_rollback": rd.stats()["delayed"],
                "classes": [cls.__name__ for cls in record.__class__.__mro__],
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
