"""Review of a hold's life (heartbeat, release, give-back, exit): faults found by review-3.

Every hold here has lease=1.5 with CLOCK_SKEW=0.5 (the test settings), as in
tests/engine/test_heartbeat.py, whose helpers these tests use.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest

from dynasem import LockLost, semaphore
from dynasem._engine import shutdown
from dynasem.signals import lock_acquired
from tests.engine.test_heartbeat import (
    LEASE,
    heartbeats_of,
    release_interrupted_behind_a_renewal,
    tokens_on,
    unique,
    wait_for_renewal,
)

pytestmark = pytest.mark.django_db(transaction=False)


@pytest.mark.parametrize("how", ["release", "with"])
def test_a_release_interrupted_waiting_for_a_renewal_is_given_back_at_exit(
    lock_table: str, how: str
) -> None:
    """Ctrl-C as the release waits for the heartbeat's renewal in flight (pressed twice on a
    hanging network: the first ends the block's work, the second its exit): the hold is left
    to its lease, its heartbeat stopped (tests/engine/test_heartbeat.py). The program then
    exits on that KeyboardInterrupt, a normal exit: ``atexit`` (``release_all``) is to give
    back "what a process still holds when it exits normally ... so that nobody waits for its
    lease to run out" (shutdown.py). It finds holds through the heartbeats only, so this one,
    its heartbeat stopped, is left in the row for its whole lease (60 s by default) although
    the process could give it back and says it does."""
    resource = unique("int-exit")
    held = release_interrupted_behind_a_renewal(resource, how)
    assert heartbeats_of(resource) == []
    assert tokens_on(resource) == {held.token}
    try:
        shutdown._at_exit()  # what the interpreter runs at the exit that follows
        assert tokens_on(resource) == set(), "the hold was left in the row at a normal exit"
    finally:
        if not held.released:
            held.release()


def test_a_give_back_interrupted_before_its_write_is_given_back_at_exit(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C again, a little later: the release has begun (the hold is ``released``, its
    heartbeat stopped) and the interrupt comes before its write leaves (here: as the write is
    handed to the client; in life also in resend's pause between two throttled sends, or in
    the queue's read before a hand-over). Nothing was written: the row holds our token for
    its lease. The exit that follows gives nothing back either: ``release_all`` skips a hold
    that is ``released`` (and finds none whose heartbeat stopped)."""
    from dynasem._storage import lock_rows

    resource = unique("int-give-back")
    held = semaphore(resource, lease=LEASE).acquire()
    real_update = lock_rows.update
    fired: list[bool] = []

    def update(action: dict[str, Any], **kwargs: Any) -> Any:
        if action["UpdateExpression"].startswith("REMOVE #h.#t") and not fired:
            fired.append(True)
            raise KeyboardInterrupt  # before it is sent
        return real_update(action, **kwargs)

    monkeypatch.setattr(lock_rows, "update", update)
    with pytest.raises(KeyboardInterrupt):
        held.release()
    assert fired and tokens_on(resource) == {held.token}
    shutdown._at_exit()
    assert tokens_on(resource) == set(), "the hold was left in the row at a normal exit"


def test_a_hold_is_renewed_while_a_lock_acquired_receiver_runs(lock_table: str) -> None:
    """``lock_acquired`` is sent "before the acquire returns" the hold, in the acquiring
    thread, and the heartbeat starts only after the receivers return. A receiver that takes
    longer than the hold's trusted window (an audit row written to a slow database, a
    metrics call timing out; with LEASE=1.5 and CLOCK_SKEW=0.5, 1.2 s) hands the caller a
    hold whose trusted deadline is already behind it: the block begins on a lapsed hold,
    which ``acquire`` promises never to return (tests/engine/test_trust_at_return.py), while
    the row's lease runs out unrenewed and another holder may take it over. Renewed from its
    making, the hold would have been kept."""
    resource = unique("slow-receiver")

    def slow(sender: Any, resource: str = "", **kwargs: Any) -> None:
        if resource == slow_resource:
            time.sleep(1.2)

    slow_resource = resource
    lock_acquired.connect(slow, weak=False)
    try:
        held = semaphore(resource, lease=LEASE).acquire()
    finally:
        lock_acquired.disconnect(slow)
    try:
        assert not held.lost, "acquire returned a hold already past its trusted deadline"
        assert held.seconds_left() > 0.3
    finally:
        with contextlib.suppress(LockLost):
            held.release()


@pytest.mark.reentry
@pytest.mark.parametrize("where", ["looking for a transaction", "starting the give-back"])
def test_a_release_interrupted_before_it_began_is_not_renewed_for_nobody(
    lock_table: str, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Ctrl-C (or a Celery task's soft time limit: a signal handler's exception) lands in a
    block's exit before the give-back has begun: while ``release()`` asks Django whether a
    transaction is open (every release with ``on_commit``, the default, does, outside a
    transaction too), or at ``_release_now``'s first call. The interrupt stands in here for
    the signal at that call. The ``with`` block's exit does not run again. Nothing had marked
    the hold: its heartbeat renews it on, for nobody, as long as the process lives (a worker
    goes on to its next task), and with the hold marked pending a commit that no transaction
    will bring, or still plain, the thread's next acquire of the resource waits on it, or
    re-enters it and gives back only a depth: the lock is kept for good. As for an interrupt
    in the release's wait for a renewal (tests/engine/test_heartbeat.py), it must be left to
    its lease at worst: renewed no more, re-entered no more."""
    from dynasem._engine import hold as hold_module
    from dynasem._transactions import commit

    resource = unique("int-before")
    sem = semaphore(resource, lease=LEASE)
    held = sem.acquire()
    wait_for_renewal(held)
    if where == "looking for a transaction":
        real = commit.open_transaction

        def open_transaction(*args: Any, **kwargs: Any) -> Any:
            monkeypatch.setattr(commit, "open_transaction", real)
            raise KeyboardInterrupt

        monkeypatch.setattr(commit, "open_transaction", open_transaction)
    else:
        real_os = hold_module.os
        calls: list[int] = []

        class Os:
            def __getattr__(self, name: str) -> Any:
                return getattr(real_os, name)

            def getpid(self) -> int:
                if not calls:
                    calls.append(1)
                    raise KeyboardInterrupt  # at _release_now's first call
                return real_os.getpid()

        monkeypatch.setattr(hold_module, "os", Os())
    with pytest.raises(KeyboardInterrupt):
        held.release()
    monkeypatch.undo()
    try:
        time.sleep(2 * (LEASE - 0.5) / 3 + 0.15)  # two renewals would have been due
        assert heartbeats_of(resource) == [], "the hold is renewed on, for nobody"
        with semaphore(resource, lease=LEASE, wait=3 * LEASE) as again:
            # A hold of its own, once the interrupted one's lease ran out.
            assert again.token != held.token and again.depth == 1
    finally:
        if not held.released:
            with contextlib.suppress(LockLost):
                held.release()
