"""Testing code that uses dynasem, with nothing but pip (no Java, no AWS).

An embedded DynamoDB-compatible engine (moto's backend behind a server that serves one
request at a time, so every conditional write is atomic) is started once per process; each
test gets a fresh lock table on it and ``settings.DYNASEM`` pointed at that table.

pytest (with pytest-django)::

    # conftest.py
    pytest_plugins = ["dynasem.testing"]

    def test_rebuild(dynasem_table, client): ...          # a fresh table per test

    @pytest.mark.dynasem(LEASE=5, CLOCK_SKEW=1)             # DYNASEM keys for this test
    def test_short_lease(dynasem_table): ...

Django's test runner (``manage.py test``)::

    from dynasem.testing import fresh_table

    @fresh_table()                        # a fresh table for every test of the class
    class RebuildTests(TestCase): ...

    with fresh_table(WAIT=1) as table_name: ...             # or around any code

``DYNASEM_TESTING_ENDPOINT_URL`` (say, DynamoDB Local's ``http://127.0.0.1:8000``) replaces
the embedded engine. Importable without pytest; the engine needs the ``testing`` extra
(``pip install dynasem[testing]``: moto's server).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import os
import threading
import unittest
import uuid
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .embedded import EmbeddedDynamoDB

__all__ = [
    "ENDPOINT_ENV",
    "EmbeddedDynamoDB",
    "abandon",
    "engine_endpoint",
    "fresh_table",
    "held_elsewhere",
]

ENDPOINT_ENV = "DYNASEM_TESTING_ENDPOINT_URL"
REGION = "us-east-1"
# A local engine accepts any credentials, but boto3 signs nothing without some: these are
# set for a test only where the environment has none.
_DUMMY_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}

_engine: EmbeddedDynamoDB | None = None
_engine_lock = threading.Lock()

F = TypeVar("F", bound=Callable[..., Any])


def __getattr__(name: str) -> Any:
    # moto is imported only when the engine is wanted.
    if name == "EmbeddedDynamoDB":
        from .embedded import EmbeddedDynamoDB

        return EmbeddedDynamoDB
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def engine_endpoint() -> str:
    """The endpoint tests use: ``$DYNASEM_TESTING_ENDPOINT_URL`` if set, otherwise an
    embedded engine on a free port of 127.0.0.1, started on first use and kept for the
    process (its tables live in memory)."""
    if configured := os.environ.get(ENDPOINT_ENV):
        return configured
    global _engine
    with _engine_lock:
        if _engine is None:
            try:
                from .embedded import EmbeddedDynamoDB
            except ImportError as exc:
                raise ImportError(
                    f"dynasem.testing's embedded engine needs moto's server ({exc}): "
                    "pip install 'dynasem[testing]', or set "
                    f"{ENDPOINT_ENV} to a DynamoDB Local endpoint"
                ) from exc
            _engine = EmbeddedDynamoDB().start()
        return _engine.endpoint_url


@contextlib.contextmanager
def held_elsewhere(*args: Any, **kwargs: Any) -> Iterator[Any]:
    """Hold ``semaphore(*args, **kwargs)`` as another process would, for a test that checks
    what a busy lock does (a view answering 423, a task refused):

    ```python
    with held_elsewhere("tbl_issues:42", user="alice"):
        assert client.post("/rebuild/42/").status_code == 423
    ```

    Taken in a context of its own: a hold taken in the test's own thread would be re-entered
    by the code under test (Django's test client runs the view in the test's thread), which
    then runs as a nested acquire instead of finding the lock busy (so is a hold this thread
    gave back in a transaction not committed yet: busy for it). ``as`` gives the Held.
    A hold no longer ours at the block's end (``abandon``-ed and taken over, broken) ends it
    quietly: that process's loss is not the test's failure."""
    from .. import LockLost, semaphore
    from .._engine import reentry

    # Another process's hold is in no transaction of this test: given back at the block's
    # end, not after a commit of the test's transaction (a TestCase's never comes).
    kwargs.setdefault("on_commit", False)

    def acquire() -> Any:
        # Nor does it take again a hold this thread gave back inside a transaction that has
        # not committed (a request under ATOMIC_REQUESTS in a TestCase): that lock is busy.
        reentry.as_another_process.set(True)
        return semaphore(*args, **kwargs).acquire()

    held = contextvars.Context().run(acquire)
    try:
        yield held
    finally:
        with contextlib.suppress(LockLost):  # logged and signalled as found
            held.release()


def abandon(held: Any) -> None:
    """Leave ``held`` as a holder whose process died would: its lease is no longer renewed
    and nothing is released, so the lock stays taken until that lease runs out (then the
    next waiter takes it over, or the reaper clears it), for a test of what your code does
    when a holder dies mid-work:

    ```python
    with fresh_table(CLOCK_SKEW=0.5):  # or @pytest.mark.dynasem(CLOCK_SKEW=0.5)
        held = semaphore("tbl_issues:42", lease=2).acquire()
        abandon(held)                  # its process "dies" holding the lock
        time.sleep(2 + 0.5 + 0.5)      # its lease, then CLOCK_SKEW, then a margin
        with semaphore("tbl_issues:42", wait=0) as taken:
            assert taken.fence > held.fence
    ```

    Another process takes a dead holder's lock over once its lease and ``CLOCK_SKEW`` (5 s
    by default, and a lease must be longer) have passed: a short skew keeps such a test
    short.

    The hold object itself still works (``release()`` gives the lock back while its lease
    lasts); only the background renewal stops, and the thread that took it no longer
    re-enters it (a nested acquire there finds the lock busy, as any other process does)."""
    from .._engine.hold import Held
    from .._engine.hold import abandon as left_by_its_process

    if not isinstance(getattr(held, "outer", held), Held):  # outer: a nested acquire's view
        raise TypeError(
            "abandon() takes a hold (what acquire() returns, or a with block's `as`), not "
            f"{type(held).__name__}: {held!r}"
        )
    left_by_its_process(held)


@contextlib.contextmanager
def _table(settings: dict[str, Any]) -> Iterator[str]:
    """A new lock table with ``DYNASEM`` pointed at it, deleted afterwards: what
    :class:`fresh_table` enters."""
    from django.test import override_settings

    from .._engine import heartbeat
    from .._engine.hold import forget_left
    from .._engine.reentry import forget_acquired
    from .._storage import records, schema
    from .._transactions import commit
    from ..conf import settings as dynasem_settings

    forget_acquired()  # holds of earlier tests are on other tables: never re-entered
    forget_left()  # nor given back at exit
    endpoint = engine_endpoint()
    name = f"dynasem-test-{uuid.uuid4().hex[:12]}"
    # Where the user chose credentials (a profile), they are left alone.
    missing = [k for k in _DUMMY_CREDENTIALS if not os.environ.get(k)]
    env_set = [] if "AWS_PROFILE" in os.environ else missing
    os.environ.update({key: _DUMMY_CREDENTIALS[key] for key in env_set})
    dynasem = {**dynasem_settings.raw, "TABLE_NAME": name, "ENDPOINT_URL": endpoint}
    try:
        with override_settings(DYNASEM={**dynasem, "REGION_NAME": REGION, **settings}):
            schema.create_table(records.table_definition(name))
            schema.wait_until_active(name)
            schema.write_format()
            renewing = set(heartbeat.scheduled())
            waiting = set(commit.give_backs())
            try:
                yield name
            finally:
                # A give-back waiting for the test's transaction, which a TestCase rolls back
                # after this table's end: ended now, on this table (set off by that rollback,
                # it would go to the project's own DYNASEM, maybe AWS).
                commit.end_now(p for p in commit.give_backs() if p not in waiting)
                # A hold left behind goes with its table: renewed on, it would write to whatever
                # table DYNASEM names next (another test's) and warn there of a lost hold.
                left = set(heartbeat.scheduled()) - renewing
                for beat in left:
                    beat.stop()
                schema.delete_table(name)
                _report_left(sorted(beat.held.resource for beat in left))
    finally:
        for key in env_set:
            os.environ.pop(key, None)


def _report_left(resources: list[str]) -> None:
    """Warn of holds taken during a test and never given back (nor abandoned): ended with
    the test's table, but outside a test each stays held, renewed, while its process runs."""
    for resource in resources:
        warnings.warn(
            f"dynasem: {resource!r} was taken during this test and never given back: it "
            "ended with the test's table, but outside a test it stays held (renewed) for as "
            "long as its process runs. Give it back (a with block, release()), or abandon() "
            "it where the test leaves it held on purpose",
            UserWarning,
            stacklevel=5,  # past _table, contextlib and fresh_table.__exit__: the with block
        )


