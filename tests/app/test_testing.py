"""dynasem.testing: what a user's own test suite needs to run code that takes dynasem locks.

The user-suite tests write a small Django project into a temporary folder and run its tests
in a subprocess, as a user would: with pytest (the plugin and its ``dynasem_table`` fixture)
and with Django's own test runner (``@fresh_table()`` on a ``TestCase``). Both take locks on
the embedded engine and check that two holders exclude each other.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings

from dynasem import SemaphoreBusy, semaphore
from dynasem._engine import heartbeat
from dynasem._operators.locks import holds_on
from dynasem._storage import dynamodb, lock_rows, lock_writes, records, schema
from dynasem._storage.dynamodb import Refused
from dynasem._storage.lock_writes import take_join, take_ticket
from dynasem._storage.records import Waiter
from dynasem.conf import settings
from dynasem.testing import ENDPOINT_ENV, engine_endpoint, fresh_table
from tests.support.helpers import enqueue_entry, queue_of

USER_SETTINGS = """
SECRET_KEY = "user-project"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "dynasem",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
ROOT_URLCONF = "user_urls"
DYNASEM = {"LEASE": 30, "CLOCK_SKEW": 1}
"""

USER_VIEWS = """
from django.db import transaction
from django.http import HttpResponse
from django.urls import path

from dynasem import current_hold, semaphore

@semaphore("deploy:{slug}", wait=0)
def deploy(request, slug):
    return HttpResponse(str(current_hold().fence))

urlpatterns = [path("deploy/<slug>/", deploy)]
"""

# Code under test in the user's project: a counter updated read-modify-write under a lock.
USER_CODE = """
import threading
import time

from dynasem import semaphore

COUNTER = {"value": 0, "inside": 0, "most_inside": 0}
_guard = threading.Lock()

def increment(name="counter"):
    with semaphore(name, wait=30):
        with _guard:
            COUNTER["inside"] += 1
            COUNTER["most_inside"] = max(COUNTER["most_inside"], COUNTER["inside"])
        value = COUNTER["value"]
        time.sleep(0.005)
        COUNTER["value"] = value + 1
        with _guard:
            COUNTER["inside"] -= 1

def hammer(threads=4, each=5):
    workers = [
        threading.Thread(target=lambda: [increment() for _ in range(each)])
        for _ in range(threads)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return COUNTER
"""


def write_project(folder: Path, tests: str, test_module: str) -> None:
    (folder / "user_settings.py").write_text(USER_SETTINGS)
    (folder / "user_urls.py").write_text(USER_VIEWS)
    (folder / "user_code.py").write_text(USER_CODE)
    (folder / test_module).write_text(textwrap.dedent(tests))


def user_env(folder: Path) -> dict[str, str]:
    """The environment of a user's test run: none of this suite's own settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DYNASEM_", "AWS_", "DJANGO_SETTINGS_MODULE"))
    }
    env["PYTHONPATH"] = str(folder)
    env["DJANGO_SETTINGS_MODULE"] = "user_settings"
    return env


PYTEST_SUITE = """
import pytest
from django.conf import settings

from dynasem import SemaphoreBusy, semaphore
from dynasem._operators.locks import holds_on
from dynasem.testing import held_elsewhere
import user_code

pytest_plugins = ["dynasem.testing"]


def test_takes_a_lock_and_two_holders_exclude_each_other(dynasem_table):
    assert settings.DYNASEM["TABLE_NAME"] == dynasem_table
    assert settings.DYNASEM["LEASE"] == 30  # the project's own keys stay
    with held_elsewhere("report:1") as held:  # another process's
        assert [h.token for h in holds_on("report:1")] == [held.token]
        with pytest.raises(SemaphoreBusy):
            semaphore("report:1", wait=0).acquire()
    assert holds_on("report:1") == []


def test_threads_never_overlap_and_lose_no_update(dynasem_table):
    counter = user_code.hammer(threads=4, each=5)
    assert counter["value"] == 20
    assert counter["most_inside"] == 1


def test_a_lock_left_behind_does_not_reach_the_next_test_part_1(dynasem_table):
    semaphore("left-behind", lease=30).acquire()  # never released


def test_a_lock_left_behind_does_not_reach_the_next_test_part_2(dynasem_table):
    with semaphore("left-behind", wait=0):
        pass


@pytest.mark.dynasem(LEASE=7)
def test_marker_overrides_settings(dynasem_table):
    assert settings.DYNASEM["LEASE"] == 7
    with semaphore("short") as held:
        assert 5 < held.seconds_left() < 7


@pytest.mark.django_db
def test_a_decorated_view_answers_423_while_held(dynasem_table, client):
    assert client.get("/deploy/my-app_v2.1/").status_code == 200
    with held_elsewhere("deploy:my-app_v2.1"):
        response = client.get("/deploy/my-app_v2.1/")
    assert response.status_code == 423
    with semaphore("deploy:my-app_v2.1"):  # the test's own hold: the view re-enters it
        assert client.get("/deploy/my-app_v2.1/").status_code == 200
"""


