"""Operators under lag: the lock list, ``dynasem_locks``, ``dynasem_release``, ``dynasem_reap``
and the admin's break, on an index that lags and reads that are stale, as DynamoDB's may be.

DynamoDB Local updates its indexes in the same write and answers every read consistently, so
the staleness is made here: ``frozen_index`` answers the expires index's queries as they were
at a moment (an entry still there, with its old projection, after its item changed; an entry
missing after its item was written), and ``stale_reads`` answers every read sent without
ConsistentRead with the items as they were at a moment. Whatever is read stale, nothing live
is deleted or broken, and what the operator is told says what happened.
"""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.urls import reverse

from dynasem import _clock as clock
from dynasem import run_once, semaphore
from dynasem._operators import jobs as job_operations
from dynasem._operators.locks import holds_on
from dynasem._storage import dynamodb, index_queries, job_rows, lock_rows, records
from dynasem.conf import settings
from dynasem.testing import abandon
from tests.support.faults import Faults
from tests.support.helpers import take

# This module makes the lag, the stale reads and the faults itself, request by request, on an
# engine that answers exactly: the unkind engine's own (an index that has not listed a row
# yet, a Scan that has not seen a job, a lost answer of its own) would change what it proves.
pytestmark = pytest.mark.kind_engine_only(
    "makes its own lag and faults, to the request, and counts them"
)

# A reap finds a row once its 15-minute expires bucket has passed: the commands run this much
# later (this process's clock moved on), past the bucket of any short lease taken here.
LATER = records.BUCKET_S + 60
LIVE_LEASE = 3 * records.BUCKET_S
# What every listing from the indexes says, in the admin and in dynasem_locks.
ASYNC_NOTE = "updated asynchronously"


def run(name: str, *args: str, **options: Any) -> str:
    out = io.StringIO()
    call_command(name, *args, stdout=out, **options)
    return out.getvalue()


def run_both(name: str, *args: str) -> tuple[str, str]:
    """A command's stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    call_command(name, *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def json_lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.fixture
def later(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], None]:
    """``later(seconds)``: this process's wall clock runs ``seconds`` ahead from now on."""

    def shift(seconds: float) -> None:
        monkeypatch.setattr(clock, "wall_clock", lambda: time.time() + seconds)

    return shift


