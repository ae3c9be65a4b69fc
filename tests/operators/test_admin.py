"""The admin pages over DynamoDB: the lock list (filters, pages, request counts), breaking a
hold, the run_once statuses and their reset; permissions, GET-safety, CSRF, LogEntry."""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlencode

import pytest
from boto3.dynamodb.types import TypeSerializer
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from dynasem import LockLost, run_once, semaphore
from dynasem import _clock as clock
from dynasem._engine import core
from dynasem._operators import jobs as job_operations
from dynasem._operators.locks import holds_on, queue_depth
from dynasem._storage import dynamodb, lock_rows, lock_writes, records
from dynasem.models import Job, Lock
from dynasem.signals import lock_released
from tests.support.helpers import take

pytestmark = pytest.mark.django_db

LIST = "admin:dynasem_lock_changelist"
RELEASE = "admin:dynasem_lock_release"
JOBS = "admin:dynasem_job_changelist"
RESET = "admin:dynasem_job_reset"


def staff(django_user_model, name: str, *perms: str):
    user = django_user_model.objects.create_user(name, password="pw", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def listed(response) -> list[str]:
    """The resources of the hold lines of a lock list page, in page order."""
    body = response.content.decode()
    return re.findall(
        r'<tr class="hold">\s*<th class="resource">(?:<a [^>]*>)?<code[^>]*>(.*?)</code>', body
    )


def next_url(response) -> str | None:
    match = re.search(r'<a href="([^"]*)" class="next-page">', response.content.decode())
    return None if match is None else match.group(1).replace("&amp;", "&")


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice", password="pw")


@pytest.fixture
def alice_holds(alice, holds):
    return take(holds, "tbl_issues:7", user=alice)


@pytest.fixture
def index_queries(requests_sent) -> Iterator[list[str | None]]:
    """The IndexName of every Query sent (None: on the table), seen through botocore's events."""
    seen: list[str | None] = []

    def record(params: dict[str, Any], **kwargs: Any) -> None:
        seen.append(params.get("IndexName"))

    # The hooked clients (see requests_sent): the locks' own and the quick one the admin's
    # pages use (dynamodb.quick).
    clients = [dynamodb.get_client(), dynamodb.get_client(quick=True)]
    for client in clients:
        client.meta.events.register("before-parameter-build.dynamodb.Query", record)
    yield seen
    for client in clients:
        client.meta.events.unregister("before-parameter-build.dynamodb.Query", record)


def put_rows(items: list[dict[str, Any]]) -> None:
    """Write lock rows in the stored format with BatchWriteItem, 25 at a time, in parallel."""
    client = dynamodb.get_client()
    serializer = TypeSerializer()

    def write(batch: list[dict[str, Any]]) -> None:
        requests = [
            {"PutRequest": {"Item": {k: serializer.serialize(v) for k, v in item.items()}}}
            for item in batch
        ]
        while requests:
            response = client.batch_write_item(RequestItems={table_name(): requests})
            requests = response.get("UnprocessedItems", {}).get(table_name(), [])

    batches = [items[i : i + 25] for i in range(0, len(items), 25)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(write, batches))


def table_name() -> str:
    from dynasem.conf import settings

    return settings.TABLE_NAME


def idle_row(resource: str, ended_ms: int, *, holder: str | None = None) -> dict[str, Any]:
    """A row nobody holds any more: released (no holders, kept for its fence), or, with
    ``holder``, a hold whose lease ended at ``ended_ms`` and that nobody reaped yet."""
    fence = ended_ms * 1000
    row: dict[str, Any] = {
        "pk": resource,
        "sk": records.LOCK_SK,
        "mode": "x",
        "limit": 1,
        "fence": fence,
        "expires": records.epoch_seconds(ended_ms),
        "expMs": ended_ms,
        "shard": records.shard_of(resource),
    }
    if holder is None:
        row.update(holders={}, lastToken=uuid.uuid4().hex)
    else:
        entry = records.holder_value(
            lock_writes.holder_entry(holder, ended_ms, fence, ended_ms - 60_000, False)
        )
        row.update(holders={uuid.uuid4().hex: entry}, userId=holder)
    return row


# ---------------------------------------------------------------------------------------------
# The lock list
# ---------------------------------------------------------------------------------------------


def test_list_shows_the_hold_with_the_holders_username(alice_holds, django_user_model, client):
    client.force_login(staff(django_user_model, "viewer", "view_lock"))
    response = client.get(reverse(LIST))
    assert response.status_code == 200
    body = response.content.decode()
    assert listed(response) == ["tbl_issues:7"]
    assert ">alice<" in body  # her username, not her primary key
    assert str(alice_holds.fence) in body
    assert "exclusive" in body
    assert "/release/" not in body  # no break link without release_lock
    assert "/admin/auth/user/" not in body  # nor a link to a page this viewer may not open


def test_list_links_django_users_and_shows_process_identities(
    alice, holds, django_user_model, client
):
    take(holds, "tbl_issues:7", user=alice)
    take(holds, "pool:1", limit=3, user="worker-7")
    take(holds, "doc:1", shared=True)
    take(holds, "big:1", user="9" * 30)  # a number, but too long to be anybody's pk
    client.force_login(staff(django_user_model, "viewer", "view_lock", "view_user"))
    body = client.get(reverse(LIST)).content.decode()
    assert f"<code>{'9' * 30}</code>" in body
    change = reverse("admin:auth_user_change", args=[alice.pk])
    assert f'<a href="{change}">alice</a>' in body
    assert "<code>worker-7</code>" in body and "slot of 3" in body
    assert f"<code>{dynamodb.process_identity()}</code>" in body and "shared" in body


def test_list_shows_kind_acquired_expires_in_and_queue_depth(lock_table, holds, client, admin_user):
    held = take(holds, "deploy:prod", user="ci", lease=300)
    waiter = semaphore("deploy:prod", fair=True, wait=30, user="ci-2")
    queued = threading.Thread(target=lambda: holds.append(waiter.acquire()), daemon=True)
    queued.start()
    deadline = time.monotonic() + 10
    while queue_depth("deploy:prod") == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    client.force_login(admin_user)
    body = client.get(reverse(LIST)).content.decode()
    line = body[body.index('">deploy:prod</code>') :].split("</tr>")[0]
    assert re.search(r">in 4 min 5\d s<", line), line
    assert re.search(r'<span class="dynasem-quiet queue">1 waiting</span>', line), line
    assert held.expires.isoformat()[:16] in line  # the machine-readable end, for the script
    held.release()
    queued.join(10)


def test_staff_without_view_permission_gets_403(alice_holds, django_user_model, client):
    client.force_login(staff(django_user_model, "nobody"))
    assert client.get(reverse(LIST)).status_code == 403
    url = reverse(RELEASE)
    params = {"resource": "tbl_issues:7", "token": alice_holds.token}
    assert client.get(url, params).status_code == 403
    assert client.post(url, params).status_code == 403
    assert [h.token for h in holds_on("tbl_issues:7")] == [alice_holds.token]


def test_viewer_without_release_permission_gets_403_on_the_break_pages(
    alice_holds, django_user_model, client
):
    client.force_login(staff(django_user_model, "viewer", "view_lock"))
    url = reverse(RELEASE)
    params = {"resource": "tbl_issues:7", "token": alice_holds.token}
    assert client.get(url, params).status_code == 403
    assert client.post(url, params).status_code == 403
    assert [h.token for h in holds_on("tbl_issues:7")] == [alice_holds.token]


def test_anonymous_is_sent_to_the_login_page(alice_holds, client):
    response = client.get(reverse(LIST))
    assert response.status_code == 302
    assert reverse("admin:login") in response["Location"]


def test_filter_by_user_queries_the_user_index(
    alice, holds, django_user_model, client, index_queries
):
    take(holds, "tbl_issues:1", user=alice)
    take(holds, "tbl_issues:2", user="bob")
    take(holds, "pool:9", limit=2, user=alice)
    take(holds, "pool:9", limit=2, user="bob")  # the row's userId now names bob
    client.force_login(staff(django_user_model, "viewer", "view_lock"))
    index_queries.clear()
    response = client.get(reverse(LIST), {"user": "alice"})  # a username: her pk is stored
    assert sorted(listed(response)) == ["pool:9", "tbl_issues:1"]
    assert index_queries.count(records.USER_INDEX) == 1
    # The counting/shared rows name one holder only: they are read from the expires index.
    assert index_queries.count(records.EXPIRES_INDEX) == records.SHARDS
    # A Query of each index, no Scan (a row of permit items adds a Query of its permits).
    assert len([q for q in index_queries if q is not None]) == 1 + records.SHARDS
    assert sorted(listed(client.get(reverse(LIST), {"user": "bob"}))) == ["pool:9", "tbl_issues:2"]
    assert listed(client.get(reverse(LIST), {"user": "nobody"})) == []


def test_search_by_resource_prefix(lock_table, holds, admin_user, client):
    for resource in ("alpha:1", "alpha:2", "beta:1"):
        take(holds, resource)
    client.force_login(admin_user)
    assert sorted(listed(client.get(reverse(LIST), {"q": "alpha:"}))) == ["alpha:1", "alpha:2"]
    assert listed(client.get(reverse(LIST), {"q": "gamma"})) == []


def test_expired_holds_and_idle_rows_only_with_the_toggle(lock_table, holds, admin_user, client):
    take(holds, "live:1")
    with semaphore("released:1"):
        pass
    now = clock.now_ms()
    put_rows([idle_row("expired:1", now - 5000, holder="ghost")])
    client.force_login(admin_user)
    assert listed(client.get(reverse(LIST))) == ["live:1"]
    response = client.get(reverse(LIST), {"expired": "1"})
    body = response.content.decode()
    assert listed(response) == ["expired:1", "live:1"]  # soonest lease end first
    assert re.search(
        r'<tr class="idle">\s*<th class="resource">(?:<a [^>]*>)?<code[^>]*>released:1</code>', body
    )
    # The ghost's lease ended 5 s before the request.
    shown = re.search(r"expired (\d+) s ago", body)
    waited = (clock.now_ms() - now) // 1000  # however long a loaded machine took to answer
    assert shown and 4 <= int(shown.group(1)) <= 6 + waited


def test_pages_follow_dynamodb_keys_and_list_every_hold_once(
    lock_table, holds, admin_user, client, monkeypatch
):
    resources = [f"page:{i}" for i in range(11)]
    for resource in resources:
        take(holds, resource, lease=60)  # many share one ``expires`` second: ties in the index
    monkeypatch.setattr(admin.site._registry[Lock], "list_per_page", 3)
    client.force_login(admin_user)
    seen, url, pages = [], reverse(LIST), 0
    while url:
        response = client.get(url if url.startswith("/") else reverse(LIST) + url)
        assert response.status_code == 200
        seen += listed(response)
        url, pages = next_url(response), pages + 1
        assert pages < 10
    assert sorted(seen) == sorted(resources)
    assert pages >= 4


def test_pages_of_expired_rows_list_every_row_once(lock_table, admin_user, client, monkeypatch):
    ended = clock.now_ms() - 120_000
    rows = [idle_row(f"old:{i:02d}", ended, holder="ghost") for i in range(40)]  # all one second
    put_rows(rows)
    monkeypatch.setattr(admin.site._registry[Lock], "list_per_page", 7)
    client.force_login(admin_user)
    seen, url = [], reverse(LIST) + "?expired=1"
    while url:
        response = client.get(url if url.startswith("/") else reverse(LIST) + url)
        seen += listed(response)
        url = next_url(response)
    assert sorted(seen) == sorted(r["pk"] for r in rows)


# Alone: 5,000 rows written into the embedded engine (one request at a time, shared by every
# worker) held its answers past the quick client's 2 s beside other workers (CI, 2026-12-02:
# this listing came back empty, and test_commands' release timed out beside it).
@pytest.mark.serial
def test_first_page_among_5000_idle_rows_is_a_few_requests(
    alice, holds, admin_user, client, requests_sent
):
    now = clock.now_ms()
    put_rows(
        [
            idle_row(f"idle:{i}", now - 1000 - i * 700, holder="ghost" if i % 2 else None)
            for i in range(5000)
        ]
    )
    # A lease no heartbeat renews during the test: on the embedded engine beside another
    # lane, taking 20 holds and three pages took longer than a 60 s lease's first renewal
    # (20 UpdateItems counted among the page's requests).
    active = {
        f"active:{i}": take(holds, f"active:{i}", user=alice if i % 4 == 0 else f"w{i}", lease=600)
        for i in range(20)
    }
    client.force_login(admin_user)
    requests_sent.reset()
    response = client.get(reverse(LIST))
    assert sorted(listed(response)) == sorted(active)
    assert next_url(response) is None
    # One Query per shard of the expires index, each reading only live rows.
    assert dict(requests_sent.calls) == {"Query": records.SHARDS, "BatchGetItem": 1}

    requests_sent.reset()
    assert sorted(listed(client.get(reverse(LIST), {"user": "alice"}))) == sorted(
        r for i, r in enumerate(active) if i % 4 == 0
    )
    assert dict(requests_sent.calls) == {"Query": 1 + records.SHARDS, "BatchGetItem": 1}

    requests_sent.reset()
    response = client.get(reverse(LIST), {"expired": "1"})
    assert len(re.findall(r'<tr class="(?:hold|idle)">', response.content.decode())) == 100
    assert next_url(response) is not None
    assert dict(requests_sent.calls) == {"Query": records.SHARDS, "BatchGetItem": 1}


# ---------------------------------------------------------------------------------------------
# Breaking a hold
# ---------------------------------------------------------------------------------------------


def test_get_on_the_break_url_changes_nothing(alice_holds, django_user_model, client):
    client.force_login(staff(django_user_model, "op", "view_lock", "release_lock"))
    listing = client.get(reverse(LIST)).content.decode()
    (link,) = re.findall(r'href="([^"]*/release/\?[^"]*)"', listing)
    link = link.replace("&amp;", "&")
    assert alice_holds.token not in link  # tokens stay out of URLs and access logs
    by_token = (
        reverse(RELEASE) + "?" + urlencode({"resource": "tbl_issues:7", "token": alice_holds.token})
    )
    for url in (link, by_token):
        response = client.get(url)
        assert response.status_code == 200
        body = response.content.decode()
        assert "Yes, break this hold" in body and ">alice<" in body
    assert [h.token for h in holds_on("tbl_issues:7")] == [alice_holds.token]
    alice_holds.renew()


def test_post_without_csrf_token_is_refused(alice_holds, django_user_model):
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff(django_user_model, "op", "view_lock", "release_lock"))
    url = reverse(RELEASE)
    response = client.post(url, {"resource": "tbl_issues:7", "token": alice_holds.token})
    assert response.status_code == 403
    assert [h.token for h in holds_on("tbl_issues:7")] == [alice_holds.token]