def test_users_pytest_suite_runs_with_the_plugin(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    write_project(pytester.path, PYTEST_SUITE, "test_user_locks.py")
    env = user_env(pytester.path)
    for key in [k for k in os.environ if k not in env]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = pytester.runpytest_subprocess(
        "--ds=user_settings", "-p", "no:cacheprovider", "-p", "pytest_django", timeout=180
    )
    result.assert_outcomes(passed=6)


DJANGO_SUITE = """
import threading

from django.test import SimpleTestCase, TestCase
from django.conf import settings

from dynasem import SemaphoreBusy, semaphore
from dynasem._operators.locks import holds_on
from dynasem.testing import fresh_table, held_elsewhere
import user_code


@fresh_table()
class LockTests(TestCase):
    def test_takes_a_lock_and_two_holders_exclude_each_other(self):
        with held_elsewhere("report:1") as held:  # another process's
            self.assertEqual([h.token for h in holds_on("report:1")], [held.token])
            with self.assertRaises(SemaphoreBusy):
                semaphore("report:1", wait=0).acquire()
        # TestCase's own transaction does not hold the lock back.
        self.assertEqual(holds_on("report:1"), [])

    def test_threads_never_overlap_and_lose_no_update(self):
        user_code.COUNTER.update(value=0, most_inside=0)
        counter = user_code.hammer(threads=3, each=4)
        self.assertEqual((counter["value"], counter["most_inside"]), (12, 1))

    def test_a_fresh_table_each_test_1(self):
        semaphore("left-behind").acquire()

    def test_a_fresh_table_each_test_2(self):
        with semaphore("left-behind", wait=0):
            pass

    def test_a_decorated_view_answers_423_while_held(self):
        with held_elsewhere("deploy:web"):
            self.assertEqual(self.client.get("/deploy/web/").status_code, 423)
        self.assertEqual(self.client.get("/deploy/web/").status_code, 200)


class MethodTests(SimpleTestCase):
    @fresh_table(LEASE=9)
    def test_one_method(self):
        self.assertEqual(settings.DYNASEM["LEASE"], 9)
        with semaphore("m") as held:
            self.assertTrue(7 < held.seconds_left() < 9)

    def test_settings_are_back_outside(self):
        self.assertEqual(settings.DYNASEM, {"LEASE": 30, "CLOCK_SKEW": 1})
"""


def test_users_django_test_runner_suite_runs_with_fresh_table(tmp_path: Path):
    write_project(tmp_path, DJANGO_SUITE, "test_user_locks.py")
    done = subprocess.run(
        [sys.executable, "-m", "django", "test", "-v", "2", "test_user_locks"],
        cwd=tmp_path,
        env=user_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=180,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Ran 7 tests" in output, output
    # A verdict is " ... ok", or "ok" on a line of its own after a warning the test caused:
    # the hold test_a_fresh_table_each_test_1 never gives back is named at its end.
    assert len(re.findall(r"^(?:.* \.\.\. )?ok$", output, re.MULTILINE)) == 7, output
    assert output.count("'left-behind' was taken during this test and never given back") == 1


# -- in this process --------------------------------------------------------------------------


def test_fresh_table_points_dynasem_at_a_new_table_and_restores_settings():
    before = dict(django_settings.DYNASEM)
    with fresh_table(LEASE=5) as name:
        assert settings.TABLE_NAME == name and settings.LEASE == 5
        assert settings.ENDPOINT_URL == engine_endpoint()
        assert settings.CLOCK_SKEW == before["CLOCK_SKEW"]  # the rest stays
        with semaphore("x") as held:
            assert held.lease == 5
            with pytest.raises(SemaphoreBusy):
                semaphore("x", wait=0).acquire()
        assert schema.describe_table() is not None
    assert django_settings.DYNASEM == before
    with fresh_table(), pytest.raises(Exception, match="(?i)not found|resource"):
        dynamodb.get_client().describe_table(TableName=name)  # deleted


def test_a_hold_left_behind_stops_renewing_with_its_table(caplog: pytest.LogCaptureFixture):
    # Renewed on, it wrote to the next test's table (DYNASEM names it by then), found no row
    # there and warned of a lost hold in the middle of that test's output (CI, 2026-12-01).
    with pytest.warns(UserWarning, match="never given back"), fresh_table(LEASE=2):
        left = semaphore("left-behind").acquire()
        assert left in [beat.held for beat in heartbeat.scheduled()]
    assert left not in [beat.held for beat in heartbeat.scheduled()]
    with fresh_table(LEASE=2), caplog.at_level("WARNING", logger="dynasem"):
        time.sleep(1.2)  # the left hold's renewals were due every 0.5 s
        with semaphore("left-behind", wait=0):
            pass
    assert [r.getMessage() for r in caplog.records if r.name.startswith("dynasem")] == []


def test_embedded_engine_serialises_contending_holders():
    inside = []
    overlaps = []
    count = {"value": 0}

    def work() -> None:
        for _ in range(5):
            with semaphore("contended", wait=30):
                inside.append(1)
                if len(inside) > 1:
                    overlaps.append(1)
                value = count["value"]
                time.sleep(0.003)
                count["value"] = value + 1
                inside.pop()

    with fresh_table():
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert count["value"] == 20 and overlaps == []


def test_endpoint_from_the_environment_replaces_the_engine(dynamodb_local, monkeypatch):
    monkeypatch.setenv(ENDPOINT_ENV, dynamodb_local)
    with fresh_table() as name:
        assert settings.ENDPOINT_URL == dynamodb_local
        with semaphore("on-local") as held:
            assert held.fence > 0
        assert schema.describe_table()["TableName"] == name


def test_bad_settings_keys_are_refused_naming_them():
    with pytest.raises(ValueError, match="LEASES"):
        fresh_table(LEASES=5)
    with pytest.raises(TypeError, match="TestCase"):

        @fresh_table()
        class NotATest:
            pass


def test_importable_without_pytest():
    code = (
        "import sys; sys.modules['pytest'] = None\n"
        "import dynasem.testing as t\n"
        "assert callable(t.fresh_table) and not hasattr(t, 'dynasem_table')\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr


def test_async_test_functions_get_a_table_too():
    import asyncio

    seen: list[Any] = []

    @fresh_table(LEASE=6)
    async def check() -> None:
        seen.append(settings.LEASE)

    asyncio.run(check())
    assert seen == [6]


# -- the embedded engine answers conditions as DynamoDB does ----------------------------------

# size() of a missing item or attribute, or of an attribute without a size (a number), is no
# value in DynamoDB: a comparison with it is false (``<>``: true), never an error. The same
# cases on DynamoDB Local and on the embedded engine: "applied", or "refused" with the old
# item when there is one (ReturnValuesOnConditionCheckFailure=ALL_OLD).
SIZE_CASES = [
    # (row before the write, condition, outcome)
    (None, "size(#x) = :zero", "refused"),
    (None, "size(#x) <> :zero", "applied"),
    (None, "NOT (size(#x) > :zero)", "applied"),
    (None, "size(#x) BETWEEN :zero AND :one", "refused"),
    (None, "size(#x) IN (:zero, :one)", "refused"),
    (None, "attribute_not_exists(#x) OR size(#x) = :one", "applied"),
    ({"other": {"S": "a"}}, "size(#x) <= :zero", "refused"),
    ({"other": {"S": "a"}}, "size(#x) = size(#y)", "refused"),
    ({"x": {"M": {}}}, "size(#x.#y) = :zero", "refused"),
    ({"x": {"N": "5"}}, "size(#x) = :one", "refused"),
    ({"x": {"N": "5"}}, "NOT (size(#x) = :one)", "applied"),
    ({"x": {"M": {"k": {"S": "v"}}}}, "size(#x) = :one", "applied"),
]


@pytest.fixture(params=["embedded", "dynamodb-local"])
def either_engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh table on the embedded engine, or on DynamoDB Local (the reference)."""
    if request.param == "dynamodb-local":
        monkeypatch.setenv(ENDPOINT_ENV, request.getfixturevalue("dynamodb_local"))
    else:
        monkeypatch.delenv(ENDPOINT_ENV, raising=False)
    with fresh_table() as name:
        yield name


def _set_format(version: int | None) -> None:
    """The table's format item as a dynasem of ``version`` would have left it (None: none)."""
    client, key = dynamodb.get_client(), records.key(records.FORMAT_PK, records.FORMAT_SK)
    if version is None:
        client.delete_item(TableName=settings.TABLE_NAME, Key=key)
    else:
        client.put_item(TableName=settings.TABLE_NAME, Item=records.format_item(version))


def test_a_fresh_table_names_the_stored_format_and_another_version_is_refused(
    either_engine: str, capsys: pytest.CaptureFixture[str]
):
    """A table fresh_table (or dynasem_createtable) makes names format version 1, which the
    system check and ``dynasem_createtable --check`` accept; one that names version 2, or none,
    both refuse, saying what the table has, what this dynasem needs and what to do."""
    from django.core.management import CommandError, call_command, execute_from_command_line

    from dynasem import checks

    assert schema.stored_format() == records.FORMAT_VERSION == 1
    assert checks.check_table_format() == []
    out = io.StringIO()
    call_command("dynasem_createtable", "--check", stdout=out)
    assert "stored format version 1" in out.getvalue()
    for version, has in [(2, "holds stored format version 2"), (None, "names no stored format")]:
        _set_format(version)
        [error] = checks.check_table_format()
        assert error.id == "dynasem.E014" and has in error.msg
        assert "this dynasem reads and writes version 1" in error.msg
        with pytest.raises(CommandError, match=has):
            call_command("dynasem_createtable", "--check")
        capsys.readouterr()
        with pytest.raises(SystemExit) as exited:
            execute_from_command_line(["manage.py", "dynasem_createtable", "--check"])
        assert exited.value.code != 0 and has in capsys.readouterr().err
    # A table naming no version gets this one's from dynasem_createtable, never over another.
    call_command("dynasem_createtable", stdout=io.StringIO())
    assert schema.stored_format() == 1 and checks.check_table_format() == []
    _set_format(2)
    with pytest.raises(CommandError, match="holds stored format version 2"):
        call_command("dynasem_createtable", stdout=io.StringIO())
    assert schema.stored_format() == 2


@pytest.mark.parametrize("row, condition, outcome", SIZE_CASES)
def test_size_of_nothing_makes_a_condition_false_not_an_error(
    either_engine: str, row: dict[str, Any] | None, condition: str, outcome: str
):
    client = dynamodb.get_client()
    key = records.key("size-case", records.LOCK_SK)
    if row is not None:
        client.put_item(TableName=either_engine, Item={**key, **row})
    names = {k: v for k, v in {"#x": "x", "#y": "y", "#w": "w"}.items() if k in condition + "#w"}
    values = {k: v for k, v in {":zero": {"N": "0"}, ":one": {"N": "1"}}.items() if k in condition}
    write = {
        "TableName": either_engine,
        "Key": key,
        "UpdateExpression": "SET #w = :w",
        "ConditionExpression": condition,
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": {**values, ":w": {"S": "written"}},
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }
    try:
        client.update_item(**write)
        got, old = "applied", None
    except client.exceptions.ConditionalCheckFailedException as exc:
        got, old = "refused", exc.response.get("Item")
    assert got == outcome
    if got == "refused":
        assert old == (None if row is None else {**key, **row})
        # In a transaction: cancelled for a failed condition, with the old item too.
        with pytest.raises(client.exceptions.TransactionCanceledException) as err:
            client.transact_write_items(TransactItems=[{"Update": write}])
        [reason] = err.value.response["CancellationReasons"]
        assert reason["Code"] == "ConditionalCheckFailed"
        assert reason.get("Item") == (None if row is None else {**key, **row})


def test_dynasems_size_conditions_on_a_reaped_row_are_refused_not_unavailable(either_engine):
    """The writes whose conditions use size(), sent when the row they were planned from has
    gone (reaped): refused with no old row, which the acquire loop plans from (free)."""
    now = int(time.time() * 1000)
    entry = lock_writes.holder_entry("u", now + 10_000, now * 1000, now, shared=False)
    seen = records.LockItem(
        holders={"a": records.Holder("u", now + 30_000, 1)}, fence=1,
        expires_ms=now + 30_000, mode="c", limit=2,
    )  # fmt: skip
    writes = {
        "take_join": take_join("gone", "b", entry, mode="c", limit=2, seen=seen, evict=[]),
        "take_ticket": take_ticket("gone", now * 1000, if_busy_ms=now),
    }  # fmt: skip
    for name, write in writes.items():
        with pytest.raises(Refused) as refused:
            lock_rows.update(write)
        assert refused.value.lock is None, name
    # A queue row with nobody holding (waiters queued, then the holders' row reaped and the
    # queue made anew): a newcomer joins behind the waiters.
    enqueue_entry("queued", "w1", Waiter(0, now + 10_000))
    lock_rows.update(take_ticket("queued", now * 1000, if_busy_ms=now))
    assert set(queue_of("queued")) == {"w1"} and lock_rows.get("queued").queue_in == 2


def test_a_counting_lock_reaped_between_the_read_and_the_join_is_taken(either_engine):
    """B plans to join A's counting hold; before B's write, A releases and the reaper deletes
    the row. DynamoDB refuses B's join (its size() condition is false), and B takes it."""
    first = semaphore("pool", limit=2, lease=30).acquire()
    client = dynamodb.get_client()
    reaped = []

    def reap_before_the_join(params: dict[str, Any], **kwargs: Any) -> None:
        if "size(#h) = :size" in params.get("ConditionExpression", "") and not reaped:
            reaped.append(True)
            first.release()
            client.delete_item(
                TableName=settings.TABLE_NAME, Key=records.key("pool", records.LOCK_SK)
            )

    client.meta.events.register("before-parameter-build.dynamodb.UpdateItem", reap_before_the_join)
    try:
        # B's lease ends before A's: its blind first try is refused, and it plans a join.
        with semaphore("pool", limit=2, lease=10, wait=0) as second:
            assert reaped
            assert second.fence > first.fence
            assert [h.token for h in holds_on("pool")] == [second.token]
    finally:
        client.meta.events.unregister(
            "before-parameter-build.dynamodb.UpdateItem", reap_before_the_join
        )


def test_moto_outside_the_embedded_server_is_left_as_it_was():
    """The engine's size() answers hold inside its own server only: a suite's own mock_aws
    in this process keeps moto's behaviour."""
    from moto.dynamodb.comparisons import FUNC_CLASS, AttributePath, FuncSize

    from dynasem.testing.embedded import _answer_size_as_dynamodb

    _answer_size_as_dynamodb()  # as every embedded engine does when it starts
    assert FUNC_CLASS["size"] is not FuncSize
    with pytest.raises(ValueError):
        FUNC_CLASS["size"](AttributePath(["missing"])).expr(None)
