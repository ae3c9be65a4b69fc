"""The admin pages over DynamoDB holds: permissions, the GET-safe break, CSRF, LogEntry."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from dynasem import LockLost, semaphore
from dynasem.operations import holds_on

pytestmark = pytest.mark.django_db

LIST = "admin:dynasem_lock_changelist"


def staff(django_user_model, name: str, *perms: str):
    user = django_user_model.objects.create_user(name, password="pw", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


@pytest.fixture
def alice_holds(lock_table, django_user_model):
    alice = django_user_model.objects.create_user("alice", password="pw")
    held = semaphore("tbl_issues:7", user=alice).acquire()
    yield held
    try:
        held.release()
    except LockLost:
        pass


def test_list_shows_the_hold(alice_holds, django_user_model, client):
    client.force_login(staff(django_user_model, "viewer", "view_lock"))
    response = client.get(reverse(LIST))
    assert response.status_code == 200
    body = response.content.decode()
    assert "tbl_issues:7" in body
    assert str(alice_holds.fence) in body
    assert "/release/" not in body  # no break link without release_lock


def test_staff_without_view_permission_gets_403(alice_holds, django_user_model, client):
    client.force_login(staff(django_user_model, "nobody"))
    assert client.get(reverse(LIST)).status_code == 403
    url = reverse("admin:dynasem_lock_release")
    params = {"resource": "tbl_issues:7", "token": alice_holds.token}
    assert client.get(url, params).status_code == 403
    assert client.post(url, params).status_code == 403
    assert [h.token for h in holds_on("tbl_issues:7")] == [alice_holds.token]


def test_get_on_the_break_url_changes_nothing(alice_holds, django_user_model, client):
    client.force_login(staff(django_user_model, "op", "view_lock", "release_lock"))
    listing = client.get(reverse(LIST)).content.decode()
    assert "/release/?" in listing
    url = reverse("admin:dynasem_lock_release")
    response = client.get(url, {"resource": "tbl_issues:7", "token": alice_holds.token})
    assert response.status_code == 200
    assert "Yes, break this hold" in response.content.decode()
    assert [h.token for h in holds_on("tbl_issues:7")] == [alice_holds.token]


def test_post_without_csrf_token_is_refused(alice_holds, django_user_model):
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff(django_user_model, "op", "view_lock", "release_lock"))
    url = reverse("admin:dynasem_lock_release")
    response = client.post(url, {"resource": "tbl_issues:7", "token": alice_holds.token})
    assert response.status_code == 403
    assert [h.token for h in holds_on("tbl_issues:7")] == [alice_holds.token]


def test_post_breaks_exactly_that_hold(lock_table, django_user_model, client):
    pool = [semaphore("pool:1", limit=2, user=u).acquire() for u in ("a", "b")]
    operator = staff(django_user_model, "op", "view_lock", "release_lock")
    client.force_login(operator)
    url = reverse("admin:dynasem_lock_release")
    response = client.post(url, {"resource": "pool:1", "token": pool[0].token})
    assert response.status_code == 302
    assert [h.token for h in holds_on("pool:1")] == [pool[1].token]
    entry = LogEntry.objects.get()
    assert entry.user == operator and entry.object_id == "pool:1"
    with pytest.raises(LockLost):
        pool[0].release()
    pool[1].release()


def test_stale_confirmation_does_not_break_a_newer_hold(lock_table, django_user_model, client):
    first = semaphore("tbl_issues:8").acquire()
    first.release()
    second = semaphore("tbl_issues:8").acquire()
    client.force_login(staff(django_user_model, "op", "view_lock", "release_lock"))
    url = reverse("admin:dynasem_lock_release")
    client.post(url, {"resource": "tbl_issues:8", "token": first.token})
    assert [h.token for h in holds_on("tbl_issues:8")] == [second.token]
    second.release()