def test_confirmation_form_posts_with_its_csrf_token(alice_holds, django_user_model):
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff(django_user_model, "op", "view_lock", "release_lock"))
    page = client.get(reverse(RELEASE), {"resource": "tbl_issues:7", "fence": alice_holds.fence})
    form = dict(re.findall(r'name="(\w+)" value="([^"]*)"', page.content.decode()))
    assert set(form) == {"csrfmiddlewaretoken", "resource", "fence", "token"}
    assert form["token"] == alice_holds.token[:8]  # never the whole token, a hold's secret
    assert alice_holds.token not in page.content.decode()
    assert client.post(reverse(RELEASE), form).status_code == 302
    assert holds_on("tbl_issues:7") == []


def test_post_breaks_exactly_that_hold(lock_table, django_user_model, client):
    pool = [semaphore("pool:1", limit=2, user=u).acquire() for u in ("a", "b")]
    operator = staff(django_user_model, "op", "view_lock", "release_lock")
    client.force_login(operator)
    signals: list[dict[str, Any]] = []

    def receive(sender: Any, **kwargs: Any) -> None:
        signals.append(dict(kwargs, sender=sender))

    lock_released.connect(receive)
    try:
        response = client.post(reverse(RELEASE), {"resource": "pool:1", "token": pool[0].token})
    finally:
        lock_released.disconnect(receive)
    assert response.status_code == 302
    assert [h.token for h in holds_on("pool:1")] == [pool[1].token]
    entry = LogEntry.objects.get()
    assert entry.user == operator and entry.object_id == "pool:1"
    assert entry.content_type.model_class() is Lock
    assert f"fence {pool[0].fence}" in entry.change_message
    (signal,) = signals
    assert signal["sender"] is core.Semaphore and signal["broken"] is True
    assert (signal["resource"], signal["token"], signal["user_id"], signal["fence"]) == (
        "pool:1",
        pool[0].token,
        "a",
        pool[0].fence,
    )
    messages = [str(m) for m in client.get(response["Location"]).context["messages"]]
    assert messages == [f"Broke the hold of a on pool:1 (fence {pool[0].fence})."]
    with pytest.raises(LockLost):
        pool[0].release()
    pool[1].release()


