"""Telemetry met as an on-call engineer meets it (seventh review): a span's start cut short
by an interrupt in a release, an SDK that raises while recording, a provider configured
from the environment that cannot load. The SDK's in-memory reader and exporter, on
DynamoDB Local."""

from __future__ import annotations

import asyncio
import contextvars
import os
import select
import signal
import subprocess
import sys
import textwrap
import uuid
import warnings
from typing import Any

import pytest

from dynasem import Coalesced, SemaphoreBusy, semaphore
from dynasem._engine import hold as holds_module
from dynasem._observability import telemetry
from dynasem._observability.metrics import NAME, OUTCOME
from dynasem._operators import locks as operations
from dynasem.signals import lock_busy
from tests.engine.test_coalesce import registered, wait_until
from tests.observability.test_telemetry import (
    ROOT,
    _endpoint,
    histogram,
    named,
    otel,  # noqa: F401 - the fixture, for every test here
    spans,
)
from tests.observability.test_telemetry_paths import ACQUIRE, in_thread
from tests.support.helpers import dynasem_settings

try:
    from opentelemetry import trace
except ImportError:  # the matrix runs some pairs without it (the fixture skips)
    trace = None  # type: ignore[assignment]

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


def _broken(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("a view's exemplar reservoir on fire")


def test_a_record_that_raises_leaves_no_dynasem_span_current_and_ends_its_spans(
    otel: Any,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The SDK raising as the acquire's or the release's duration is recorded (the lock goes
    on: logged once) must not leave that span attached as the thread's current context, nor
    the lock's name set for the thread's later requests, nor the span unended."""
    monkeypatch.setattr(telemetry._get().deferred, "record", _broken)
    monkeypatch.setattr(telemetry, "_complained", True)  # logged once per process, earlier
    name = named()

    def scenario() -> tuple[bool, str | None]:
        with semaphore(resource(), metrics_name=name):
            pass
        return trace.get_current_span().get_span_context().is_valid, telemetry._lock_name.get()

    span_current, lock_name = contextvars.copy_context().run(scenario)
    assert not span_current, "a dynasem span is left current in the caller's context"
    assert lock_name is None, "the lock's name is left set for the caller's later requests"
    for kind in ("dynasem.acquire", "dynasem.release"):
        assert [s for s in spans(otel, kind) if s.attributes[NAME] == name], f"{kind} not ended"


def test_a_renewal_counter_that_raises_still_ends_the_renewal_span(
    otel: Any,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
    holds: list[Any],
) -> None:
    name = named()
    held = semaphore(resource(), metrics_name=name).acquire()
    holds.append(held)
    monkeypatch.setattr(telemetry._get().renewals, "add", _broken)
    monkeypatch.setattr(telemetry, "_complained", True)
    held.renew()
    assert [s for s in spans(otel, "dynasem.renew") if s.attributes[NAME] == name]


@pytest.mark.parametrize("variable", ["OTEL_PYTHON_METER_PROVIDER", "OTEL_PYTHON_TRACER_PROVIDER"])
def test_a_provider_named_in_the_environment_that_cannot_load_never_fails_the_lock(
    lock_table: str, variable: str
) -> None:
    """``OTEL_PYTHON_*_PROVIDER`` naming a provider that is not installed (the SDK left out
    of an image, a typo): the API raises as it loads it, on every call. The guide promises
    that a failure inside telemetry never fails a lock; the lock works, untraced."""
    code = textwrap.dedent(
        f"""
        import django
        from django.conf import settings
        settings.configure(INSTALLED_APPS=["dynasem"], DYNASEM={dynasem_settings(*_endpoint())!r})
        django.setup()
        from dynasem import semaphore
        from dynasem._observability import telemetry
        assert telemetry.ON
        for _ in range(2):
            with semaphore("tel37:env:{uuid.uuid4().hex}") as held:
                assert held.fence > 0
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), variable: "no_such_provider"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


@pytest.mark.parametrize("lock", ["requests", "deferred"])
def test_a_child_forked_while_a_thread_counted_a_request_can_still_lock(
    otel: Any,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
    lock: str,
) -> None:
    """Another thread of the parent was counting a request (or batching a duration record)
    as the process forked (multiprocessing, a pre-forking server's master): the child's copy
    of that lock stays held for good, and its first request after an applied write (here,
    its acquire's) waited on it forever, the lock taken in DynamoDB for nobody."""
    if lock == "deferred":
        monkeypatch.setattr(telemetry, "_tracer", lambda: None)  # records go to the batch
    held_lock = getattr(telemetry._get(), lock)._lock
    read, write = os.pipe()
    with held_lock:  # the parent's thread, mid-update at the fork
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # fork() of a process with threads
            child = os.fork()
        if child == 0:
            try:
                os.close(read)
                try:
                    with semaphore(resource()) as held:
                        answer = b"ok" if held.fence > 0 else b"no fence"
                except BaseException as exc:  # noqa: BLE001 - reported to the parent
                    answer = repr(exc).encode()[:200]
                os.write(write, answer)
            finally:
                os._exit(0)
    os.close(write)
    ready, _, _ = select.select([read], [], [], 20)
    answer = os.read(read, 256).decode() if ready else "no answer: the child hangs"
    os.close(read)
    if not ready:
        os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    assert answer == "ok", answer


def test_a_coalesced_call_is_not_counted_as_a_busy_answer(
    otel: Any,  # noqa: F811 - the fixture
    holds: list[Any],
) -> None:
    """A call covered by the next run registered (``Coalesced``: a view answers 202) is no
    busy answer: the guide's "423s" query, outcome busy, must not count it."""
    name, res = named(), resource()
    holds.append(semaphore(res).acquire())
    thread, out = in_thread(lambda: semaphore(res, coalesce=True, wait=10).acquire())
    wait_until(lambda: registered(res))
    with pytest.raises(Coalesced):
        semaphore(res, coalesce=True, wait=10, metrics_name=name).acquire()
    holds.pop().release()
    thread.join(10)
    out["held"].release()
    found = {
        p.attributes[OUTCOME]: p.count for p in histogram(otel["reader"], ACQUIRE, **{NAME: name})
    }
    assert found == {"coalesced": 1}


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_a_coalesced_call_that_gives_up_sends_lock_busy_once(holds: list[Any], sync: bool) -> None:
    """One call, one ``lock_busy``: the early one (its first attempt found the lock busy, the
    call may still run as the next, as the signals' reference says); the registered wait
    that runs out raises ``SemaphoreBusy`` without a second one under another token."""
    res = resource()
    holds.append(semaphore(res).acquire())
    sent: list[dict[str, Any]] = []

    def heard(sender: Any, **kwargs: Any) -> None:
        sent.append(kwargs)

    coalesced = semaphore(res, coalesce=True, wait=0.5)
    lock_busy.connect(heard)
    try:
        with pytest.raises(SemaphoreBusy) as caught:
            coalesced.acquire() if sync else asyncio.run(coalesced.aacquire())
    finally:
        lock_busy.disconnect(heard)
    assert not isinstance(caught.value, Coalesced)
    assert len(sent) == 1, [kwargs["token"] for kwargs in sent]
