"""What tests share beyond fixtures: the engine a run uses, settings for a table, waiting for
a condition, queueing a waiter by hand, counting requests (tests/conftest.py holds the
fixtures and hooks that use them)."""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
import warnings
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from dynasem._operators.locks import HoldInfo

ENGINE_ENV = "DYNASEM_TEST_ENGINE"


ENGINES = ("dynamodb-local", "embedded", "unkind")


def engine_name() -> str:
    """The engine this run's tests use: ``$DYNASEM_TEST_ENGINE``, DynamoDB Local by default."""
    return os.environ.get(ENGINE_ENV) or ENGINES[0]


# ``DYNASEM_TEST_PERMITS_FROM=N``: counting semaphores of more than N permits keep their
# holders in permit items (normally above permit_items.INLINE_MAX = 8), so that the whole
# suite's counting tests can run on that layout too (workers inherit it).
PERMITS_ENV = "DYNASEM_TEST_PERMITS_FROM"


# ``DYNASEM_TEST_READERS_FROM=N``: a shared resource keeps N readers in its row, the next in
# reader items (normally lock_writes.READERS_INLINE = 2), for the same reason.
READERS_ENV = "DYNASEM_TEST_READERS_FROM"


# The DynamoDB operations dynasem sent this session (tests/project/test_iam_policy.py). Every
# boto3 client built in this process (dynasem builds its own in _storage/dynamodb.py) reports
# each operation before sending it (conftest's hook). It is recorded when its nearest caller
# outside botocore is dynasem's own code (not dynasem.testing): a test's own calls on a client,
# such as lock_table's update_time_to_live, are not dynasem's.
# With ``$DYNASEM_TEST_REQUESTS_FILE`` (scripts/pytest.sh) the processes of a run share them:
# each appends what it records to that file, and a session starts with what it holds (the
# parallel run's workers, then the serial run whose @runs_last test reads them all).
DYNASEM_REQUESTS: set[str] = set()
REQUESTS_FILE = os.environ.get("DYNASEM_TEST_REQUESTS_FILE")
if REQUESTS_FILE and os.path.exists(REQUESTS_FILE):
    with open(REQUESTS_FILE) as sent:
        DYNASEM_REQUESTS.update(sent.read().split())


def runs_last(test: Any) -> Any:
    """Run ``test`` after every other test of the session (pytest_collection_modifyitems); it
    is also ``serial``: under pytest-xdist it runs alone, after the parallel run."""
    test.runs_last = True
    return pytest.mark.serial(test)


# Listings (the admin's, dynasem_locks', the reaper's) come from indexes and eventually
# consistent reads, and say so. On the unkind engine a test of what a listing shows first
# lets the engine's replicas catch up, as an operator reloads the page: what such a test
# checks is the listing, not the lag (tests/operators/test_operators_lag.py checks the lag).
LISTINGS = (
    ("index_queries", "query_expiring"),
    ("index_queries", "query_user_page"),
    ("index_queries", "get_many"),
    ("job_rows", "scan_jobs"),
)


def settle_engine() -> None:
    """On the unkind engine: wait until its replicas have every version written so far."""
    import http.client
    import json
    import time
    from urllib.parse import urlsplit

    url = urlsplit(os.environ["DYNASEM_TEST_ENDPOINT"])
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=10)
        try:
            conn.request("GET", "/unkind")
            if not json.loads(conn.getresponse().read())["replica_versions_pending"]:
                return
        finally:
            conn.close()
        time.sleep(0.05)


def dynasem_settings(endpoint: str, table_name: str, **extra: Any) -> dict[str, Any]:
    return {
        "TABLE_NAME": table_name,
        "ENDPOINT_URL": endpoint,
        "REGION_NAME": "us-east-1",
        "LEASE": 10,
        "WAIT": 0,
        "CLOCK_SKEW": 0.5,
        **extra,
    }


