"""What the worker processes of the task tests write and the tests read back: one JSON line
per event, in the file named by ``DYNASEM_TEST_CELERY_LOG``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


def record(**event: Any) -> None:
    """One JSON line, appended with one write (O_APPEND: lines of several processes never
    interleave)."""
    line = json.dumps({"pid": os.getpid(), "t": time.time(), **event}) + "\n"
    fd = os.open(os.environ["DYNASEM_TEST_CELERY_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]