@pytest.fixture
def frozen_index(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """``freeze()``: from now on the expires index answers as it did at this moment, as a
    global secondary index lagging behind its table does: an entry of an item changed or
    deleted since is still there with its old ``expires``; one written since is missing."""

    def freeze() -> None:
        # One page a shard: the test's table is far below a page's 1 MB.
        snapshot = {s: index_queries.query_expiring(s, since=0)[0] for s in range(records.SHARDS)}

        def query(
            shard: int,
            *,
            before: int | None = None,
            since: int | None = None,
            limit: int | None = None,
            start: dict[str, Any] | None = None,
            shared_only: bool = False,
        ) -> tuple[list[records.IndexEntry], dict[str, Any] | None]:
            entries = [
                entry
                for entry in snapshot[shard]
                if (before is None or entry.listed_s < before)
                and (since is None or entry.listed_s >= since)
                and not (shared_only and entry.mode == "x")
            ]
            return entries, None

        monkeypatch.setattr(index_queries, "query_expiring", query)

    return freeze


@pytest.fixture
def stale_reads(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """``as_of()``: from now on a GetItem or BatchGetItem sent without ConsistentRead is
    answered with the items as they were at this moment (a replica that has not applied the
    writes since); a consistent read sees the table."""

    def as_of() -> None:
        client = dynamodb.get_client()
        items = client.scan(TableName=settings.TABLE_NAME, ConsistentRead=True)["Items"]
        old = {(i["pk"]["S"], i["sk"]["S"]): i for i in items}
        send = dynamodb.send_request

        def answer(operation: str, **kwargs: Any) -> dict[str, Any]:
            if operation == "get_item" and not kwargs.get("ConsistentRead"):
                found = old.get((kwargs["Key"]["pk"]["S"], kwargs["Key"]["sk"]["S"]))
                return {"Item": found} if found else {}
            if operation == "batch_get_item":
                ((name, asked),) = kwargs["RequestItems"].items()
                if not asked.get("ConsistentRead"):
                    keys = [(k["pk"]["S"], k["sk"]["S"]) for k in asked["Keys"]]
                    return {"Responses": {name: [old[k] for k in keys if k in old]}}
            return send(operation, **kwargs)

        monkeypatch.setattr(dynamodb, "send_request", answer)

    return as_of


def dead_hold(holds: list[Any], resource: str) -> Any:
    """A hold whose holder died: no heartbeat, a 1 s lease."""
    held = semaphore(resource, lease=1).acquire()
    abandon(held)
    holds.append(held)
    return held


@pytest.fixture
def before_break(lock_table: str) -> Any:
    """``before_break(do)``: ``do()`` runs once, just before an operator's first break (the
    UpdateItem that records ``brokenToken``) is sent: the hold changes after it was read."""
    hooked: list[tuple[Any, Any]] = []

    def install(do: Callable[[], None]) -> None:
        done: list[bool] = []

        def hook(params: dict[str, Any], **kwargs: Any) -> None:
            if done or "brokenToken" not in params.get("ExpressionAttributeNames", {}).values():
                return
            done.append(True)
            do()

        for client in (dynamodb.get_client(), dynamodb.get_client(quick=True)):
            client.meta.events.register("before-parameter-build.dynamodb.UpdateItem", hook)
            hooked.append((client, hook))

    yield install
    for client, hook in hooked:
        client.meta.events.unregister("before-parameter-build.dynamodb.UpdateItem", hook)


# ---------------------------------------------------------------------------------------------
# dynasem_reap
# ---------------------------------------------------------------------------------------------


def test_reap_keeps_a_row_taken_again_after_the_index_listed_it_and_says_so(
    lock_table, holds, later, frozen_index
):
    dead_hold(holds, "lag:dead")
    dead_hold(holds, "lag:retaken")
    frozen_index()  # both listed with their old (past) lease end from now on
    later(LATER)
    retaken = take(holds, "lag:retaken", lease=LIVE_LEASE)
    out = run("dynasem_reap")
    assert [h.token for h in holds_on("lag:retaken")] == [retaken.token]
    assert lock_rows.get_item("lag:dead") is None
    assert "Deleted 1 expired rows." in out
    assert "1 row changed since the index listed it and was kept" in out
    # The index still lists both: the row deleted since counts as changed too.
    totals = json_lines(run("dynasem_reap", "--json"))[-1]
    assert totals["changed_since_listed"] == 2 and totals["deleted"] == 0
    retaken.renew()  # still ours


def test_reap_dry_run_on_a_lagging_index_lists_only_what_it_would_delete(
    lock_table, holds, later, frozen_index, stale_reads
):
    dead_hold(holds, "dry:dead")
    dead_hold(holds, "dry:retaken")
    frozen_index()
    stale_reads()  # a read that is not consistent still sees dry:retaken expired
    later(LATER)
    retaken = take(holds, "dry:retaken", lease=LIVE_LEASE)
    out = run("dynasem_reap", "--dry-run")
    listed = [line.split()[0] for line in out.splitlines() if "(lease ended by" in line]
    assert listed == ["dry:dead"]
    assert "Would delete 1 expired rows." in out
    assert "1 row changed since the index listed it: it would be kept" in out
    *rows, totals = json_lines(run("dynasem_reap", "--dry-run", "--json"))
    assert [r["resource"] for r in rows] == ["dry:dead"]
    assert totals["found"] == 2 and totals["changed_since_listed"] == 1
    assert [h.token for h in holds_on("dry:retaken")] == [retaken.token]
    assert lock_rows.get_item("dry:dead") is not None


def test_reap_keeps_a_permit_renewed_after_it_was_read(lock_table, holds, later, monkeypatch):
    """The reaper frees a dead permit only as it read it: one renewed meanwhile stays held,
    and the reaper says it changed since listed."""
    from dynasem._engine import permit_hold as permit_held
    from dynasem._storage import permit_items as slots

    live = take(holds, "pool:lag", limit=20, lease=LIVE_LEASE)
    dead = semaphore("pool:lag", limit=20, lease=1).acquire()
    abandon(dead)
    later(5)  # the dead one's lease (1 s) is over by more than CLOCK_SKEW
    renewed: list[bool] = []
    real = permit_held.break_permit

    def renew_first(resource: str, token: str, permit: Any = None) -> bool:
        if not renewed:  # after the reaper read the permit, before its conditional break
            renewed.append(True)
            ends = clock.now_ms() + 60_000
            slots.send(slots.renew_permit(resource, dead.slots[resource], token, ends))
        return real(resource, token, permit)

    monkeypatch.setattr(permit_held, "break_permit", renew_first)
    out = run("dynasem_reap")
    assert renewed
    assert {h.token for h in holds_on("pool:lag")} == {live.token, dead.token}
    assert "changed since" in out
    holds.append(dead)  # released, or cleaned up, at the end (its own heartbeat is stopped)


# ---------------------------------------------------------------------------------------------
# dynasem_reap under lost answers and throttling
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def faults(lock_table: str) -> Iterator[tuple[Faults, Faults]]:
    """Faults on both of dynasem's clients: the locks' own (botocore retries, 4 attempts) and
    the quick one of operators' pages and commands (one attempt)."""
    with Faults(dynamodb.get_client()) as main, Faults(dynamodb.get_client(quick=True)) as quick:
        yield main, quick


def run_failing(name: str, *args: str) -> tuple[str, CommandError]:
    """A command that must fail: what it printed before, and its CommandError."""
    out = io.StringIO()
    with pytest.raises(CommandError) as failed:
        call_command(name, *args, stdout=out)
    return out.getvalue(), failed.value


def test_reap_counts_a_delete_whose_answer_was_lost_as_deleted(lock_table, holds, later, faults):
    dead_hold(holds, "lost:1")
    later(LATER)
    lost = [client.lose_response("DeleteItem") for client in faults]
    totals = json_lines(run("dynasem_reap", "--json"))[-1]
    assert sum(rule.fired for rule in lost) == 1  # applied, and its answer lost
    assert lock_rows.get_item("lost:1") is None
    assert (totals["deleted"], totals["changed_since_listed"]) == (1, 0)
    assert totals["failed"] == 0


def test_a_retried_reaper_delete_of_a_row_gone_counts_as_deleted(lock_table, holds, faults):
    """On the locks' client botocore re-sends a delete whose answer was lost: the re-sent one
    is refused, the row gone. That is the first one's doing, not a row changed since listed."""
    main, _ = faults
    dead_hold(holds, "lost:2")
    cutoff = lock_rows.get_item("lost:2")["expires"] * 1000 + 1000  # lease and bucket over
    rule = main.lose_response("DeleteItem")
    assert lock_rows.delete_expired("lost:2", cutoff) is True
    assert rule.fired == 1 and lock_rows.get_item("lost:2") is None
    # Gone before this delete (TTL, another reaper) and sent once: not ours to count.
    assert lock_rows.delete_expired("lost:2", cutoff) is False


def test_reap_deletes_through_the_quick_client(lock_table, holds, later, faults):
    """An operator's reap answers within seconds when DynamoDB hangs: its deletes, sent from
    its worker threads, go through the quick client as its reads do."""
    main, _ = faults
    dead_hold(holds, "quick:1")
    dead_hold(holds, "quick:2")
    later(LATER)
    hung = main.read_timeout("DeleteItem", 100)
    out = run("dynasem_reap")
    assert hung.fired == 0
    assert "Deleted 2 expired rows." in out


def test_reap_reads_again_what_was_throttled(lock_table, holds, later, faults):
    """Its reads go through the quick client too (one attempt each): a throttled index query,
    or read of the rows, is sent again, as the locks' client would have, not the end of it."""
    dead_hold(holds, "slow:1")
    pool = take(holds, "slow:pool", limit=20, lease=LIVE_LEASE)
    dead = semaphore("slow:pool", limit=20, lease=1).acquire()
    abandon(dead)
    later(LATER)
    for client in faults:
        for operation in ("Query", "BatchGetItem"):
            client.throttle(operation, 2)
    out = run("dynasem_reap")
    assert [client.fired for client in faults] == [0, 4]  # all on the quick client
    assert "Deleted 1 expired rows." in out and "Freed 1 permits" in out
    assert [h.token for h in holds_on("slow:pool")] == [pool.token]


def test_reap_goes_on_past_a_row_it_could_not_delete_and_says_which(
    lock_table, holds, later, faults
):
    from dynasem._storage import permit_items as slots

    dead_hold(holds, "stuck:1")
    dead_hold(holds, "stuck:2")
    live = take(holds, "stuck:pool", limit=20, lease=LIVE_LEASE)
    dead_permit = semaphore("stuck:pool", limit=20, lease=1).acquire()
    abandon(dead_permit)
    later(LATER)
    # The first delete goes through; every one after it is throttled, after every retry.
    for client in faults:
        client.throttle("DeleteItem", 100, after=1)
    out, failed = run_failing("dynasem_reap", "--workers", "1")
    assert failed.returncode == 3
    stuck = [r for r in ("stuck:1", "stuck:2") if lock_rows.get_item(r) is not None]
    assert len(stuck) == 1 and repr(stuck[0]) in str(failed)
    assert "1 row could not be deleted" in str(failed) and "throttled" in str(failed)
    assert "Deleted 1 expired rows." in out
    # The rest of the reap went on: the dead holder's permit was freed.
    assert "Freed 1 permits" in out
    assert [p.token for p in slots.permits("stuck:pool") if p.token] == [live.token]
    out, failed = run_failing("dynasem_reap", "--json")
    *lines, totals = json_lines(out)
    assert [(f["resource"], f["item"]) for f in lines] == [(stuck[0], "row")]
    assert "throttled" in lines[0]["error"] and lines[0]["maybe_applied"] is False
    assert (totals["deleted"], totals["failed"]) == (0, 1)


def test_a_reap_whose_listing_failed_partway_says_what_it_deleted_before(
    lock_table, holds, later, monkeypatch
):
    """The expires index is listed shard after shard: one listing refused after rows of an
    earlier shard were deleted ends the reap (exit status 1), and says both."""
    from dynasem.exceptions import SemaphoreUnavailable

    for i in range(6):
        dead_hold(holds, f"partway:{i}")
    later(LATER)
    original, listed = index_queries.query_expiring, []

    def query(shard: int, **kwargs: Any) -> Any:
        if any(rows for rows, _ in listed):
            raise SemaphoreUnavailable("AccessDenied on the expires index")
        listed.append(original(shard, **kwargs))
        return listed[-1]

    monkeypatch.setattr(index_queries, "query_expiring", query)
    out, failed = run_failing("dynasem_reap", "--workers", "1")
    deleted = len(listed[-1][0])
    assert 0 < deleted < 6
    assert sum(lock_rows.get_item(f"partway:{i}") is None for i in range(6)) == deleted
    assert failed.returncode == 1
    assert "AccessDenied on the expires index" in str(failed)
    assert f"{deleted} expired row" in str(failed) and f"Deleted {deleted} expired rows." in out


# ---------------------------------------------------------------------------------------------
# dynasem_locks
# ---------------------------------------------------------------------------------------------


def test_locks_says_its_list_comes_from_an_index(lock_table, holds, frozen_index):
    old = take(holds, "lag:old", user="alice", lease=60)
    frozen_index()
    take(holds, "lag:new", user="bob", lease=60)  # the index does not list it yet
    out, note = run_both("dynasem_locks")
    assert "lag:old" in out and "lag:new" not in out
    assert ASYNC_NOTE in note and "dynasem_locks RESOURCE" in note  # rows alone on stdout
    (line,) = json_lines(run("dynasem_locks", "--json"))
    assert line["token"] == old.token[:8] and line["consistent"] is False
    empty, note = run_both("dynasem_locks", "--resource-prefix", "lag:new")
    assert empty == "No active holds.\n" and ASYNC_NOTE in note


def test_locks_of_one_resource_reads_it_consistently(lock_table, holds, frozen_index, stale_reads):
    frozen_index()
    stale_reads()  # neither the index nor a read that is not consistent sees it yet
    new = take(holds, "lag:one", user="bob", lease=60)
    out, note = run_both("dynasem_locks", "lag:one")
    assert "bob" in out and str(new.fence) in out
    assert ASYNC_NOTE not in out + note
    (line,) = json_lines(run("dynasem_locks", "lag:one", "--json"))
    assert (line["resource"], line["token"], line["consistent"]) == (
        "lag:one",
        new.token[:8],
        True,
    )
    assert "Nobody holds 'lag:free'" in run("dynasem_locks", "lag:free")
    assert run("dynasem_locks", "lag:free", "--json") == ""
    with pytest.raises(CommandError, match="--resource-prefix"):
        run("dynasem_locks", "lag:one", "--resource-prefix", "lag:")


# ---------------------------------------------------------------------------------------------
# dynasem_release
# ---------------------------------------------------------------------------------------------


def test_release_of_a_hold_replaced_since_it_was_read_breaks_nothing_and_says_so(
    lock_table, holds, before_break
):
    first = semaphore("swap:1", user="alice").acquire()
    second: list[Any] = []

    def replace() -> None:
        first.release()
        second.append(take(holds, "swap:1", user="bob"))

    before_break(replace)
    with pytest.raises(CommandError, match="changed since listed") as refused:
        run("dynasem_release", "swap:1", "--yes")
    assert refused.value.returncode == 3
    assert [h.token for h in holds_on("swap:1")] == [second[0].token]
    second[0].renew()  # still ours


def test_release_json_says_which_hold_changed_since_listed(lock_table, holds, before_break):
    first = semaphore("swap:2", user="alice").acquire()
    before_break(lambda: (first.release(), take(holds, "swap:2", user="bob")))
    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("dynasem_release", "swap:2", "--yes", "--json", stdout=out)
    (line,) = json_lines(out.getvalue())
    assert line["broken"] is False and line["outcome"] == "changed_since_listed"
    assert line["token"] == first.token[:8]


# ---------------------------------------------------------------------------------------------
# run_once jobs: listed by a Scan (eventually consistent), read consistently one at a time
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def stale_scan(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """``as_of()``: from now on the Scan of run_once rows answers as it did at this moment,
    as a Scan without ConsistentRead may (a replica that has not applied the writes since)."""

    def as_of() -> None:
        pages: dict[tuple[Any, ...], Any] = {}
        scan = job_rows.scan_jobs

        def answer(prefix: str | None, status: str | None, start: Any) -> Any:
            asked = (prefix, status, json.dumps(start, sort_keys=True))
            if asked not in pages:
                pages[asked] = scan(prefix, status, start)
            return pages[asked]

        for status in (None, "FAILED"):
            answer(None, status, None)
        monkeypatch.setattr(job_rows, "scan_jobs", answer)

    return as_of


def failed_job(key: str) -> None:
    with pytest.raises(RuntimeError), run_once(key):
        raise RuntimeError("boom")


def test_jobs_say_their_list_is_eventually_consistent_and_a_key_reads_consistently(
    lock_table, stale_scan
):
    failed_job("scan:1")
    stale_scan()  # the Scan goes on seeing scan:1 FAILED
    running = run_once("scan:1").claim()  # run again: RUNNING now
    out, note = run_both("dynasem_jobs")
    assert "FAILED" in out and "RUNNING" not in out
    assert "eventually consistent" in note and "dynasem_jobs KEY" in note
    (line,) = json_lines(run("dynasem_jobs", "--json"))
    assert (line["status"], line["consistent"]) == ("FAILED", False)
    out, note = run_both("dynasem_jobs", "scan:1")
    assert "RUNNING" in out and "FAILED" not in out and note == ""
    (line,) = json_lines(run("dynasem_jobs", "scan:1", "--json"))
    assert (line["key"], line["status"], line["consistent"]) == ("scan:1", "RUNNING", True)
    assert "No run_once job 'scan:none'" in run("dynasem_jobs", "scan:none")
    with pytest.raises(CommandError, match="--status"):
        run("dynasem_jobs", "scan:1", "--status", "DONE")
    running._finish(None)


@pytest.mark.django_db
def test_the_jobs_page_says_it_is_eventually_consistent_and_resets_only_what_it_reads(
    lock_table, stale_scan, django_user_model, client
):
    user = django_user_model.objects.create_user("op", password="pw", is_staff=True)
    for codename in ("view_job", "reset_job"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client.force_login(user)
    failed_job("scan:2")
    stale_scan()
    running = run_once("scan:2").claim()
    body = client.get(reverse("admin:dynasem_job_changelist")).content.decode()
    assert '<span class="status-FAILED">FAILED</span>' in body  # as the Scan saw it
    assert "eventually consistent" in body
    link = re.search(r'<a class="deletelink" href="([^"]+)"', body)
    assert link is not None  # a reset link, from the stale line
    response = client.get(link.group(1).replace("&amp;", "&"))
    assert response.status_code == 302  # the confirmation read the job consistently
    (message,) = messages_of(client, response)
    assert "is RUNNING" in message
    assert job_operations.job_info("scan:2").status == "RUNNING"
    running._finish(None)


# ---------------------------------------------------------------------------------------------
# The admin
# ---------------------------------------------------------------------------------------------

LIST = "admin:dynasem_lock_changelist"
RELEASE = "admin:dynasem_lock_release"
RESOURCE = "admin:dynasem_lock_resource"


@pytest.fixture
def operator(django_user_model: Any, client: Any) -> Any:
    user = django_user_model.objects.create_user("op", password="pw", is_staff=True)
    for codename in ("view_lock", "release_lock"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client.force_login(user)
    return user


def messages_of(client: Any, response: Any) -> list[str]:
    return [str(m) for m in client.get(response["Location"]).context["messages"]]


@pytest.mark.django_db
def test_the_list_says_it_comes_from_an_index_and_the_resource_page_reads_the_table(
    lock_table, holds, frozen_index, stale_reads, operator, client
):
    frozen_index()
    stale_reads()
    new = take(holds, "page:new", user="bob", lease=60)
    body = client.get(reverse(LIST)).content.decode()
    assert "No active holds" in body and ASYNC_NOTE in body
    page = client.get(reverse(RESOURCE), {"resource": "page:new"}).content.decode()
    assert "bob" in page and f'<td class="fence">{new.fence}</td>' in page
    assert "Nobody holds it" not in page


@pytest.mark.django_db
def test_a_stale_line_of_the_list_breaks_nothing_and_says_it_changed(
    lock_table, holds, frozen_index, stale_reads, operator, client
):
    first = semaphore("page:swap", user="alice").acquire()
    frozen_index()
    stale_reads()  # the list goes on showing alice's hold
    first.release()
    second = take(holds, "page:swap", user="bob")
    body = client.get(reverse(LIST)).content.decode()
    assert f'<td class="fence">{first.fence}</td>' in body
    link = re.search(r'<a class="deletelink" href="([^"]+)"', body)
    assert link is not None
    response = client.get(link.group(1).replace("&amp;", "&"))
    assert response.status_code == 302
    (message,) = messages_of(client, response)
    assert "changed since listed" in message and "nothing broken" in message
    assert [h.token for h in holds_on("page:swap")] == [second.token]
    assert not LogEntry.objects.exists()


@pytest.mark.django_db
def test_a_break_refused_after_the_confirmation_says_changed_since_listed(
    lock_table, holds, before_break, operator, client
):
    first = semaphore("page:post", user="alice").acquire()
    page = client.get(reverse(RELEASE), {"resource": "page:post", "fence": first.fence})
    form = dict(re.findall(r'name="(\w+)" value="([^"]*)"', page.content.decode()))
    second: list[Any] = []

    def replace() -> None:
        first.release()
        second.append(take(holds, "page:post", user="bob"))

    before_break(replace)
    response = client.post(reverse(RELEASE), form)
    assert response.status_code == 302
    (message,) = messages_of(client, response)
    assert "changed since listed" in message and "nothing broken" in message
    assert [h.token for h in holds_on("page:post")] == [second[0].token]
    assert not LogEntry.objects.exists()
