"""OpenTelemetry metrics and spans of the locks, through ``opentelemetry-api`` only.

Installed (``pip install dynasem[otel]``), dynasem records to whatever MeterProvider and
TracerProvider the project configures (none configured: the API's no-ops, and dynasem skips
what would only feed them: no span made, no capacity asked). Absent, every hook in the lock
code is one ``if telemetry.ON`` and nothing else. No request is added: the capacity units
come from ``ReturnConsumedCapacity="TOTAL"`` on the requests dynasem sends anyway (asked only
once a MeterProvider is set), read from their answers.

Cardinality is bounded by design: the lock's name in every attribute is ``metrics_name=``,
else the decorator's key template (``"purge:{project_id}"``), else ``"other"``; the raw
resource key only when ``DYNASEM["TELEMETRY_RESOURCE_NAMES"]`` is True. The instruments and
attributes are listed in docs/how-to/observability.md.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

from django.core.signals import setting_changed

from .._clock import monotonic
from ..conf import settings
from ..exceptions import Coalesced, LockLost, SemaphoreBusy, SemaphoreUnavailable
from . import metrics
from .logs import facts

try:  # the extra: dynasem[otel]
    from opentelemetry import context as _context
    from opentelemetry import metrics as _metrics
    from opentelemetry import trace as _trace
    from opentelemetry.metrics import _internal as _metrics_global
except ImportError:  # pragma: no cover - the matrix runs sessions without it
    _context = _metrics = _trace = _metrics_global = None  # type: ignore[assignment]

ON = _metrics is not None and _trace is not None

logger = logging.getLogger("dynasem")
_complained = False
_T = TypeVar("_T")
_R = TypeVar("_R")


def _safely(call: Callable[..., _R], *args: Any) -> _R | None:
    """``call(*args)``, or None if it raised: telemetry never fails a lock's acquire,
    release or renewal (an SDK or exporter error is logged once per process)."""
    global _complained
    try:
        return call(*args)
    except Exception as exc:
        if not _complained:
            _complained = True
            logger.warning(
                "dynasem: recording telemetry failed (%r); the locks go on, the telemetry of "
                "this call is lost (logged once per process)",
                exc,
                exc_info=True,
                extra=facts(outcome="telemetry_failed", reason=exc),
            )
        return None


class _Instruments:
    def __init__(self) -> None:
        version = str(getattr(sys.modules.get("dynasem"), "__version__", ""))
        meter = _metrics.get_meter("dynasem", version)
        self.tracer = _trace.get_tracer("dynasem", version)

        def histogram(name: str, unit: str, about: str, buckets: Any = metrics.SECONDS) -> Any:
            return meter.create_histogram(
                name, unit, about, explicit_bucket_boundaries_advisory=buckets
            )

        self.acquire = histogram(
            "dynasem.lock.acquire.duration",
            "s",
            "Time from asking for a lock to having it, or to giving up.",
        )
        self.hold = histogram(
            "dynasem.lock.hold.duration",
            "s",
            "Time a hold was kept, from taking it to giving it back (or losing it).",
        )
        self.idle = histogram(
            "dynasem.lock.handover.idle",
            "s",
            "Time a lock handed to a waiter stood unused: from the releaser's hand-over write "
            "to the waiter knowing it holds.",
        )
        self.ahead = histogram(
            "dynasem.lock.queue.ahead",
            "{waiter}",
            "Waiters ahead in the queue when a waiter joined it.",
            metrics.WAITERS,
        )
        self.lost = meter.create_counter("dynasem.lock.lost", "{hold}", "Holds lost, by reason.")
        self.renewals = meter.create_counter(
            "dynasem.lock.renewals", "{renewal}", "Lease renewals, by outcome."
        )
        # Every request counts: tallied here (a dict update under a lock) and handed to the
        # SDK only when a reader collects, which costs a request a tenth of a measurement.
        self.deferred = metrics.Deferred()
        self.requests = metrics.Requests(self.deferred)
        meter.create_observable_counter(
            "dynasem.dynamodb.requests",
            [self.requests.observe_requests],
            "{request}",
            "Requests sent to DynamoDB, by operation and outcome.",
        )
        meter.create_observable_counter(
            "dynasem.dynamodb.consumed_capacity",
            [self.requests.observe_capacity],
            "{capacity_unit}",
            "Capacity units DynamoDB reported for dynasem's requests (read or write); a refused "
            "conditional write is billed 1 WCU and reports none.",
        )


_instruments: _Instruments | None = None
_instruments_lock = threading.Lock()
_pid = os.getpid()  # the process _instruments_lock and the instruments' locks are of


def _get() -> _Instruments:
    global _instruments
    if _pid != os.getpid():
        # A child forked by C code that runs none of Python's at-fork hooks (a uWSGI worker,
        # unless ``py-call-osafterfork``): as if the hook had run (see _after_fork).
        _after_fork()
    if _instruments is None:
        with _instruments_lock:  # one set only: the SDK keeps the first observable counters
            if _instruments is None:
                _instruments = _Instruments()
    return _instruments


def _after_fork() -> None:
    # A forked child must not wait, at its first request, on a lock that another thread of
    # the parent held as it forked (counting a request: a dict update under it).
    global _instruments_lock, _pid
    _instruments_lock, _pid = threading.Lock(), os.getpid()
    if _instruments is not None:
        _instruments.requests.forked()
        _instruments.deferred.forked()


os.register_at_fork(after_in_child=_after_fork)

_tracing = False


def _tracer() -> Any:
    """The tracer, or None while no TracerProvider is set: the API's spans would be no-ops,
    so none is made at all (a span costs an acquire tens of calls)."""
    global _tracing, _PROVIDER_FROM_ENVIRONMENT
    if not _tracing:
        # The API's own global, read first: get_tracer_provider() looks the environment up
        # on every call while none is set, which an acquire felt.
        if getattr(_trace, "_TRACER_PROVIDER", True) is None and not _PROVIDER_FROM_ENVIRONMENT:
            return None
        provider = _safely(_trace.get_tracer_provider)
        if provider is None:  # the environment names one that cannot load: asked no more
            _PROVIDER_FROM_ENVIRONMENT = False
            return None
        if isinstance(provider, _trace.ProxyTracerProvider | _trace.NoOpTracerProvider):
            return None
        _tracing = True  # set once: OpenTelemetry refuses to replace a provider
    return _get().tracer


# A provider named by the environment is loaded by the API's first ask, which raises (on every
# ask) if it cannot load: an SDK left out, a typo. Telemetry is then off, and the lock works.
_PROVIDER_FROM_ENVIRONMENT = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ

_metered = False


def _metering() -> bool:
    """Whether a MeterProvider is set. Before one is, the API's instruments record nowhere:
    a request's answer is not counted and no request asks DynamoDB for its capacity units
    (a bigger answer to parse; DynamoDB Local answered each ~0.5 ms later for it)."""
    global _metered, _METER_FROM_ENV
    if not _metered:
        if getattr(_metrics_global, "_METER_PROVIDER", True) is None and not _METER_FROM_ENV:
            return False
        provider = _safely(_metrics.get_meter_provider)
        if provider is None:  # as a tracer provider's (_tracer)
            _METER_FROM_ENV = False
            return False
        if isinstance(provider, _metrics.NoOpMeterProvider) or provider is getattr(
            _metrics_global, "_PROXY_METER_PROVIDER", None
        ):
            return False
        _metered = True  # set once: OpenTelemetry refuses to replace a provider
    return True


_METER_FROM_ENV = "OTEL_PYTHON_METER_PROVIDER" in os.environ


def _recording() -> bool:
    """The setting on, and a MeterProvider or a TracerProvider set: else an acquire, a
    release or a renewal would only feed the API's no-ops, and none is recorded."""
    return ON and (_settings or _config())[0] and (_metering() or _tracer() is not None)


