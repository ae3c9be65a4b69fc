"""Background work under review (eighth review, second round, helper g): the interrupt
windows left beside the mends of helper d. Each test says in its docstring what it shows and
whether it failed before its mend."""

from __future__ import annotations

from typing import Any

import pytest

from dynasem._background import unique
from dynasem._background.unique import claim
from dynasem._engine import heartbeat
from dynasem._operators.locks import holds_on

# dynasem's own re-entry rule (tests/conftest.py's no_reentry is off here).
pytestmark = pytest.mark.reentry


def _stop_renewing(resource: str) -> None:
    """Heartbeats of ``resource`` stopped: not left renewing into the next tests."""
    for beat in heartbeat.scheduled():
        if getattr(beat.held, "resource", None) == resource:
            beat.stop()


def test_a_give_back_interrupted_as_its_adoption_returns_frees_the_key(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``unique.give_back`` (a revoked task's key, an enqueue that could not be sent) frees
    a claim by adopting it and releasing the adoption: ``adopt(taken, wait=False).release()``.
    A KeyboardInterrupt (a signal handler's: a web worker's timeout, Ctrl-C, a soft time
    limit) landing after the adoption returned and before ``release()`` left the adopted
    hold renewed by its heartbeat as long as the process lived: the key held for nobody,
    every enqueue of it refused (the window ``unique.run`` had, fdace27). Modelled as
    raised right after ``adopt`` returned. Failed before its mend: the key still held."""
    real = unique.adopt

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        raise KeyboardInterrupt  # a signal's exception, the bytecode after the call

    resource = "rv38g:give-back-interrupted"
    carried = claim(resource, "task-1", queue_lease=30)
    monkeypatch.setattr(unique, "adopt", interrupted)
    with pytest.raises(KeyboardInterrupt):
        unique.give_back(carried)
    monkeypatch.undo()
    left = holds_on(resource)
    _stop_renewing(resource)
    assert left == [], "the key is held by an adoption nobody gives back"
    claim(resource, "task-2", queue_lease=30)  # free for the next enqueue
