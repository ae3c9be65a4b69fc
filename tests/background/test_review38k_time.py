"""Review 38k: the clock a lead's command is ended on (see tests/engine/test_review38k_time.py)."""

from __future__ import annotations

import os
import select
import threading
import time
import warnings
from types import SimpleNamespace
from typing import Any

import pytest

from dynasem import Lead, leadership
from dynasem._background import command_init
from dynasem.management.commands import dynasem_lead
from tests.engine.test_review38b_time import host_suspended


@pytest.mark.skipif(not hasattr(time, "CLOCK_BOOTTIME"), reason="Linux's clocks")
def test_the_init_ends_a_lead_s_command_on_waking_from_a_suspend_past_the_lease(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``dynasem_lead`` tells its command's init the lead's trusted deadline, and the init
    ends the namespace just before it should ``dynasem_lead`` stop acting (SIGSTOP, a frozen
    VM). Both read it on CLOCK_MONOTONIC, which does not count a suspended host's sleep,
    while the lead trusts its hold on CLOCK_BOOTTIME and the other hosts' wall clocks count
    the sleep: a host that slept past the lease woke with the init still giving the command
    the whole window it had left before the sleep, beside the leader that took over."""
    lead: Any = SimpleNamespace(seconds_left=lambda: 30.0)
    read, write = os.pipe()
    os.write(write, f"{dynasem_lead._deadline(lead)!r}\n".encode())
    monkeypatch.setattr(command_init, "_reap", lambda child: None)  # the command runs on
    ended: list[int | None] = []
    watcher = threading.Thread(
        target=lambda: ended.append(command_init._watch(read, 0)), daemon=True
    )
    try:
        host_suspended(monkeypatch, 120.0)
        watcher.start()
        watcher.join(2)
        assert ended == [None], "the init let the command run on past the lead's deadline"
    finally:
        os.close(write)  # dynasem_lead gone: the watch ends
        watcher.join(5)
        os.close(read)


def test_a_child_forked_by_the_leader_is_inactive_without_calling_on_lost(lock_table: str) -> None:
    """A leader forks a worker (multiprocessing's fork, a raw ``os.fork()``), which asks
    ``lead.active`` before its work. The child never trusts its copy of the hold (``lost``
    True there), and ``active`` took that for a loss: it called ``on_lost`` in the child,
    whose handler (an alert, a "no leader" row, a shutdown of the leader's services) reported
    a loss while the parent still led. The lead is not lost; the child only cannot trust it."""
    calls: list[str] = []

    def on_lost(lead: Lead) -> None:
        calls.append("on_lost")

    with leadership("rv38k-forked", lease=30, on_lost=on_lost) as lead:
        read, write = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # fork() of a process with threads
            child = os.fork()
        if child == 0:  # the child: reports what it saw, never leaves the block
            try:
                os.close(read)
                os.write(write, repr((lead.active, calls)).encode())
            finally:
                os._exit(0)
        os.close(write)
        ready, _, _ = select.select([read], [], [], 30)
        answer = os.read(read, 256).decode() if ready else "no answer"
        os.close(read)
        os.waitpid(child, 0)
        assert lead.active and not calls
    assert answer == repr((False, [])), f"the child's (lead.active, on_lost calls): {answer}"
