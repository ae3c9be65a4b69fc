"""Review 38 (helper j): second round on the decorator's and the acquire's box mends."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from django.dispatch import Signal

from dynasem import SemaphoreBusy, semaphore
from dynasem._operators.locks import holds_on
from dynasem.signals import lock_acquired, lock_busy
from dynasem.testing import held_elsewhere


@pytest.mark.reentry
@pytest.mark.parametrize("signal", ["lock_acquired", "lock_busy"])
def test_a_receivers_block_reentering_a_held_lock_keeps_it_when_the_acquire_fails(
    lock_table, signal
):
    """A sync receiver of ``lock_acquired`` or ``lock_busy`` runs in the acquiring thread,
    before the acquire returns: a block it entered and left (an audit trail's, under a lock
    this thread's outer block holds: re-entered) was put in that acquire's box of holds not
    yet delivered, although the receiver had it and gave its level back. When the acquire
    then failed (busy; or a receiver raised), it gave back what its box held: the outer
    block's own hold, released while that block still ran, free for anyone."""

    def audit(sender: Any, **kwargs: Any) -> None:
        if kwargs["resource"] != "r38j-main":
            return
        with semaphore("r38j-outer"):  # re-entered: this thread's outer block holds it
            pass
        if signal == "lock_acquired":
            raise RuntimeError("the audit database is down")

    busy = signal == "lock_busy"
    receivers = lock_busy if busy else lock_acquired
    receivers.connect(audit, weak=False, dispatch_uid="review38j-audit")
    try:
        with held_elsewhere("r38j-main") if busy else contextlib.nullcontext():
            with semaphore("r38j-outer"):
                with pytest.raises(SemaphoreBusy if busy else RuntimeError):
                    with semaphore("r38j-main", wait=0):
                        pass
                inside = len(holds_on("r38j-outer"))
    finally:
        receivers.disconnect(dispatch_uid="review38j-audit")
    assert inside == 1, f"holders of r38j-outer while its block ran: {inside}"
    assert holds_on("r38j-outer") == [] and holds_on("r38j-main") == []


def test_two_async_receivers_of_one_signal_keep_their_holds_apart(lock_table):
    """Django's ``Signal.asend`` (5.2 on) runs async receivers as tasks of a TaskGroup that
    share one copied context: what one sets there, the other reads. Two receivers that each
    take a lock (an audit trail's, a cache's) shared the box of holds not yet delivered: the
    first one's hold, taken while the second's acquire was under way, went into the
    second's box, and that acquire, busy, gave it back while the first was inside its block:
    its lock free for anyone."""
    seen: list[int] = []
    signal = Signal()

    async def audit(sender: Any, **kwargs: Any) -> None:
        async with semaphore("r38j-audit"):
            await cache_done.wait()
            seen.append(len(holds_on("r38j-audit")))

    async def cache(sender: Any, **kwargs: Any) -> None:
        try:
            async with semaphore("r38j-cache", wait=0.5):
                pass
        except SemaphoreBusy:
            pass  # the cache is warmed by another worker
        finally:
            cache_done.set()

    signal.connect(audit, weak=False)
    signal.connect(cache, weak=False)

    async def main() -> None:
        await signal.asend(sender=None)

    with held_elsewhere("r38j-cache"):
        cache_done = asyncio.Event()
        asyncio.run(main())
    assert seen == [1], f"holders of r38j-audit while its block ran: {seen}"
    assert holds_on("r38j-audit") == []