def test_stale_confirmation_does_not_break_a_newer_hold(lock_table, django_user_model, client):
    first = semaphore("tbl_issues:8").acquire()
    client.force_login(staff(django_user_model, "op", "view_lock", "release_lock"))
    page = client.get(reverse(RELEASE), {"resource": "tbl_issues:8", "fence": first.fence})
    form = dict(re.findall(r'name="(\w+)" value="([^"]*)"', page.content.decode()))
    assert form["fence"] == str(first.fence) and first.token.startswith(form["token"])
    first.release()
    second = semaphore("tbl_issues:8").acquire()
    response = client.post(reverse(RELEASE), form)
    assert response.status_code == 302
    assert [h.token for h in holds_on("tbl_issues:8")] == [second.token]
    assert not LogEntry.objects.exists()
    second.release()


# ---------------------------------------------------------------------------------------------
# run_once statuses
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def jobs(lock_table, alice) -> dict[str, Any]:
    """One job of each status: DONE, FAILED (twice), RUNNING, plus a lock of the same name."""
    with run_once("file:done.csv", user=alice):
        pass
    for attempt in (1, 2):
        with pytest.raises(ValueError), run_once("file:failed.csv", user="worker-3"):
            raise ValueError(f"bad header in line {attempt}")
    running = run_once("file:running.csv").claim()
    held = semaphore("file:done.csv").acquire()  # same name, a semaphore: no collision
    yield {"running": running, "held": held}
    running._finish(None)
    held.release()