class OwnRequests:
    """Tells a test's own requests, as botocore's event hooks on the worker's shared client
    see them, from another test's: those naming the table configured when it was made (and,
    with ``this_thread``, sent by the thread that made it: not the test's own heartbeats).

    A hook is called with a request's body (``before-send``; ``needs-retry``'s
    ``request_dict``) or its parameters (``before-call``). A request naming no table at all
    (``ListTables``) counts as the test's. Requests name the table DYNASEM names as they are
    built: a hold an earlier test left renewed would write to this test's table, so
    ``lock_table`` stops those at its end (:func:`stop_renewals`); this guards against what
    was on its way then, and against a test's own threads where ``this_thread`` is asked."""

    def __init__(self, *, this_thread: bool = False) -> None:
        from dynasem.conf import settings

        self.table: str = settings.TABLE_NAME
        self.thread = threading.get_ident() if this_thread else None

    def __call__(self, sent: Any) -> bool:
        if self.thread is not None and self.thread != threading.get_ident():
            return False
        if isinstance(sent, dict) and "body" in sent:  # botocore's request_dict
            sent = sent["body"]
        if isinstance(sent, str):
            sent = sent.encode()
        if isinstance(sent, bytes):
            return f'"{self.table}"'.encode() in sent or not any(k in sent for k in _NAMING)
        if isinstance(sent, dict):  # a request's parameters
            return repr(self.table) in repr(sent) or not any(k in sent for k in _NAMED)
        return True


# What names tables in a request (its parameters; their JSON in its body).
_NAMED = ("TableName", "TransactItems", "RequestItems")
_NAMING = tuple(f'"{key}"'.encode() for key in _NAMED)


def renewing() -> set[Any]:
    """The heartbeats of this process still renewing (their holds' or jobs')."""
    from dynasem._engine import heartbeat

    return set(heartbeat.scheduled())


def stop_renewals(before: set[Any], timeout: float = 5.0) -> list[str]:
    """Stop the heartbeats started since ``before`` (:func:`renewing` at a test's start) and
    still renewing at its end, as ``dynasem.testing.abandon`` does, and wait (at most
    ``timeout``) for a renewal of theirs in flight; their resources are returned. Renewed on,
    each would write to whatever table DYNASEM names next: another test's, whose fault rules
    and request counts would see it."""
    import time

    from dynasem._engine import heartbeat

    left = renewing() - before
    for beat in left:
        beat.stop()
    scheduler = heartbeat._ours()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with scheduler._cond:
            if not any(beat in scheduler._beating for beat in left):
                break
        time.sleep(0.01)
    return sorted(beat.held.resource for beat in left)


@contextlib.contextmanager
def table_of_a_test(endpoint: str, **settings: Any) -> Iterator[str]:
    """A new, empty lock table made by ``dynasem_createtable``, with DYNASEM (``settings``
    added) pointed at it, deleted at the end (the ``lock_table`` fixture's). Heartbeats started
    meanwhile and still renewing at its end are stopped first, with a warning naming their
    resources (:func:`stop_renewals`)."""
    from django.core.management import call_command
    from django.test import override_settings

    from dynasem._engine.hold import forget_left
    from dynasem._storage import dynamodb, schema

    name = f"t-{uuid.uuid4().hex[:12]}"
    forget_left()  # holds whose release an earlier test cut short: on its table, not this one
    with override_settings(DYNASEM=dynasem_settings(endpoint, name, **settings)):
        call_command("dynasem_createtable", "--wait", verbosity=0, stdout=open(os.devnull, "w"))
        # DynamoDB Local really deletes expired rows by TTL, from a background sweep at moments
        # of its own: tests that expire holds on purpose must not race it. (The createtable
        # tests check TTL on tables of their own.)
        dynamodb.get_client().update_time_to_live(
            TableName=name,
            TimeToLiveSpecification={"Enabled": False, "AttributeName": "expires"},
        )
        os.environ["DYNASEM_TEST_TABLE"] = name
        before = renewing()
        try:
            yield name
        finally:
            _warn_left_renewed(stop_renewals(before))
            try:
                schema.delete_table(name)
            except Exception:
                pass


def _warn_left_renewed(resources: list[str]) -> None:
    if resources:
        warnings.warn(
            f"dynasem tests: still renewed at the test's end (stopped): {resources}; give them "
            "back, or abandon() those the test leaves held on purpose",
            UserWarning,
            stacklevel=4,
        )