# The two settings, read once and again after a change (every hook asks: a settings read is
# four calls, most of what an uncontended cycle spent on telemetry besides the SDK's share).
# The hooks of every acquire, release and request read ``_settings or _config()``: a call
# less, which that path measurably feels (benchmarks/telemetry.py). The instruments are read
# with ``_get()`` all the same: it makes their locks anew in a child forked without at-fork
# hooks, where a lock a thread of the parent held would be held for good.
_settings: tuple[bool, bool] | None = None
_changes = 0  # how many times DYNASEM changed: a read overtaken by a change is not kept


def _config() -> tuple[bool, bool]:
    """Read the two settings and keep them: called as ``_settings or _config()``, so only
    while none are kept. Kept only if ``DYNASEM`` did not change while they were read (a
    heartbeat's request reading them as a test's override ended kept the override's for
    every test after it)."""
    global _settings
    seen = _changes  # before the read: the value changes before setting_changed is sent
    found = (settings.TELEMETRY, settings.TELEMETRY_RESOURCE_NAMES)
    with settings.lock():
        if seen == _changes:
            _settings = found
    return found


def _forget_settings(setting: str, **kwargs: Any) -> None:
    global _settings, _changes
    if setting == "DYNASEM":
        with settings.lock():
            _changes += 1
            _settings = None