def job_rows(response) -> dict[str, str]:
    """key -> the text of its row on the statuses page."""
    body = response.content.decode()
    rows = re.findall(
        r'<th class="key">(?:<a [^>]*>)?<code[^>]*>(.*?)</code>(?:</a>)?</th>(.*?)</tr>', body, re.S
    )
    return {key: re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", rest)).strip() for key, rest in rows}


def test_statuses_page_lists_every_key(jobs, django_user_model, client):
    client.force_login(staff(django_user_model, "viewer", "view_job"))
    response = client.get(reverse(JOBS))
    assert response.status_code == 200
    rows = job_rows(response)
    assert set(rows) == {"file:done.csv", "file:failed.csv", "file:running.csv"}
    assert rows["file:done.csv"].startswith("DONE attempt 1 alice ")
    assert rows["file:failed.csv"].startswith("FAILED attempt 2 worker-3 ")
    assert "ValueError: bad header in line 2" in rows["file:failed.csv"]
    assert rows["file:running.csv"].startswith("RUNNING (lease")
    assert "/reset/" not in response.content.decode()  # no reset link without reset_job
    failed = job_rows(client.get(reverse(JOBS), {"status": "FAILED"}))
    assert list(failed) == ["file:failed.csv"]
    assert list(job_rows(client.get(reverse(JOBS), {"q": "file:d"}))) == ["file:done.csv"]


def test_statuses_pages_scan_on_from_the_last_key(lock_table, admin_user, client, monkeypatch):
    for i in range(7):
        with run_once(f"job:{i}"):
            pass
    monkeypatch.setattr(admin.site._registry[Job], "list_per_page", 3)
    client.force_login(admin_user)
    seen, url = [], reverse(JOBS)
    while url:
        response = client.get(url if url.startswith("/") else reverse(JOBS) + url)
        seen += list(job_rows(response))
        url = next_url(response)
    assert sorted(seen) == [f"job:{i}" for i in range(7)]


def test_job_pages_need_their_own_permissions(jobs, django_user_model, client):
    client.force_login(staff(django_user_model, "locks-only", "view_lock", "release_lock"))
    assert client.get(reverse(JOBS)).status_code == 403
    assert client.get(reverse(RESET), {"key": "file:failed.csv"}).status_code == 403
    client.force_login(staff(django_user_model, "viewer", "view_job"))
    assert client.get(reverse(RESET), {"key": "file:failed.csv"}).status_code == 403
    response = client.post(
        reverse(RESET), {"key": "file:failed.csv", "status": "FAILED", "finished": ""}
    )
    assert response.status_code == 403
    assert lock_rows.get_item("file:failed.csv", records.JOB_SK)["status"] == "FAILED"


def test_get_on_the_reset_url_changes_nothing(jobs, django_user_model, client):
    client.force_login(staff(django_user_model, "op", "view_job", "reset_job"))
    before = lock_rows.get_item("file:failed.csv", records.JOB_SK)
    listing = client.get(reverse(JOBS)).content.decode()
    assert listing.count("/reset/?") == 2  # the DONE and the FAILED key; not the running one
    response = client.get(reverse(RESET), {"key": "file:failed.csv"})
    assert response.status_code == 200
    body = response.content.decode()
    assert "Yes, reset this job" in body and "bad header in line 2" in body
    assert lock_rows.get_item("file:failed.csv", records.JOB_SK) == before


def test_reset_post_without_csrf_token_is_refused(jobs, django_user_model):
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff(django_user_model, "op", "view_job", "reset_job"))
    finished = lock_rows.get_item("file:failed.csv", records.JOB_SK)["finishedMs"]
    params = {"key": "file:failed.csv", "status": "FAILED", "finished": finished}
    assert client.post(reverse(RESET), params).status_code == 403
    assert lock_rows.get_item("file:failed.csv", records.JOB_SK)["status"] == "FAILED"


