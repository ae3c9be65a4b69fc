"""test_unique_tasks.py's enqueuing process: ``python -m tests.support.unique_enqueue N KEYS SEED``
enqueues ``tests.support.unique_tasks.unique_work`` N times over KEYS keys, 0.1 s apart, each run
taking 0.3-0.6 s, and prints one JSON line per enqueue: its key, n, the time it returned and
the task result's id (None: refused, the key was held)."""

from __future__ import annotations

import json
import os
import random
import sys
import time

import django

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.support.tasks_db_settings"
django.setup()

from tests.support.unique_tasks import unique_work  # noqa: E402


def main(count: int, keys: int, seed: int) -> None:
    rng = random.Random(seed)
    for n in range(count):
        key = f"k{n % keys}"
        result = unique_work.enqueue(key, n, rng.uniform(0.3, 0.6))
        # Queued at the latest by now (the claim is written during the call).
        queued = time.time()
        line = {
            "key": key,
            "n": n,
            "queued": queued,
            "id": None if result is None else str(result.id),
        }
        print(json.dumps(line), flush=True)
        time.sleep(0.1)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
