"""Telemetry met as an on-call engineer meets it (seventh review): a span's start cut short
by an interrupt in a release, an SDK that raises while recording, a provider configured
from the environment that cannot load. The SDK's in-memory reader and exporter, on
DynamoDB Local."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from dynasem import semaphore
from dynasem._engine import hold as holds_module
from dynasem._observability import telemetry
from dynasem._operators import locks as operations
from tests.observability.test_telemetry import (
    otel,  # noqa: F401 - the fixture, for every test here
)

pytestmark = pytest.mark.usefixtures("otel")


def resource() -> str:
    return f"tel37:{uuid.uuid4().hex}"


class _Refusing:
    """A tracer whose span of ``name`` is cut short as it starts (a span processor's
    ``on_start`` interrupted by Ctrl-C, a task's time limit raised from a signal handler)."""

    def __init__(self, tracer: Any, name: str) -> None:
        self._tracer, self._name = tracer, name

    def start_span(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if name == self._name:
            raise KeyboardInterrupt
        return self._tracer.start_span(name, *args, **kwargs)


def test_an_interrupt_as_the_release_span_starts_leaves_the_hold_to_be_given_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The release had begun (renewed no more, re-entered no more, ``release()`` again does
    nothing) when its span's start was interrupted: like an interrupted give-back, the hold
    must be among those given back at exit, not kept for nobody until its lease ends."""
    res = resource()
    held = semaphore(res, lease=30).acquire()
    refusing = _Refusing(telemetry._get().tracer, "dynasem.release")
    monkeypatch.setattr(telemetry, "_tracer", lambda: refusing)
    try:
        with pytest.raises(KeyboardInterrupt):
            held.release()
        monkeypatch.undo()
        assert held.released  # begun: a release() again gives back nothing
        assert held in holds_module.left_holds()  # ... so the exit must
        assert holds_module.give_back_left(held)
        assert operations.holds_on(res) == []
    finally:
        holds_module.forget_left()
        for found in operations.holds_on(res):
            operations.break_hold(res, found.token)
