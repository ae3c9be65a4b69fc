"""A thread a test before the run left behind (the heartbeat scheduler of a hold on DynamoDB
Local, which reads dynasem's own clock) keeps the real clock while a run patches it: the
run's clock is only for the run's own threads."""

from __future__ import annotations

import threading
import time

from dynasem import _clock
from tests.support.sim.runtime import Options, run


def test_a_real_thread_reads_the_real_clock_while_a_run_goes() -> None:
    failures: list[BaseException] = []
    readings: list[float] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                readings.append(_clock.monotonic() - time.monotonic())
                _clock.wall_clock()
            except BaseException as exc:  # the run's clock, read outside its threads
                failures.append(exc)
            stop.wait(0.001)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        run(Options(seed=1, processes=2, hosts=1, steps=3)).raise_if_violated()
    finally:
        stop.set()
        reader.join(5)
    assert failures == []
    # Its readings stayed the real clock's (BOOTTIME runs ahead of MONOTONIC by a suspend's
    # length at most, never by a simulated hour).
    assert readings and max(readings) - min(readings) < 1.0
