"""Found by review (thirty-first session), failing before its mend: a sync next run
interrupted (KeyboardInterrupt from a signal handler) right as its registration is made
(dynasem/_engine/coalescing.py acquire())."""

from __future__ import annotations

import time
from typing import Any

import pytest

from dynasem import Coalesced, SemaphoreBusy, semaphore
from dynasem._engine import coalescing, heartbeat
from dynasem._engine.coalescing import Registration
from dynasem.testing import held_elsewhere
from tests.engine.test_coalesce import registered


def test_a_next_run_interrupted_as_it_registers_is_withdrawn(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """acquire(): ``registration = register(sem, busy)`` returns a Registration whose
    heartbeat already runs; a KeyboardInterrupt landing before the ``try`` that withdraws
    it (the assignment, ``if registration is None``) leaves it renewed by its heartbeat for
    as long as the process lives, with nobody to run: every busy caller meanwhile is
    answered Coalesced and its work is never run (the async path withdraws a registration
    cut off by a cancel: test_an_async_registration_cut_off_by_the_loop_ending_is_withdrawn).
    The interrupt is modelled as raised right after register() returned."""
    real = coalescing.register

    def interrupted_on_return(*args: Any) -> Any:
        real(*args)
        raise KeyboardInterrupt  # a signal's exception, in acquire() after the call returned

    with held_elsewhere("rebuild:interrupted"):
        monkeypatch.setattr(coalescing, "register", interrupted_on_return)
        with pytest.raises(KeyboardInterrupt):
            with semaphore("rebuild:interrupted", coalesce=True, wait=30, lease=2):
                pytest.fail("the block must not run")
        monkeypatch.setattr(coalescing, "register", real)
        time.sleep(3.0)  # its 2 s lease and CLOCK_SKEW (0.5 s) passed: nobody renews it
        left = registered("rebuild:interrupted")
        # The next busy caller must be the next run (here its short wait runs out), not be
        # coalesced onto a registration nobody will run.
        with pytest.raises(SemaphoreBusy) as caught:
            with semaphore("rebuild:interrupted", coalesce=True, wait=0.3):
                pass
        orphans = [hb for hb in heartbeat.scheduled() if isinstance(hb.held, Registration)]
        for hb in orphans:  # not left renewing into the next tests of this worker
            hb.stop()
        assert not isinstance(caught.value, Coalesced), (
            f"coalesced onto a registration nobody runs: {left}; renewed by {orphans}"
        )