class fresh_table:  # noqa: N801 - used like a function: with fresh_table(), @fresh_table()
    """A new, empty lock table on the test engine, with ``DYNASEM`` pointed at it (and
    ``settings`` overriding any ``DYNASEM`` key, e.g. ``WAIT=1``); deleted afterwards.

    A context manager (``as`` gives the table's name), and a decorator of test functions,
    test methods and ``unittest``/Django ``TestCase`` classes (a fresh table per test, and
    one for ``setUpClass`` and ``setUpTestData``, whose holds the tests do not see). A hold
    left unreleased goes with its table: it is renewed no more once the table is deleted,
    and a ``UserWarning`` names it (``abandon()`` one left on purpose)."""

    def __init__(self, **settings: Any) -> None:
        from ..conf import DEFAULTS

        if unknown := sorted(set(settings) - set(DEFAULTS)):
            raise ValueError(
                f"fresh_table() got {', '.join(unknown)}, which are not DYNASEM keys "
                f"(those are {', '.join(DEFAULTS)})"
            )
        self.settings = settings
        self._table: Any = None

    def __enter__(self) -> str:
        if self._table is not None:
            raise RuntimeError("a fresh_table() is entered once; make a new one for each use")
        self._table = _table(self.settings)
        return self._table.__enter__()  # type: ignore[no-any-return]

    def __exit__(self, *exc_info: Any) -> None:
        self._table.__exit__(*exc_info)

    def __call__(self, obj: F) -> F:
        settings = self.settings
        if isinstance(obj, type):
            if not issubclass(obj, unittest.TestCase):
                raise TypeError(
                    f"@fresh_table() decorates test functions, methods and TestCase classes, "
                    f"not the class {obj.__qualname__}"
                )
            return _fresh_tables_for(obj, settings)  # type: ignore[return-value]
        if inspect.iscoroutinefunction(obj):

            @functools.wraps(obj)
            async def async_inner(*args: Any, **kwargs: Any) -> Any:
                with fresh_table(**settings):
                    return await obj(*args, **kwargs)

            return async_inner  # type: ignore[return-value]

        @functools.wraps(obj)
        def inner(*args: Any, **kwargs: Any) -> Any:
            with fresh_table(**settings):
                return obj(*args, **kwargs)

        return inner  # type: ignore[return-value]