def test_reset_makes_a_failed_key_run_again(jobs, django_user_model):
    client = Client(enforce_csrf_checks=True)
    operator = staff(django_user_model, "op", "view_job", "reset_job")
    client.force_login(operator)
    page = client.get(reverse(RESET), {"key": "file:failed.csv"})
    form = dict(re.findall(r'name="(\w+)" value="([^"]*)"', page.content.decode()))
    response = client.post(reverse(RESET), form)
    assert response.status_code == 302
    row = lock_rows.get_item("file:failed.csv", records.JOB_SK)
    assert "status" not in row and "error" not in row  # new again
    entry = LogEntry.objects.get()
    assert entry.user == operator and entry.object_id == "file:failed.csv"
    assert entry.content_type.model_class() is Job
    assert "bad header in line 2" in entry.change_message
    messages = [str(m) for m in client.get(response["Location"]).context["messages"]]
    assert messages == ["Reset 'file:failed.csv' (was FAILED): it will run again."]
    assert job_rows(client.get(reverse(JOBS)))["file:failed.csv"].startswith("NEW (reset ")
    with run_once("file:failed.csv") as job:
        assert job.attempt == 3  # attempts keep counting
    assert lock_rows.get_item("file:failed.csv", records.JOB_SK)["status"] == "DONE"


def test_reset_lets_a_done_key_run_again(jobs, admin_user, client):
    client.force_login(admin_user)
    finished = lock_rows.get_item("file:done.csv", records.JOB_SK)["finishedMs"]
    params = {"key": "file:done.csv", "status": "DONE", "finished": finished}
    assert client.post(reverse(RESET), params).status_code == 302
    with run_once("file:done.csv") as job:
        assert job.attempt == 2


def test_reset_refuses_a_key_that_ran_again_since_the_page(jobs, admin_user, client):
    client.force_login(admin_user)
    page = client.get(reverse(RESET), {"key": "file:failed.csv"})
    form = dict(re.findall(r'name="(\w+)" value="([^"]*)"', page.content.decode()))
    time.sleep(0.01)
    with pytest.raises(ValueError), run_once("file:failed.csv"):
        raise ValueError("third failure")
    response = client.post(reverse(RESET), form)
    assert response.status_code == 302
    row = lock_rows.get_item("file:failed.csv", records.JOB_SK)
    assert (row["status"], row["error"]) == ("FAILED", "ValueError: third failure")
    assert not LogEntry.objects.exists()


def test_a_running_key_cannot_be_reset(jobs, admin_user, client):
    client.force_login(admin_user)
    response = client.get(reverse(RESET), {"key": "file:running.csv"})
    assert response.status_code == 302
    params = {"key": "file:running.csv", "status": "RUNNING", "finished": ""}
    assert client.post(reverse(RESET), params).status_code == 302
    assert lock_rows.get_item("file:running.csv", records.JOB_SK)["status"] == "RUNNING"
    assert not LogEntry.objects.exists()


def test_user_filter_pages_move_on_past_many_rows_of_others(lock_table, holds, monkeypatch):
    from dynasem._operators import listing as index_streams
    from dynasem._operators import locks as operations

    # Small filtered reads, so that alice's rows take many requests to read past: the page
    # budget runs out before bob's row is found, and the cursor must still move on.
    monkeypatch.setattr(index_streams, "FILTERED_READ", 5)
    until = clock.now_ms() + 600_000
    put_rows([idle_row(f"alice:{i:03d}", until, holder="alice-id") for i in range(480)])
    take(holds, "bob:shared", user="bob-id", shared=True, lease=900)
    cursor, found, cursors = None, [], []
    for _ in range(12):
        page = operations.lock_page(user_id="bob-id", cursor=cursor, size=2)
        found += [hold.resource for hold in page.holds]
        if not page.next_cursor:
            break
        assert page.next_cursor not in cursors, "the same page cursor came back"
        cursors.append(page.next_cursor)
        cursor = page.next_cursor
    assert found == ["bob:shared"]


@pytest.mark.parametrize("cursor", ["W" * 20_000, "WwWwWw" * 1000, "[" * 3000])
def test_forged_cursors_are_value_errors(lock_table, cursor):
    import base64

    from dynasem._operators import locks as operations

    if cursor.startswith("["):  # deeply nested JSON
        cursor = base64.urlsafe_b64encode(cursor.encode()).decode()
    with pytest.raises(ValueError):
        operations.lock_page(cursor=cursor)
    with pytest.raises(ValueError):
        job_operations.job_page(cursor=cursor)


def test_a_user_filter_the_user_model_cannot_read_is_a_plain_filter(
    holds, admin_user, client, django_user_model, monkeypatch
):
    # A user model whose USERNAME_FIELD is an integer: "?user=abc" makes the username query
    # raise ValueError. That is no cursor error: the page shows (nothing held by "abc"),
    # it does not redirect to itself for ever.
    take(holds, "tbl_issues:3", user="abc")
    take(holds, "tbl_issues:4", user="bob")
    monkeypatch.setattr(django_user_model, "USERNAME_FIELD", "id")
    client.force_login(admin_user)
    response = client.get(reverse(LIST), {"user": "abc"})
    assert response.status_code == 200
    assert listed(response) == ["tbl_issues:3"]  # the value itself, as a stored holder id