setting_changed.connect(_forget_settings, dispatch_uid="dynasem-telemetry-settings")


# -- names -----------------------------------------------------------------------------------


def lock_name(sem: Any) -> str:
    """The lock's name in attributes: bounded unless the setting opts in to raw keys."""
    if name := getattr(sem, "metrics_name", None):
        return str(name)
    if (_settings or _config())[1]:
        return ",".join(sem.resources)
    return "other"


def _base(sem: Any) -> dict[str, Any]:
    return {
        metrics.NAME: lock_name(sem),
        metrics.MODE: "shared" if sem.shared else "exclusive" if sem.limit == 1 else "counting",
    }


# -- acquiring -------------------------------------------------------------------------------


# The lock a request is sent for, as a name (requests carry it when known).
_lock_name = contextvars.ContextVar[str | None]("dynasem_telemetry_lock", default=None)


class _Spanned:
    """A span made current and the lock's name set for the requests sent meanwhile. Plain
    classes, not generator context managers, and no span at all without a TracerProvider:
    this runs on every acquire and release (benchmarks/telemetry.py)."""

    __slots__ = ("_context", "_name", "base", "span")

    def __init__(self, name: str, base: dict[str, Any], attributes: Any, held: Any = None):
        self.base = base
        self._context: Any = None
        tracer = _tracer()
        if tracer is None:
            self.span = metrics.NO_SPAN
        else:
            context = getattr(held, "telemetry_context", None)
            links = [_trace.Link(context)] if context is not None and context.is_valid else None
            self.span = tracer.start_span(name, attributes=attributes(), links=links)
            if self.span.is_recording():
                self._context = _context.attach(_trace.set_span_in_context(self.span))
        self._name = _lock_name.set(base[metrics.NAME])

    def exit(self) -> None:
        _lock_name.reset(self._name)
        if self._context is not None:
            _context.detach(self._context)


class _Acquiring(_Spanned):
    """What one acquire did, filled in by the lock code while it runs (a context variable)."""

    __slots__ = ("_token", "busy", "held", "queued", "started")

    def __init__(self, sem: Any) -> None:
        base = _base(sem)

        def attributes() -> dict[str, Any]:
            raw = (_settings or _config())[1]  # the raw key too, if the setting opts in
            return {**base, metrics.RESOURCE: ",".join(sem.resources)} if raw else {**base}

        super().__init__("dynasem.acquire", base, attributes)
        self.busy = self.queued = False
        self.held: Any = None  # what the acquire returned
        self._token = _current.set(self)
        self.started = time.perf_counter()

    def __enter__(self) -> None:
        pass

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        _safely(self.done, self.held, error)

    def done(self, held: Any, error: BaseException | None) -> None:
        elapsed = time.perf_counter() - self.started
        _current.reset(self._token)
        base, span = self.base, self.span
        outcome = "acquired" if error is None else _outcome_of(error)
        # A nested acquire that re-entered a hold, or a hold given back inside a transaction
        # still open and taken again: no acquisition (no request), and the hold keeps the
        # span of the acquire that took it.
        again = held is not None and (
            held.telemetry_context is not None or getattr(held, "depth", 1) > 1
        )
        try:
            if not again:
                base[metrics.OUTCOME] = outcome
                base[metrics.QUEUED] = self.queued
                inst = _get()
                inst.deferred.record(inst.acquire, elapsed, base, span)  # under it: exemplars
        finally:
            # Whatever the SDK raised: the span is current no more, the name set no more
            # (else the thread's later spans and requests would go on under them), and ended.
            self.exit()
            if span is not metrics.NO_SPAN:
                self._end(span, held, error, outcome, again)

    def _end(self, span: Any, held: Any, error: Any, outcome: str, again: bool) -> None:
        if span.is_recording():
            span.set_attributes({metrics.OUTCOME: outcome, metrics.QUEUED: self.queued})
            if held is not None:
                span.set_attribute(metrics.FENCE, held.fence)
            if error is not None and outcome in ("unavailable", "error"):
                span.record_exception(error)
                span.set_status(_trace.Status(_trace.StatusCode.ERROR, str(error)[:200]))
        if held is not None and not again:
            held.telemetry_context = span.get_span_context()
        span.end()


