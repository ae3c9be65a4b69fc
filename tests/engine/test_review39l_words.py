"""A second review of this session's mends of the push listener: a process short of sockets
or threads for a moment (push._short_until), and its waiters once it listens again.

Each test failed before the mend its docstring names, for the reason it states (or is a
strict xfail, its mend described)."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any

import pytest

from dynasem import semaphore
from dynasem._engine import push, queue
from tests.support.helpers import queue_of, wait_for

HOLD = 3.0  # the holder's hold, begun before the shortage passed and ended well after


@pytest.mark.parametrize("how", ["sync", "async"])
def test_a_waiter_that_queued_while_short_is_pushed_once_the_process_listens(
    lock_table: str, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A waiter that queues while its process cannot listen (a pids limit for a moment)
    records no push address in its entry. LISTEN_RETRY later the process listens again (any
    other wait opens the listener), but the waiter never registers: for the rest of its wait
    (up to a lease and more) it reads the row at the paced fallback pace, and the hand-over
    that finally comes to it sits idle until its next read instead of reaching it at once
    (150-270 ms here against ~25 ms pushed, where a read takes a few ms; up to a second on
    AWS). Now a waiter not listening looks whether its process can listen again at each of
    its looks: if so, that look's renewal of its entry records its address (one write,
    once), and the next hand-over is pushed to it."""
    monkeypatch.setattr(push, "_listener", None)
    monkeypatch.setattr(push, "_failed_bind", None)
    monkeypatch.setattr(push, "_short_until", -math.inf)
    monkeypatch.setattr(push, "LISTEN_RETRY", 0.1)
    real_start = threading.Thread.start
    short = [True]

    def start(self: threading.Thread) -> None:
        if self.name == "dynasem-push" and short[0]:
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    resource = f"review39l:queued-while-short-{how}"
    monkeypatch.delitem(queue.pushed_recently, resource, raising=False)
    holder = semaphore(resource, lease=30).acquire()
    out: dict[str, Any] = {}
    waiting = semaphore(resource, fair=True, wait=30, lease=30)

    async def coroutine() -> None:  # a coroutine's wait: no thread reads the socket for it
        async with waiting:
            out["acquired"] = time.monotonic()

    def run() -> None:
        try:
            if how == "async":
                asyncio.run(coroutine())
                return
            with waiting:
                out["acquired"] = time.monotonic()
        except Exception as exc:  # reported to the test
            out["error"] = exc

    waiter = threading.Thread(target=run, name="waiter")
    waiter.start()
    wait_for(lambda: len(queue_of(resource)) == 1, 10, "the waiter in line")
    assert push._listener is None  # it queued short of a thread: no address in its entry
    short[0] = False
    time.sleep(0.2)  # LISTEN_RETRY went by
    assert push.available()  # the process listens again (another wait would open it)
    time.sleep(HOLD)
    released = time.monotonic()
    holder.release()
    waiter.join(30)
    assert "acquired" in out, out
    idle = out["acquired"] - released
    push._listener.sock.close()  # its thread ends; the test's own listener comes back
    assert resource in queue.pushed_recently, (
        f"the hand-over was never pushed to the waiter: it read the row ({idle:.3f} s idle)"
    )
