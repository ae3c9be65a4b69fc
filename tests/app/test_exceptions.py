"""dynasem.exceptions: what each error carries, declared, not set from outside, and kept
through pickle, copy and a task queue's result backend."""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import pickle
import pkgutil
from typing import Any

import pytest

import dynasem
from dynasem import (
    AlreadyDone,
    Coalesced,
    LimitExceeded,
    LockLost,
    SemaphoreBusy,
    SemaphoreError,
    SemaphoreUnavailable,
    TableMissing,
)
from dynasem._background.run_once import TransactionRolledBack
from dynasem._background.unique import RunNotEnded, Taken
from dynasem._engine.decorators import BadKey, FieldMissing, KeyNotPrintable, KeyTooLong
from dynasem._engine.steps import _Landed
from dynasem._operators.cursors import BadCursor
from dynasem._storage.dynamodb import Cancelled, Refused, WriteConflict
from dynasem._storage.records import LockItem


def test_unavailable_says_whether_to_retry_and_whether_it_may_have_applied() -> None:
    plain = SemaphoreUnavailable("refused")
    assert (plain.transient, plain.ambiguous, str(plain)) == (False, False, "refused")
    timeout = SemaphoreUnavailable("timed out", transient=True, ambiguous=True)
    assert (timeout.transient, timeout.ambiguous) == (True, True)
    assert (TableMissing("no table").transient, TableMissing("no table").ambiguous) == (
        False,
        False,
    )


def test_unavailable_keeps_its_attributes_through_pickle() -> None:
    """As a Celery task's error does."""
    again = pickle.loads(pickle.dumps(SemaphoreUnavailable("x", transient=True)))
    assert (again.transient, again.ambiguous, str(again)) == (True, False, "x")


class UsersBusy(SemaphoreBusy):
    """A user's own subclass, with an __init__ of another shape and an attribute of its own."""

    def __init__(self, job: str, *, team: str) -> None:
        super().__init__(f"job:{job}", 7, "alice")
        self.team = team


class UsersError(SemaphoreError):
    pass


# One of every exception dynasem defines (and two of users'), with every attribute set.
EXAMPLES: list[BaseException] = [
    SemaphoreError("something went wrong"),
    SemaphoreBusy("tbl_issues:42", 3),
    SemaphoreBusy("tbl_issues:42", 3, "alice"),
    SemaphoreBusy("tbl_issues:42", 2, "alice", queue_position=4, estimated_wait=1.25),
    LockLost("tbl_issues:42", "its lease ran out"),
    Coalesced("tbl_issues:42", 3, "alice", "bob"),
    Taken("unique:reindex:42", "5f0c1e"),
    RunNotEnded("unique:reindex:42", "the run that enqueued it has not ended yet"),
    SemaphoreUnavailable("DynamoDB timed out", transient=True, ambiguous=True),
    TableMissing("no table: run `manage.py dynasem_createtable`"),
    LimitExceeded("the item would exceed 400 KB", "item size"),
    LimitExceeded("throttled still after the retries", "throughput", transient=True),
    AlreadyDone("file:a.txt", 1_700_000_000_000),
    AlreadyDone("file:a.txt"),
    KeyTooLong("k" * 1100, 1024),
    KeyNotPrintable("\x1b", 12),
    BadKey("the lock key made from this request's arguments cannot be a resource"),
    FieldMissing("deploy:{slug}", KeyError("slug")),
    BadCursor("not a page cursor: 'x'"),
    TransactionRolledBack("the transaction rolled back"),
    Refused({"pk": "r", "holders": {}}, retried=True),
    Cancelled([("ConditionalCheckFailed", LockItem(resource="r")), ("None", None)], True),
    WriteConflict("TransactionConflictException: ongoing", transient=True, ambiguous=True),
    UsersBusy("nightly", team="data"),
    UsersError("a user's own"),
    _Landed(),  # internal: turned into a plain CancelledError before it leaves the driver
]


def _label(exc: BaseException) -> str:
    return type(exc).__name__


def _same(again: BaseException, exc: BaseException) -> None:
    assert type(again) is type(exc)
    assert vars(again) == vars(exc)
    assert again.args == exc.args
    assert str(again) == str(exc)
    assert repr(again) == repr(exc)


@pytest.mark.parametrize("exc", EXAMPLES, ids=_label)
@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_every_error_round_trips_through_pickle(exc: BaseException, protocol: int) -> None:
    """Celery's and django.tasks' pickle serializers, and multiprocessing, store errors so:
    the class, every attribute and the message come back."""
    _same(pickle.loads(pickle.dumps(exc, protocol)), exc)


@pytest.mark.parametrize("exc", EXAMPLES, ids=_label)
@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
def test_every_error_copies(exc: BaseException, how: Any) -> None:
    again = how(exc)
    assert again is not exc
    _same(again, exc)


def test_a_users_subclass_keeps_its_own_attributes() -> None:
    again = pickle.loads(pickle.dumps(UsersBusy("nightly", team="data")))
    assert isinstance(again, SemaphoreBusy)
    assert (again.resource, again.retry_after, again.holder_user_id) == ("job:nightly", 7, "alice")
    assert again.team == "data"


def _defined_in_dynasem() -> set[type[BaseException]]:
    found: set[type[BaseException]] = set()
    for info in pkgutil.walk_packages(dynasem.__path__, "dynasem."):
        if ".migrations" in info.name or info.name.endswith("__main__"):
            continue  # no classes there; a __main__ runs when imported
        module = importlib.import_module(info.name)
        for _name, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__.startswith("dynasem"):
                found.add(value)
    return found


def test_every_exception_class_of_dynasem_is_tried() -> None:
    """A new exception class is added to EXAMPLES, or this fails."""
    tried = {type(exc) for exc in EXAMPLES}
    missing = _defined_in_dynasem() - tried
    assert not missing, sorted(c.__qualname__ for c in missing)


# What a Celery result backend with its default (JSON) serializer stores of a task's error:
# the class's module and name, and ``args``; it rebuilds the error as ``cls(*args)``.
USER_FACING = [
    SemaphoreError("something went wrong"),
    SemaphoreBusy("tbl_issues:42", 2, "alice", queue_position=4, estimated_wait=1.25),
    Coalesced("tbl_issues:42", 2, "alice", "bob"),
    LockLost("tbl_issues:42", "its lease ran out"),
    SemaphoreUnavailable("DynamoDB refused the request"),
    TableMissing("no table"),
    LimitExceeded("the item would exceed 400 KB", "item size"),
    AlreadyDone("file:a.txt", 1_700_000_000_000),
]


@pytest.mark.parametrize("exc", USER_FACING, ids=_label)
def test_user_facing_errors_rebuild_from_their_args_as_celerys_json_backend_does(
    exc: SemaphoreError,
) -> None:
    from celery import Celery
    from celery.backends.base import Backend

    backend = Backend(app=Celery(set_as_current=False), serializer="json")
    stored = json.loads(json.dumps(backend.prepare_exception(exc)))
    again = backend.exception_to_python(stored)
    _same(again, exc)