# The acquire under way in this context.
_current = contextvars.ContextVar[_Acquiring | None]("dynasem_telemetry_acquire", default=None)


def _outcome_of(exc: BaseException) -> str:
    if isinstance(exc, Coalesced):  # covered by the next run (a view answers 202): no 423
        return "coalesced"
    if isinstance(exc, SemaphoreBusy):
        return "busy"
    if isinstance(exc, SemaphoreUnavailable):
        return "unavailable"
    if isinstance(exc, KeyboardInterrupt | SystemExit) or type(exc).__name__ == "CancelledError":
        return "cancelled"
    return "error"


def acquire(sem: Any, attempt: Callable[[], _T]) -> _T:
    """``attempt()`` (the acquire) measured and in a ``dynasem.acquire`` span."""
    record = _safely(_Acquiring, sem) if _recording() else None
    if record is None:
        return attempt()
    with record:
        record.held = attempt()
    return record.held  # type: ignore[no-any-return]


async def aacquire(sem: Any, attempt: Callable[[], Awaitable[_T]]) -> _T:
    """:func:`acquire` of an async acquire."""
    record = _safely(_Acquiring, sem) if _recording() else None
    if record is None:
        return await attempt()
    with record:
        record.held = await attempt()
    return record.held  # type: ignore[no-any-return]


def waiting(ahead: int | None = None) -> None:
    """The acquire found the lock busy and waits (``ahead``: it joined the queue behind so
    many): a span event at the moment the wait began, and the queue's length."""
    _safely(_waiting, ahead)


def _waiting(ahead: int | None) -> None:
    if (record := _current.get()) is None:
        return
    if ahead is not None and not record.queued:
        record.queued = True
        _get().ahead.record(ahead, {metrics.NAME: _lock_name.get() or "other"})
    if not record.busy:
        record.busy = True
        queue = {} if ahead is None else {"dynasem.lock.queue.ahead": ahead}
        record.span.add_event("dynasem.wait", {metrics.QUEUED: ahead is not None, **queue})


def handed_over(sem: Any, item: Any, token: str) -> None:
    """A hold we found handed to us (the releaser wrote us in, while we were queued): how
    long it stood idle. Across hosts the figure includes their clocks' difference."""
    _safely(_handed_over, sem, item, token)


def _handed_over(sem: Any, item: Any, token: str) -> None:
    record = _current.get()
    if record is None or not record.queued:
        return  # not a hand-over: an own write recognised after a lost answer, say
    entry = None if item is None else item.holders.get(token)
    acquired_ms = getattr(entry, "acquired_ms", None)
    if not acquired_ms:
        return
    idle = max(0.0, time.time() - acquired_ms / 1000)
    _get().idle.record(idle, _base(sem))
    record.span.add_event("dynasem.handed_over", {"dynasem.lock.handover.idle": idle})


# -- holding ---------------------------------------------------------------------------------


class _HoldSpan(_Spanned):
    """Work on a hold (``with releasing(held):``, ``with renewing(held):``) in a span named
    :attr:`span_name`, linked to the acquire's; :meth:`_exit` records how it went."""

    __slots__ = ("held", "on")
    span_name = ""

    def __init__(self, held: Any) -> None:
        self.held, self.on = held, _recording()

    def __enter__(self) -> None:
        if self.on and _safely(self._enter) is None:
            self.on = False

    def _enter(self) -> bool:
        held = self.held
        base = _base(held.semaphore)
        super().__init__(self.span_name, base, lambda: {**base, metrics.FENCE: held.fence}, held)
        return True

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        if self.on:
            _safely(self._exit, error)

    def _exit(self, error: BaseException | None) -> None:
        raise NotImplementedError


