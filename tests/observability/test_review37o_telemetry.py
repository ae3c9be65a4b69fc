"""Review (thirty-seventh session, o): an interrupt in telemetry after a release's
give-back. The SDK's in-memory exporter, on DynamoDB Local."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from dynasem import semaphore
from dynasem._observability import telemetry
from dynasem._operators import locks as operations
from dynasem.signals import lock_released
from tests.observability.test_telemetry import otel  # noqa: F401 - the fixture

pytestmark = pytest.mark.usefixtures("otel")


@pytest.fixture
def released() -> Iterator[list[str]]:
    sent: list[str] = []

    def heard(sender: Any, resource: str, **kwargs: Any) -> None:
        sent.append(resource)

    lock_released.connect(heard, weak=False, dispatch_uid="review37o-released")
    yield sent
    lock_released.disconnect(dispatch_uid="review37o-released")


def test_an_interrupt_as_the_release_span_ends_still_sends_lock_released(
    monkeypatch: pytest.MonkeyPatch, released: list[str]
) -> None:
    """A span processor's ``on_end`` (run by the SDK in ``span.end()``) interrupted (Ctrl-C,
    a task's time limit raised from a signal handler) once the hold was given back: the
    interrupt goes on, and lock_released is sent first. It was never sent: a receiver that
    keeps a ledger of holds (an audit table, a gauge) counted the lock held for good."""
    res = f"tel37o:{uuid.uuid4().hex}"
    held = semaphore(res, lease=30).acquire()
    end = telemetry.releasing._end

    def interrupted(self: Any, *args: Any) -> None:
        end(self, *args)
        raise KeyboardInterrupt

    monkeypatch.setattr(telemetry.releasing, "_end", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            held.release()
        assert operations.holds_on(res) == []  # given back ...
        assert released == [res]  # ... and said so
    finally:
        for found in operations.holds_on(res):
            operations.break_hold(res, found.token)