# ---------------------------------------------------------------------------------------------
# DynamoDB unavailable: said so, quickly, never shown as "nothing held"
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """An endpoint that accepts connections and never answers (a hung proxy, a stalled
    DynamoDB Local), on a free loopback port."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in accepted:
        conn.close()
    server.close()


def _closed_endpoint() -> str:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there now


@pytest.mark.parametrize("endpoint", ["closed", "silent"])
@pytest.mark.parametrize("page", [LIST, JOBS])
def test_an_unavailable_dynamodb_is_said_within_seconds_never_shown_as_empty(
    lock_table, admin_user, client, silent_endpoint, endpoint, page, settings
):
    from tests.support.helpers import dynasem_settings

    url = silent_endpoint if endpoint == "silent" else _closed_endpoint()
    settings.DYNASEM = dynasem_settings(url, lock_table)
    client.force_login(admin_user)
    started = time.monotonic()
    response = client.get(reverse(page))
    took = time.monotonic() - started
    body = response.content.decode()
    assert response.status_code == 200
    # The admin's client gives up after 1 s connecting or 2 s reading, once (table/client.py);
    # the locks' client would take 10 s or more. 5 s leaves room for a loaded 2-core host
    # (3.2 s seen once with the suite and other work side by side).
    assert took <= 5.0, f"the page took {took:.1f} s"
    assert "Unavailable: nothing can be listed now" in body
    assert url in body  # which endpoint
    for empty in ("No active holds", "No run-once jobs", "holds on this page", "jobs on this"):
        assert empty not in body


@pytest.mark.serial  # a 3 s bound on an answer: run alone, not beside other workers
def test_dynasem_locks_on_a_silent_endpoint_fails_within_seconds(
    lock_table, silent_endpoint, settings
):
    from django.core.management import CommandError, call_command

    from tests.support.helpers import dynasem_settings

    settings.DYNASEM = dynasem_settings(silent_endpoint, lock_table)
    started = time.monotonic()
    with pytest.raises(CommandError, match="127.0.0.1"):
        call_command("dynasem_locks")
    assert time.monotonic() - started <= 3.0


def test_the_locks_own_client_keeps_its_patience(lock_table, silent_endpoint, settings):
    # Renewals and takes wait as they did (10 s a read, 3 retries): only what an operator
    # waits on is quick.
    from dynasem._storage import dynamodb as table_client
    from tests.support.helpers import dynasem_settings

    settings.DYNASEM = dynasem_settings(silent_endpoint, lock_table)
    patient = table_client.get_client().meta.config
    quick = table_client.get_client(quick=True).meta.config
    assert (patient.read_timeout, patient.retries["total_max_attempts"]) == (10, 4)
    assert (quick.read_timeout, quick.connect_timeout) == (2, 1)
    assert quick.retries["total_max_attempts"] == 1


# ---------------------------------------------------------------------------------------------
# The resource page: holders, the queue in order, the run_once job of that key
# ---------------------------------------------------------------------------------------------

RESOURCE = "admin:dynasem_lock_resource"


def test_the_resource_page_shows_holders_and_the_queue_in_order(
    lock_table, holds, alice, django_user_model, client
):
    from dynasem import _clock as clock
    from tests.support.helpers import enqueue_entry

    held = take(holds, "deploy:prod", user=alice, lease=60)
    now = clock.now_ms()
    enqueue_entry(
        "deploy:prod",
        "tok-bob",
        records.Waiter(0, now + 60_000, user_id="bob", since_ms=now - 90_000),
    )
    enqueue_entry(
        "deploy:prod", "tok-carol", records.Waiter(0, now + 60_000, user_id="carol", shared=True)
    )
    with pytest.raises(ValueError), run_once("deploy:prod"):
        raise ValueError("boom")
    # view_job too: the job's stored error is shown only with it (test_..._only_with_view_job).
    client.force_login(staff(django_user_model, "viewer", "view_lock", "view_job"))
    listing = client.get(reverse(LIST)).content.decode()
    url = reverse(RESOURCE) + "?" + urlencode({"resource": "deploy:prod"})
    assert url.replace("&", "&amp;") in listing  # the list links each resource to its page
    page = client.get(url)
    assert page.status_code == 200
    body = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page.content.decode()))
    assert "alice" in body and str(held.fence) in body
    queue = body[body.index("Queue (2 waiting)") :]
    # Joined 90 s before the page was made (a loaded machine renders a second or two later).
    bob = re.search(r" 1 bob exclusive 1 min 3\d s ago", queue)
    assert bob is not None and bob.start() < queue.index(" 2 carol shared not recorded")
    assert "FAILED, attempt 1" in body
    assert "ValueError: boom" in body  # the whole error
    assert "/release/" not in page.content.decode()  # no break link without release_lock


def test_the_resource_page_of_a_long_queue_shows_its_head(
    lock_table, holds, admin_user, client, monkeypatch
):
    """The first tickets in line (as many as a page of holders), and how many are behind."""
    from dynasem import _clock as clock
    from dynasem._operators import locks as operations
    from dynasem.admin import LockAdmin
    from tests.support.helpers import enqueue_entry

    take(holds, "deploy:long", lease=60)
    now = clock.now_ms()
    for i in range(7):
        enqueue_entry("deploy:long", f"tok-{i}", records.Waiter(0, now + 60_000, user_id=f"w{i}"))
    state = operations.resource_state("deploy:long", most=3)
    assert [w.user_id for w in state.waiters] == ["w0", "w1", "w2"]
    assert state.waiters_beyond == 4
    assert len(operations.resource_state("deploy:long").waiters) == 7  # most=None: all
    monkeypatch.setattr(LockAdmin, "holds_per_page", 3)
    client.force_login(admin_user)
    page = client.get(reverse(RESOURCE), {"resource": "deploy:long"}).content.decode()
    assert page.count('<tr class="waiter">') == 3
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page))
    assert "The first 3 tickets in line are shown; 4 more are out behind them" in text
    assert "dynasem_locks --waiters deploy:long" in text


def test_the_resource_page_of_a_free_resource_and_a_bad_name(lock_table, admin_user, client):
    client.force_login(admin_user)
    body = client.get(reverse(RESOURCE), {"resource": "nothing:here"}).content.decode()
    assert "Nobody holds it" in body and "Nobody is waiting." in body
    assert "No run_once job has this key." in body
    response = client.get(reverse(RESOURCE), {"resource": ""})
    assert response.status_code == 302


def test_the_break_page_says_who_gets_the_lock_next(lock_table, holds, admin_user, client):
    from dynasem import _clock as clock
    from tests.support.helpers import enqueue_entry

    held = take(holds, "deploy:next", user="ci-812", lease=60)
    now = clock.now_ms()
    enqueue_entry("deploy:next", "tok-1", records.Waiter(0, now + 60_000, user_id="ci-813"))
    enqueue_entry("deploy:next", "tok-2", records.Waiter(0, now + 60_000, user_id="ci-814"))
    client.force_login(admin_user)
    page = client.get(reverse(RELEASE), {"resource": "deploy:next", "fence": held.fence})
    body = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page.content.decode()))
    assert "Next in line: ci-813 (exclusive), then 1 more: it takes the lock" in body
    free = take(holds, "deploy:alone", lease=60)
    page = client.get(reverse(RELEASE), {"resource": "deploy:alone", "fence": free.fence})
    assert "nobody is waiting: the lock becomes free" in page.content.decode()


def test_jobs_sort_numbers_by_value_and_the_lock_list_counts_holds_and_rows(
    lock_table, holds, admin_user, client
):
    for n in (10, 2, 1):
        with run_once(f"upload:{n}"):
            pass
    client.force_login(admin_user)
    assert list(job_rows(client.get(reverse(JOBS)))) == ["upload:1", "upload:2", "upload:10"]
    take(holds, "pool:a", limit=3, lease=60)
    take(holds, "pool:a", limit=3, lease=60)
    take(holds, "single:b", lease=60)
    body = client.get(reverse(LIST)).content.decode()
    assert "3 holds in 2 resources on this page" in body
    assert '<input type="submit" value="Filter by user">' in body


def test_a_break_page_dynamodb_cannot_read_says_so_once(lock_table, admin_user, client, settings):
    from tests.support.helpers import dynasem_settings

    url = _closed_endpoint()
    settings.DYNASEM = dynasem_settings(url, lock_table)
    client.force_login(admin_user)
    response = client.get(reverse(RELEASE), {"resource": "r:1", "fence": "5"}, follow=True)
    body = response.content.decode()
    assert "The hold could not be read: nothing was broken." in body
    # The list says where and why, once; the message only what did not happen.
    assert body.count("cannot reach DynamoDB at") == 1 and url in body


# ---------------------------------------------------------------------------------------------
# Page cursors: signed per listing and filter, bounded; anything else is a 400 that says so
# ---------------------------------------------------------------------------------------------


def unsigned_lock_cursor(since: int) -> str:
    """A lock list cursor as anyone can write it: base64 of its JSON state, no signature."""
    import base64
    import json

    positions = {f"s{i}": None for i in range(records.SHARDS)}
    raw = json.dumps({"t": since, "p": positions}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def first_page_note(response) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", response.content.decode()))


def test_a_forged_cursor_with_a_huge_time_is_a_400(alice_holds, admin_user, client):
    client.force_login(admin_user)
    response = client.get(reverse(LIST), {"cursor": unsigned_lock_cursor(10**40)})
    assert response.status_code == 400
    assert "start from the first page" in first_page_note(response)
    assert "tbl_issues:7" not in listed(response)  # nothing listed from a cursor not ours
    assert 'href="?">« First page' in response.content.decode()  # the first page's link


def test_a_cursor_it_did_not_write_is_a_400(alice_holds, admin_user, client):
    client.force_login(admin_user)
    for garbled in ("bm9uc2Vuc2U", unsigned_lock_cursor(0)):
        response = client.get(reverse(LIST), {"cursor": garbled})
        assert response.status_code == 400
        assert "start from the first page" in first_page_note(response)
        response = client.get(reverse(JOBS), {"cursor": garbled, "status": "DONE"})
        assert response.status_code == 400
        assert "start from the first page" in first_page_note(response)
        assert 'href="?status=DONE">« First page' in response.content.decode()


def test_a_cursor_of_another_filter_is_a_400(lock_table, admin_user, client, monkeypatch):
    ended = clock.now_ms() - 120_000
    put_rows([idle_row(f"old:{i:02d}", ended, holder="ghost") for i in range(6)])
    monkeypatch.setattr(admin.site._registry[Lock], "list_per_page", 2)
    client.force_login(admin_user)
    cursor = next_url(client.get(reverse(LIST), {"expired": "1"}))
    assert cursor is not None and "cursor=" in cursor
    ours = dict(p.split("=", 1) for p in cursor.lstrip("?").split("&"))["cursor"]
    from urllib.parse import unquote

    ours = unquote(ours)
    assert client.get(reverse(LIST), {"expired": "1", "cursor": ours}).status_code == 200
    # The expired rows' cursor on the active list (another lower bound), or under a user filter.
    for other in ({}, {"user": "ghost"}, {"expired": "1", "q": "old:0"}):
        response = client.get(reverse(LIST), {**other, "cursor": ours})
        assert response.status_code == 400, other
        assert "start from the first page" in first_page_note(response)


def test_the_resource_page_shows_the_job_only_with_view_job(lock_table, django_user_model, client):
    with pytest.raises(ValueError), run_once("deploy:secret"):
        raise ValueError("password=hunter2 rejected")
    url = reverse(RESOURCE) + "?" + urlencode({"resource": "deploy:secret"})
    client.force_login(staff(django_user_model, "locks-only", "view_lock"))
    assert client.get(reverse(JOBS)).status_code == 403  # the job list says no
    page = client.get(url)
    assert page.status_code == 200
    body = page.content.decode()
    assert "hunter2" not in body and "FAILED" not in body
    assert "Run-once job" not in body and reverse(JOBS) not in body
    client.force_login(staff(django_user_model, "both", "view_lock", "view_job"))
    body = client.get(url).content.decode()
    assert "password=hunter2 rejected" in body and "FAILED, attempt 1" in body


@pytest.mark.parametrize(
    "after", ["permit#" + "9" * 5000, "reader#\x00", "permit#", "p" * 3000, "reader#" + "é" * 900]
)
def test_a_forged_page_of_holders_is_a_400(lock_table, holds, admin_user, client, after):
    take(holds, "crowd:x", limit=3, user="bob")
    client.force_login(admin_user)
    response = client.get(reverse(RESOURCE), {"resource": "crowd:x", "after": after})
    assert response.status_code == 400
    assert "start from the first page" in first_page_note(response)


def signed(state: Any, purpose: str) -> str:
    """``state`` signed as dynasem signs its cursors, in ASCII JSON (which can carry a lone
    surrogate, as a forger's could)."""
    import base64
    import json

    from django.core import signing

    raw = base64.urlsafe_b64encode(json.dumps(state).encode()).decode().rstrip("=")
    return signing.Signer(salt=f"dynasem._operators.cursors:{purpose}").sign(raw)


@pytest.mark.parametrize(
    "state",
    [
        {"t": 10**40, "p": {}},
        {"t": True, "p": {}},
        {"t": 1.5, "p": {}},
        {"t": -1, "p": {}},
        {"t": 0, "p": {"s0": [10**40, "r"]}},
        {"t": 0, "p": {"s0": [2**63, "r"]}},
        {"t": 100, "p": {"s0": [99, "r"]}},  # a position below the query's lower bound
        {"t": 0, "p": {"s0": [5, "r" * 2049]}},  # no DynamoDB key is that long
        {"t": 0, "p": {"s0": [5, ""]}},
        {"t": 0, "p": {"s0": [5, "\ud800"]}},
    ],
)
def test_a_signed_cursor_carries_only_what_a_request_can_take(lock_table, state):
    """Even signed (a SECRET_KEY leaked, a bug of ours): times within a datetime's range
    and the clock's, keys within DynamoDB's limits, or BadCursor before any request."""
    from dynasem._operators import cursors
    from dynasem._operators import locks as operations

    positions = {f"s{i}": "done" for i in range(records.SHARDS)}
    state = {"t": state["t"], "p": {**positions, **state["p"]}}
    cursor = signed(state, cursors.purpose("locks", None, None, True))
    with pytest.raises(cursors.BadCursor, match="start from the first page"):
        operations.lock_page(cursor=cursor, include_expired=True)
    for key in ([5, "sk"], ["p" * 2049, "sk"], ["pk", "s" * 1025], ["pk"], "pk", ["\ud800", "s"]):
        cursor = signed(key, cursors.purpose("jobs", None, None))
        with pytest.raises(cursors.BadCursor, match="start from the first page"):
            job_operations.job_page(cursor=cursor)


def test_cursors_survive_a_secret_key_rotation(lock_table, settings):
    from dynasem._operators import cursors

    state = {"t": 0, "p": {"s0": "done"}}
    old = cursors.encode_cursor(state, "x")
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "the new key", ["dynasem-tests-only"]
    assert cursors.load_cursor(old, "x") == state
    settings.SECRET_KEY_FALLBACKS = []
    with pytest.raises(cursors.BadCursor, match="start from the first page"):
        cursors.load_cursor(old, "x")


def test_dynasem_jobs_lists_every_page_through_signed_cursors(lock_table, monkeypatch):
    import json
    from io import StringIO

    from django.core.management import call_command

    for i in range(7):
        with run_once(f"job:{i}"):
            pass
    real = job_operations.job_page
    pages = []

    def small_pages(**kwargs: Any) -> job_operations.JobPage:
        page = real(**{**kwargs, "size": 2})
        pages.append(page.next_cursor)
        return page

    monkeypatch.setattr(job_operations, "job_page", small_pages)
    out = StringIO()
    call_command("dynasem_jobs", "--json", stdout=out)
    assert sorted(json.loads(line)["key"] for line in out.getvalue().splitlines()) == [
        f"job:{i}" for i in range(7)
    ]
    assert len(pages) >= 4 and all(":" in c for c in pages[:-1])  # signed: "state:signature"