def _fresh_tables_for(cls: type[unittest.TestCase], settings: dict[str, Any]) -> type:
    """``cls`` with a fresh table for each test, and one of the class's own for
    ``setUpClass`` and ``tearDownClass`` (a ``TestCase``'s ``setUpTestData`` runs there):
    without it, a lock taken there went to the project's own ``DYNASEM``, maybe to AWS."""
    set_up = cls.setUp
    set_up_class = cls.__dict__.get("setUpClass")  # a classmethod, or inherited: None

    def setUp(self: unittest.TestCase) -> None:  # noqa: N802 - unittest's name
        self.enterContext(fresh_table(**settings))  # deleted after tearDown
        set_up(self)

    def setUpClass(klass: type[unittest.TestCase]) -> None:  # noqa: N802 - unittest's name
        klass.enterClassContext(fresh_table(**settings))  # deleted after tearDownClass
        if set_up_class is not None:
            set_up_class.__get__(None, klass)()
        else:
            super(cls, klass).setUpClass()  # type: ignore[misc]

    cls.setUp = setUp  # type: ignore[method-assign]
    cls.setUpClass = classmethod(setUpClass)  # type: ignore[assignment,method-assign]
    return cls


# -- pytest plugin: pytest_plugins = ["dynasem.testing"] ----------------------------------------

try:
    import pytest
except ImportError:  # pytest is optional: the rest of this module works without it
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    def pytest_configure(config: Any) -> None:
        config.addinivalue_line(
            "markers",
            "dynasem(**settings): a fresh lock table for the test (dynasem_table), with "
            "these DYNASEM keys",
        )

    @pytest.fixture(scope="session")
    def dynasem_endpoint() -> str:
        """The test engine's endpoint (the embedded engine, or
        ``$DYNASEM_TESTING_ENDPOINT_URL``), for the whole session."""
        return engine_endpoint()

    @pytest.fixture
    def dynasem_table(request: Any, dynasem_endpoint: str) -> Iterator[str]:
        """A fresh lock table for this test, with ``settings.DYNASEM`` pointed at it (plus
        the keys of a ``@pytest.mark.dynasem(...)`` marker); yields the table's name."""
        marker = request.node.get_closest_marker("dynasem")
        if marker is not None and marker.args:
            raise TypeError(
                f"@pytest.mark.dynasem takes DYNASEM keys by name, e.g. "
                f"@pytest.mark.dynasem(WAIT=1), not {marker.args!r}"
            )
        with fresh_table(**(marker.kwargs if marker else {})) as name:
            yield name

    @pytest.fixture(autouse=True)
    def _dynasem_marked(request: Any) -> None:
        """A test marked ``@pytest.mark.dynasem(...)`` gets its table without asking for
        ``dynasem_table`` (as ``django_db`` gives database access): ignored, the marker left
        the test's locks on the project's own ``DYNASEM``, maybe AWS."""
        if request.node.get_closest_marker("dynasem") is not None:
            request.getfixturevalue("dynasem_table")