class releasing(_HoldSpan):  # noqa: N801 - used as a function: ``with releasing(held):``
    """A release: the hold's duration by outcome (released, handed_over, lost), in a
    ``dynasem.release`` span linked to the acquire's, with a ``dynasem.handover`` child when
    it handed the lock to waiters."""

    __slots__ = ()
    span_name = "dynasem.release"

    def _exit(self, error: BaseException | None) -> None:
        held, base, span = self.held, self.base, self.span
        outcome = "lost" if held._lost else "handed_over" if held._handover else "released"
        hold_s = max(0.0, monotonic() - held._taken_mono)
        try:
            inst = _get()
            inst.deferred.record(inst.hold, hold_s, {**base, metrics.OUTCOME: outcome}, span)
        finally:  # whatever the SDK raised: as an acquire's (_Acquiring.done)
            self.exit()
            if span is not metrics.NO_SPAN:
                self._end(span, hold_s, outcome)

    def _end(self, span: Any, hold_s: float, outcome: str) -> None:
        held, base = self.held, self.base
        span.set_attributes({metrics.OUTCOME: outcome, "dynasem.lock.held": hold_s})
        if held._handover is not None:
            start, end, heirs, fence = held._handover
            child = _get().tracer.start_span(
                "dynasem.handover",
                context=_trace.set_span_in_context(span),
                attributes={**base, "dynasem.lock.heirs": heirs, metrics.FENCE: fence},
                start_time=start,
            )
            child.end(end)
        span.end()


def lost(held: Any, reason: str) -> None:
    if _recording():
        _safely(_lost, held, reason)


def _lost(held: Any, reason: str) -> None:
    kind = metrics.reason_kind(reason)
    _get().lost.add(1, {**_base(held.semaphore), metrics.REASON: kind})
    # On the span that found it, if any (a renewal's, a release's caller's).
    _trace.get_current_span().add_event(
        "dynasem.lost",
        {metrics.REASON: kind, "dynasem.lock.lost.detail": reason, metrics.FENCE: held.fence},
    )


class renewing(_HoldSpan):  # noqa: N801 - used as a function: ``with renewing(held):``
    """One renewal: counted by outcome, in a ``dynasem.renew`` span linked to the acquire's."""

    __slots__ = ()
    span_name = "dynasem.renew"

    def _exit(self, error: BaseException | None) -> None:
        outcome = (
            "renewed" if error is None else "lost" if isinstance(error, LockLost) else "failed"
        )
        self.exit()
        try:
            _get().renewals.add(1, {**self.base, metrics.OUTCOME: outcome})
        finally:  # ended whatever the SDK raised
            self.span.set_attribute(metrics.OUTCOME, outcome)
            self.span.end()


# -- requests --------------------------------------------------------------------------------


@contextlib.contextmanager
def naming(name: str | None) -> Iterator[None]:
    """The requests sent inside carry the lock's ``name`` (see :func:`lock_name`): work done
    for a lock on another thread than its acquire's and release's, which set it themselves
    (a stray hand-over given back, a coalesced run's registration renewed or withdrawn)."""
    token = None if name is None or not _recording() else _lock_name.set(name)
    try:
        yield
    finally:
        if token is not None:
            _lock_name.reset(token)


def ask_capacity(operation: str, kwargs: dict[str, Any]) -> None:
    """Ask DynamoDB to report the units of a request that can (no extra request)."""
    if operation in metrics.CAPACITY_OPERATIONS and (_settings or _config())[0] and _metering():
        kwargs.setdefault("ReturnConsumedCapacity", "TOTAL")


def request(operation: str, outcome: str, response: Mapping[str, Any] | None) -> None:
    """A request's answer: counted by operation and outcome, and its capacity units."""
    if (_settings or _config())[0] and _metering():
        _safely(_request, operation, outcome, response)


def _request(operation: str, outcome: str, response: Mapping[str, Any] | None) -> None:
    units = 0.0 if response is None else metrics.capacity_units(response.get("ConsumedCapacity"))
    _get().requests.add((operation, outcome, _lock_name.get()), units)
