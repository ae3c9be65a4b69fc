"""What a documented install line must give a project (tests/project/test_install_lines.py).
Copied into an empty folder and run there by a fresh venv's Python, so that it sees nothing
but what that one line installed:

    python install_smoke.py lock       # a lock taken and given back on $SMOKE_ENDPOINT
    python install_smoke.py testing    # the same on dynasem.testing's embedded engine
    python install_smoke.py otel       # the same with opentelemetry-api imported
    python install_smoke.py enqueue    # two unique enqueues of one key: the first sent, the
                                       # second refused; waits for the worker's run
    celery -A install_smoke worker     # the Celery app below, on the Redis at $SMOKE_BROKER

The lock table is $SMOKE_TABLE (made by the test; the embedded engine's is made here); a run
of the task appends its id to $SMOKE_LOG. Prints one JSON line; exits non-zero on a failure.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes", "dynasem"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    USE_TZ=True,
    DYNASEM={
        "TABLE_NAME": os.environ.get("SMOKE_TABLE", "dynasem-install-smoke"),
        "ENDPOINT_URL": os.environ.get("SMOKE_ENDPOINT"),
        "REGION_NAME": "us-east-1",
        "LEASE": 30,
    },
)
django.setup()

from dynasem import semaphore  # noqa: E402

if "SMOKE_BROKER" in os.environ:  # the Celery app: the worker's, and the producer's
    from celery import Celery

    from dynasem.celery import UniqueTask

    app = Celery("install-smoke", broker=os.environ["SMOKE_BROKER"])
    app.conf.update(task_ignore_result=True, broker_connection_retry_on_startup=True)

    @app.task(bind=True, base=UniqueTask, name="smoke.work", unique_key="smoke:{n}")
    def work(self: Any, n: int) -> None:
        time.sleep(0.5)  # still running when the second enqueue comes
        with open(os.environ["SMOKE_LOG"], "a") as log:
            log.write(f"{self.request.id}\n")


def lock() -> dict[str, Any]:
    with semaphore("install-smoke", wait=5) as held:
        return {"fence": held.fence}


def on_embedded_engine() -> dict[str, Any]:
    from django.core.management import call_command
    from django.test import override_settings

    from dynasem.testing.embedded import EmbeddedDynamoDB

    with EmbeddedDynamoDB() as engine:
        moved = {**settings.DYNASEM, "ENDPOINT_URL": engine.endpoint_url}
        with override_settings(DYNASEM=moved):
            call_command("dynasem_createtable", "--wait", verbosity=0)
            return lock()


def with_otel() -> dict[str, Any]:
    from opentelemetry import metrics, trace

    return {**lock(), "otel": [metrics.__name__, trace.__name__]}


def enqueue() -> dict[str, Any]:
    first = work.delay(1)
    again = work.delay(1)
    log = Path(os.environ["SMOKE_LOG"])
    deadline = time.monotonic() + 60
    while first.id not in (log.read_text().split() if log.exists() else []):
        if time.monotonic() > deadline:
            raise SystemExit(f"the worker never ran {first.id}")
        time.sleep(0.1)
    return {
        "first": [first.id, first.enqueued],
        "again": [again.id, again.enqueued],
        "ran": log.read_text().split(),
    }


if __name__ == "__main__":
    checks = {"lock": lock, "testing": on_embedded_engine, "otel": with_otel, "enqueue": enqueue}
    print(json.dumps(checks[sys.argv[1]]()))
