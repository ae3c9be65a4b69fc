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


def wait_events(
    path: Path, event: str, count: int = 1, *, timeout: float = 30.0, tails: Any = None
) -> list[dict[str, Any]]:
    """The ``event`` lines once there are ``count`` of them (tests/conftest.py's wait_for);
    the workers' logs (``tails()``) in the failure."""
    from tests.support.helpers import wait_for

    def found() -> list[dict[str, Any]]:
        lines = [e for e in read_events(path) if e["event"] == event]
        return lines if len(lines) >= count else []

    try:
        return wait_for(found, timeout, f"{count} {event!r} line(s)")  # type: ignore[no-any-return]
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{tails() if tails else ''}") from None