class RequestCounter:
    """Counts the DynamoDB requests actually sent, by operation, through botocore's events
    (``calls``: every thread's; :meth:`of_this_thread`: the caller's only). ``own``: count
    only the requests it tells are the test's (:class:`OwnRequests`)."""

    def __init__(self, own: OwnRequests | None = None) -> None:
        self.own = own
        self.calls: Counter[str] = Counter()
        self._by_thread: Counter[tuple[int, str]] = Counter()
        self._watched: str | None = None
        self.naming = 0  # requests whose parameters name the watched text (see watch)

    def __call__(self, model: Any, **kwargs: Any) -> None:
        if self.own is not None and not self.own(kwargs.get("params")):
            return
        self.calls[model.name] += 1
        self._by_thread[(threading.get_ident(), model.name)] += 1
        if self._watched is not None and self._watched in repr(kwargs.get("params")):
            self.naming += 1

    def watch(self, text: str) -> None:
        """Count in :attr:`naming` the requests whose parameters name ``text`` (a test's
        resource): what an earlier test of the same worker left running is not counted."""
        self._watched = text

    def of_this_thread(self, operation: str) -> int:
        """The requests of ``operation`` this thread sent (a waiter's thread renewing its
        place in line meanwhile is not counted)."""
        return self._by_thread[(threading.get_ident(), operation)]

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    def reset(self) -> None:
        self.calls.clear()
        self._by_thread.clear()
        self.naming = 0


def take(holds: list[Any], resource: str, **kwargs: Any) -> Any:
    """``semaphore(resource, **kwargs).acquire()``, released by the ``holds`` fixture."""
    from dynasem import semaphore

    held = semaphore(resource, **kwargs).acquire()
    holds.append(held)
    return held


def queue_of(resource: str) -> dict[str, Any]:
    """The live waiters queued for ``resource`` (token -> Waiter), as stored: the entry
    items'."""
    from dynasem._operators import locks as operations

    return {w.token: w for w in operations.waiters_on(resource)}


def break_holds(resource: str, token: str | None = None) -> list[HoldInfo]:
    """Break every hold on ``resource`` (or the one with ``token``); returns the broken."""
    from dynasem._operators.locks import break_hold, holds_on

    return [
        hold
        for hold in holds_on(resource)
        if (token is None or hold.token == token)
        and break_hold(resource, hold.token, user_id=hold.user_id, fence=hold.fence)
    ]


def holder_pages(resource: str, most: int) -> list[list[str]]:
    """The tokens of ``resource``'s holders, page by page as the resource page reads them
    (``operations.resource_state`` followed by its ``holds_next``)."""
    from dynasem._operators import locks as operations

    pages, after = [], None
    while True:
        state = operations.resource_state(resource, holds_after=after, most=most)
        pages.append([h.token for h in state.holds])
        if state.holds_next is None:
            return pages
        after = state.holds_next


def enqueue_entry(resource: str, token: str, waiter: Any) -> int:
    """Queue ``waiter`` for ``resource`` as a waiter would (a ticket, then its entry item),
    without anyone waiting behind it: a crashed waiter's entry, say. Returns its ticket."""
    import dataclasses

    from dynasem import _clock as clock
    from dynasem._storage import lock_rows, lock_writes, queue_entries

    row = lock_rows.update(lock_writes.take_ticket(resource, clock.new_fence(0)), return_new=True)
    assert row is not None
    waiter = dataclasses.replace(waiter, ticket=row.queue_in, token=token)
    queue_entries.put_entry(resource, row.queue_id, waiter)
    return row.queue_in


def wait_for(check: Any, timeout: float, what: str) -> Any:
    """Poll ``check()`` until it returns something true (returned), at most ``timeout`` s."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.01)
    raise AssertionError(f"{what}: not within {timeout:g}s")


def in_another_thread(work: Any) -> None:
    """Run ``work()`` to its end in another thread (what happens meanwhile, while this one is
    held at a request); its exception fails the caller."""
    import threading

    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # pragma: no cover - shown by the assert below
            errors.append(exc)

    other = threading.Thread(target=run)
    other.start()
    other.join()
    assert not errors, errors


def pushes_recorded(monkeypatch: Any) -> list[str]:
    """The tokens of the waiters this process pushes a row to from now on (the pushes are
    sent as ever), in the order they were pushed."""
    from dynasem._engine import push

    pushed: list[str] = []
    send = push.push

    def recorded(address: Any, resource: str, token: str, *args: Any, **kwargs: Any) -> bool:
        pushed.append(token)
        return send(address, resource, token, *args, **kwargs)

    monkeypatch.setattr(push, "push", recorded)
    return pushed


def assert_sent_here(seen: list[tuple[str, Any]]) -> None:
    """One signal was heard, by a receiver that ran an ORM query (``seen``: its thread's name
    and connection), in this thread with its own connection, which Django closes: not in a
    thread of dynasem's, where the connection stays open."""
    from django.db import connections

    here = threading.current_thread().name
    assert len(seen) == 1
    thread, db = seen[0]
    assert (thread, db) == (here, connections["default"]), (
        f"sent in {thread}, its connection left open: {db.connection is not None}"
    )
