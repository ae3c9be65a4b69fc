"""The parts of telemetry that know nothing of locks: attribute names and buckets, the
histograms' records handed to the SDK in batches, the requests' tally that two observable
counters read, and what a DynamoDB answer or error says (capacity units, outcome). Used by
:mod:`dynasem._observability.telemetry` and by the storage layer's requests."""

from __future__ import annotations

import threading
from typing import Any

try:  # the extra: dynasem[otel]
    from opentelemetry import metrics as _metrics
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover - the matrix runs sessions without it
    _metrics = _trace = None  # type: ignore[assignment]

NO_SPAN = _trace.INVALID_SPAN if _trace is not None else None

# Attribute names (OpenTelemetry's naming rules: the dynasem. namespace, dots between parts).
NAME = "dynasem.lock.name"
MODE = "dynasem.lock.mode"
OUTCOME = "dynasem.lock.outcome"
QUEUED = "dynasem.lock.queued"
REASON = "dynasem.lock.lost.reason"
FENCE = "dynasem.lock.fence"
RESOURCE = "dynasem.lock.resource"  # spans only, and only if TELEMETRY_RESOURCE_NAMES
OPERATION = "db.operation.name"  # OpenTelemetry's database semantic conventions
SYSTEM = "db.system.name"
REQUEST_OUTCOME = "dynasem.request.outcome"
CAPACITY_KIND = "dynasem.capacity.kind"

# Seconds: from a pushed hand-over (ms) to a lease-long wait.
SECONDS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
WAITERS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096, 16384)

# The requests whose answers report capacity units when asked; reads are billed as RCU.
CAPACITY_OPERATIONS = {
    **dict.fromkeys(("get_item", "query", "scan", "batch_get_item"), "read"),
    **dict.fromkeys(("put_item", "update_item", "delete_item", "transact_write_items"), "write"),
}


class Deferred:
    """The histograms' records of acquires and releases, handed to the SDK in batches: one
    record costs the SDK some thirty calls over a dozen objects, which between two requests
    of botocore's find no cache warm (measured: two records cost an uncontended cycle 3-4% of
    its CPU one by one, about a fifth of that in batches). A batch goes when it is full, or
    when a reader collects (the SDK runs the observable counters' callbacks, the first of
    which flushes, before it reads its storage), so a reader never misses one. A record made
    under a recording span goes at once: its exemplar needs that span as the context."""

    BATCH = 32

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[tuple[Any, float, dict[str, Any]]] = []

    def record(self, instrument: Any, value: float, attributes: dict[str, Any], span: Any) -> None:
        if span is not NO_SPAN and span.is_recording():
            instrument.record(value, attributes)
            return
        with self._lock:
            self._items.append((instrument, value, attributes))
            full = len(self._items) >= self.BATCH
        if full:
            self.flush()

    def forked(self) -> None:
        """In a forked child: a new lock (a thread of the parent may have held its copy, for
        good), and none of the parent's records (the parent hands them over itself)."""
        self._lock = threading.Lock()
        self._items = []

    def flush(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        for instrument, value, attributes in items:
            instrument.record(value, attributes)


class Requests:
    """Requests and their capacity units by (operation, outcome, lock name): a dict update
    under a lock per request, read by two observable counters when a reader collects. The
    operation is the client's method (``put_item``), named as DynamoDB does only then."""

    def __init__(self, deferred: Deferred) -> None:
        self._deferred = deferred
        self._lock = threading.Lock()
        self._totals: dict[tuple[str, str, str | None], list[float]] = {}

    def add(self, key: tuple[str, str, str | None], units: float) -> None:
        with self._lock:
            found = self._totals.setdefault(key, [0, 0.0])
            found[0] += 1
            found[1] += units

    def forked(self) -> None:
        """In a forked child: a new lock (a thread of the parent may have held its copy)."""
        self._lock = threading.Lock()

    def _items(self) -> list[tuple[tuple[str, str, str | None], list[float]]]:
        with self._lock:
            return [(key, list(value)) for key, value in self._totals.items()]

    def observe_requests(self, options: Any) -> list[Any]:
        self._deferred.flush()  # a collection has begun: every record before it counts
        return [
            _metrics.Observation(count, _attributes(operation, REQUEST_OUTCOME, outcome, lock))
            for (operation, outcome, lock), (count, _) in self._items()
        ]

    def observe_capacity(self, options: Any) -> list[Any]:
        units: dict[tuple[str, str | None], float] = {}  # summed over the outcomes
        for (operation, _, lock), (_, used) in self._items():
            if operation in CAPACITY_OPERATIONS and used:
                units[operation, lock] = units.get((operation, lock), 0) + used
        return [
            _metrics.Observation(
                used, _attributes(op, CAPACITY_KIND, CAPACITY_OPERATIONS[op], lock)
            )
            for (op, lock), used in units.items()
        ]


def _attributes(operation: str, what: str, value: str, lock: str | None) -> dict[str, Any]:
    named = {} if lock is None else {NAME: lock}
    return {SYSTEM: "aws.dynamodb", OPERATION: operation_name(operation), what: value, **named}


def operation_name(operation: str) -> str:
    """DynamoDB's name of a client method's operation: ``put_item`` -> ``PutItem``."""
    return "".join(part.title() for part in operation.split("_"))


def template_name(resource: Any) -> str | None:
    """A decorator's key as a name: the template(s), or the callable's qualified name; cut
    to ``NAME_MAX`` characters (a list of 100 templates is no name for a dashboard)."""
    name: str | None
    if isinstance(resource, str):
        name = resource
    elif isinstance(resource, list | tuple) and all(isinstance(r, str) for r in resource):
        name = ",".join(resource)
    else:
        name = getattr(resource, "__qualname__", None) if callable(resource) else None
    return None if not name else name[:NAME_MAX]


NAME_MAX = 200


# A loss's kind, and the words of a reason that say it (the first kind found wins).
_REASON_KINDS = (
    ("max_hold", ("max_hold",)),
    ("lease_expired", ("lease ran out",)),
    ("fenced_out", ("newer than", "fence")),
    ("taken_over", ("took it over", "broken")),
)


def reason_kind(reason: str) -> str:
    """A loss's reason as one of a few values (the text itself goes to logs and spans)."""
    text = reason.lower()
    return next((kind for kind, words in _REASON_KINDS if any(w in text for w in words)), "other")


def capacity_units(consumed: Any) -> float:
    """The units of a ``ConsumedCapacity`` answer (one, or a list of them)."""
    if type(consumed) is dict:  # one; a list for transactions and batches
        return float(consumed.get("CapacityUnits") or 0)
    return float(sum(one.get("CapacityUnits") or 0 for one in consumed or ()))


def outcome_of_error(code: str, throttled: bool, reasons: Any = ()) -> str:
    """``refused``: a condition failed (1 WCU billed, the normal "someone else has it"); a
    transaction cancelled for another reason (a conflict, a throttle) is not one."""
    if code == "ConditionalCheckFailedException":
        return "refused"
    if code == "TransactionCanceledException":
        codes = {r.get("Code") for r in reasons or ()}
        if "ConditionalCheckFailed" in codes:
            return "refused"
        if "TransactionConflict" in codes:
            return "conflict"
        throttled = throttled or bool(codes & {"ThrottlingError", "ProvisionedThroughputExceeded"})
    return "throttled" if throttled else "error"
