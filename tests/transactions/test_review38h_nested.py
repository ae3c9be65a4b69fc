"""Second-round review (s38, helper h) of the eighth review's mends of fencing and the
give-back after the commit: each test failed before its mend (or is a strict xfail)."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth.models import User
from django.db import transaction

from dynasem import semaphore
from dynasem._operators.locks import holds_on

# dynasem's own re-entry rule (tests/conftest.py's no_reentry is off here).
pytestmark = pytest.mark.reentry


@pytest.mark.parametrize(
    "outer", [{"using": "other"}, {"on_commit": False}], ids=["other-using", "no-on-commit"]
)
@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_an_async_nested_acquire_under_async_to_sync_keeps_the_hold_till_the_callers_commit(
    lock_table: str, outer: dict[str, Any]
) -> None:
    """A sync thread inside ``atomic`` (ATOMIC_REQUESTS) runs async code (``async_to_sync``)
    whose nested ``async with semaphore(key)`` re-enters a hold of another ``using=`` (or
    one with ``on_commit=False``): the nested block's ORM work (``sync_to_async``) commits
    with that thread's transaction, which the outer hold's give-back does not wait for. In
    sync code the nested acquire keeps the hold till that commit (reentry.kept_for_commit);
    async, it asked its own thread, in no transaction: given back at the outer block's exit,
    and another holder could work before this work was committed."""
    resource = f"rv38h:async-nested:{sorted(outer)[0]}"

    async def body() -> None:
        async with semaphore(resource, **outer):
            async with semaphore(resource):
                await sync_to_async(User.objects.create)(username="rv38h-async-nested")

    with transaction.atomic():
        async_to_sync(body)()
        assert holds_on(resource) != [], "given back before its work was committed"
    assert holds_on(resource) == []


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_nested_acquire_of_another_using_released_last_in_its_transaction_waits_for_it(
    lock_table: str,
) -> None:
    """``acquire()`` of a held resource with another ``using=`` (its own transaction not open
    yet), the outer hold released first, then its work in that database's transaction and its
    release there: the hold's last release, in a transaction of the database it named. It was
    the outer hold's release (its semaphore's database, in no transaction there): given back
    at once, before that work was committed."""
    resource = "rv38h:released-last"
    outer = semaphore(resource).acquire()
    inner = semaphore(resource, using="other").acquire()
    outer.release()
    with transaction.atomic(using="other"):
        User.objects.using("other").create(username="rv38h-released-last")
        inner.release()
        assert holds_on(resource) != [], "given back before its work was committed"
    assert holds_on(resource) == []


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_hold_taken_again_for_another_using_and_kept_past_the_commit_waits_for_its_own(
    lock_table: str,
) -> None:
    """The same through a hold given back inside a transaction and taken again there for
    another ``using=`` by ``acquire()``, kept past that commit: its release, inside the other
    database's transaction, gave it back at once."""
    resource = "rv38h:taken-again"
    with transaction.atomic():
        with semaphore(resource):
            pass
        again = semaphore(resource, using="other").acquire()
    assert holds_on(resource) != []  # kept past the commit: its holder still works under it
    with transaction.atomic(using="other"):
        User.objects.using("other").create(username="rv38h-taken-again")
        again.release()
        assert holds_on(resource) != [], "given back before its work was committed"
    assert holds_on(resource) == []


@pytest.mark.django_db(transaction=True)
def test_a_nested_acquire_on_commit_released_last_inside_a_transaction_waits_for_it(
    lock_table: str,
) -> None:
    """The same for a hold taken with ``on_commit=False`` and re-entered by a semaphore that
    follows the commit (the default), the outer released first: the last release, inside
    ``atomic``, was the outer hold's, which does not wait: given back before the commit."""
    resource = "rv38h:on-commit-last"
    outer = semaphore(resource, on_commit=False).acquire()
    inner = semaphore(resource).acquire()
    outer.release()
    with transaction.atomic():
        User.objects.create(username="rv38h-on-commit-last")
        inner.release()
        assert holds_on(resource) != [], "given back before its work was committed"
    assert holds_on(resource) == []
