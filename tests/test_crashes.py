"""Holders that die or stall, as OS processes on DynamoDB Local."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

from django.test import override_settings

from dynasem import semaphore
from dynasem.conf import settings
from tests import workers
from tests.fencing import fenced_put

SPAWN = multiprocessing.get_context("spawn")


def test_killed_holder_is_taken_over_within_lease_plus_one_second(dynamodb_local, lock_table):
    lease = 2.0
    out = SPAWN.Queue()
    proc = SPAWN.Process(
        target=workers.hold_until_killed, args=(dynamodb_local, lock_table, "job:1", lease, out)
    )
    proc.start()
    try:
        kind, dead_fence = out.get(timeout=60)
        assert kind == "held"
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        with semaphore("job:1", wait=lease + 5) as held:
            waited = time.monotonic() - killed
            assert held.fence > dead_fence
    finally:
        proc.kill()
        proc.join(10)
    # The lease, the skew the takeover allows for, and one second.
    assert waited <= lease + settings.CLOCK_SKEW + 1.0, waited


def test_paused_holder_loses_its_hold_and_its_fenced_write_is_refused(dynamodb_local, lock_table):
    lease = 1.5
    out, go_on = SPAWN.Queue(), SPAWN.Event()
    proc = SPAWN.Process(
        target=workers.hold_then_pause,
        args=(dynamodb_local, lock_table, "doc:1", lease, out, go_on),
    )
    proc.start()
    try:
        kind, old_fence = out.get(timeout=60)
        assert kind == "held"
        os.kill(proc.pid, signal.SIGSTOP)  # a GC pause, a stalled VM: no heartbeat either
        with semaphore("doc:1", wait=lease + 5, user="next") as held:
            assert held.fence > old_fence
            fenced_put("document", "fresh body", held.fence)
            os.kill(proc.pid, signal.SIGCONT)  # resume before set(): set() waits for waiters
            go_on.set()
            assert out.get(timeout=30) == ("fenced-write", "refused")
            kind, outcome = out.get(timeout=30)
            assert kind == "exit" and outcome.startswith("LockLost"), outcome
            # The stale holder's exit did not remove the current hold.
            from dynasem.operations import holds_on

            assert [h.token for h in holds_on("doc:1")] == [held.token]
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.join(10)
        if proc.is_alive():
            proc.kill()


def test_override_settings_reaches_worker_settings(lock_table):
    # The workers read endpoint and table from the environment the fixtures set.
    assert os.environ["DYNASEM_TEST_TABLE"] == lock_table
    with override_settings(DYNASEM=dict(settings.raw, TABLE_NAME=lock_table)):
        assert settings.TABLE_NAME == lock_table
