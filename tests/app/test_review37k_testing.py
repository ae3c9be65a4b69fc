"""Review (thirty-seventh session, helper k): dynasem.testing as a Django user's suite meets it."""

from __future__ import annotations

import os
import unittest
from pathlib import Path

import pytest
from django.db import transaction
from django.test import TestCase

from dynasem import SemaphoreBusy, semaphore
from dynasem._operators.locks import holds_on
from dynasem._storage import dynamodb
from dynasem.conf import settings as dynasem_settings
from dynasem.testing import abandon, fresh_table, held_elsewhere
from tests.app.test_testing import user_env, write_project


def test_held_elsewhere_finds_busy_a_lock_the_tests_transaction_still_holds(
    lock_table, transactional_db
):
    """A hold given back inside a transaction that has not committed (a request under
    ``ATOMIC_REQUESTS`` in a ``TestCase``, whose transaction never commits) stays ours until
    that commit. ``held_elsewhere`` stands for another process, which finds it busy; it ran
    in the test's thread and took that hold again as the transaction's own (same token, the
    ``user=`` it was given ignored), so the test saw a lock "held elsewhere" that nobody
    else held, and the view under test re-entered it instead of answering 423."""
    with transaction.atomic():
        with semaphore("k-pending") as ours:
            pass
        assert ours.pending_commit
        with pytest.raises(SemaphoreBusy), held_elsewhere("k-pending", user="alice") as theirs:
            pytest.fail(f"held elsewhere with our own hold: {theirs.token == ours.token}")
        assert [h.token for h in holds_on("k-pending")] == [ours.token]
        assert ours.pending_commit, "still ours until the commit"
    assert holds_on("k-pending") == []


def test_a_decorated_testcases_set_up_test_data_takes_its_locks_on_a_test_table(
    monkeypatch, transactional_db
):
    """``@fresh_table()`` on a ``TestCase`` pointed ``DYNASEM`` at a table in each test's
    ``setUp`` only; ``setUpTestData`` (and any ``setUpClass``) runs before, so a lock taken
    there (test data made through a service that locks) went to the project's own
    ``DYNASEM``: AWS, with the developer's credentials, where the guide promises requests
    only ever go to the engine on 127.0.0.1. Django's own ``@override_settings`` on a class
    covers ``setUpTestData``."""
    tables: list[str] = []
    send = dynamodb.send_request

    def spy(operation: str, **request: object) -> object:
        tables.append(dynasem_settings.TABLE_NAME)
        return send(operation, **request)

    monkeypatch.setattr(dynamodb, "send_request", spy)

    @fresh_table()
    class Seeded(TestCase):
        @classmethod
        def setUpTestData(cls) -> None:
            with semaphore("k-seeded"):
                pass

        def test_seeded(self) -> None:
            with semaphore("k-seeded", wait=0):
                pass

    class SeededToo(Seeded):  # inherited: one table for its class, one per test
        pass

    load = unittest.defaultTestLoader.loadTestsFromTestCase
    result = unittest.TestSuite([load(Seeded), load(SeededToo)]).run(unittest.TestResult())
    assert result.wasSuccessful(), "\n".join(e for _, e in result.errors + result.failures)
    assert tables and all(name.startswith("dynasem-test-") for name in tables), tables
    assert dynasem_settings.TABLE_NAME not in tables  # the project's own, restored after


def test_a_lock_the_test_never_gave_back_is_reported_at_its_end(recwarn):
    """The user's code takes a lock and forgets to give it back on some path: outside a test
    the hold is renewed by its heartbeat for as long as the process runs, and every other
    caller finds the resource busy. In a test the table went, the hold with it, and nothing
    was said: the test passed. Holds given back, abandoned, or held elsewhere are not
    reported."""
    with fresh_table():
        with semaphore("k-given-back"):
            pass
        abandon(semaphore("k-abandoned").acquire())
        with held_elsewhere("k-elsewhere"):
            pass
        semaphore("k-leaked").acquire()  # the user's bug: never released
    left = [str(w.message) for w in recwarn if issubclass(w.category, UserWarning)]
    assert len(left) == 1 and "'k-leaked'" in left[0] and "never given back" in left[0], left


MARKED_SUITE = """
import pytest
from django.conf import settings

from dynasem import semaphore

pytest_plugins = ["dynasem.testing"]


@pytest.mark.dynasem(WAIT=0)
def test_marked_without_asking_for_the_fixture():
    assert settings.DYNASEM["TABLE_NAME"].startswith("dynasem-test-")
    assert settings.DYNASEM["WAIT"] == 0
    with semaphore("marked"):
        pass


def test_unmarked_gets_no_table():
    assert "TABLE_NAME" not in settings.DYNASEM


@pytest.mark.dynasem({"LEASE": 5})
def test_keys_not_by_name(dynasem_table):
    pass
"""


def test_a_test_marked_dynasem_gets_its_table_without_asking_for_the_fixture(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    """``@pytest.mark.dynasem(WAIT=0)`` on a test that does not also ask for
    ``dynasem_table`` was ignored: no table, and the test's locks went to the project's own
    ``DYNASEM`` (its production table on AWS, with the developer's credentials). pytest-django
    users know ``@pytest.mark.django_db`` as enough by itself. Keys given positionally (a
    dict) were dropped without a word."""
    write_project(pytester.path, MARKED_SUITE, "test_marked.py")
    env = user_env(pytester.path)
    # This tree's dynasem, not the one the environment has installed.
    env["PYTHONPATH"] += os.pathsep + str(Path(__file__).resolve().parents[2])
    for key in [k for k in os.environ if k not in env]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = pytester.runpytest_subprocess(
        "--ds=user_settings", "-p", "no:cacheprovider", "-p", "pytest_django", timeout=180
    )
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*takes DYNASEM keys by name*"])
