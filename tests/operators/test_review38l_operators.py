"""Review 38l: what the operator commands and the admin's break page say and exit with."""

from __future__ import annotations

import io
import sys
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from dynasem import AlreadyDone, run_once
from dynasem._operators.locks import holds_on
from tests.support.helpers import take

RELEASE = "admin:dynasem_lock_release"


def run(name: str, *args: str, **options: Any) -> str:
    out = io.StringIO()
    call_command(name, *args, stdout=out, **options)
    return out.getvalue()


def test_release_without_yes_on_no_terminal_exits_3_as_nothing_broken(
    lock_table, holds, monkeypatch
):
    """The help says: exit status 3 when nothing was broken. Not asked (no terminal), nothing
    is: a script's `dynasem_release R || [ $? = 3 ]` read status 1 as a failure."""
    held = take(holds, "rel38l:ask")
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    with pytest.raises(CommandError, match="--yes") as raised:
        run("dynasem_release", "rel38l:ask")
    assert raised.value.returncode == 3
    assert [h.token for h in holds_on("rel38l:ask")] == [held.token]
    held.release()


def test_jobs_reset_without_yes_on_no_terminal_exits_3_as_nothing_reset(lock_table, monkeypatch):
    with run_once("job38l:ask"):
        pass
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    with pytest.raises(CommandError, match="--yes") as raised:
        run("dynasem_jobs", "--reset", "job38l:ask")
    assert raised.value.returncode == 3
    with pytest.raises(AlreadyDone), run_once("job38l:ask"):  # still DONE: not reset
        pass


def test_createtable_wait_on_an_active_table_says_active_once(lock_table):
    out = run("dynasem_createtable", "--wait")
    assert f"Table {lock_table!r} already exists (ACTIVE)." in out
    assert "It is ACTIVE." not in out


def test_createtable_dry_run_with_check_is_refused_not_half_done(lock_table):
    """Each changes nothing; together one of them was dropped unsaid (--check ran, the
    definition the operator asked for was not printed): refused as other pairs are."""
    for args in (("--dry-run", "--check"), ("--check", "--dry-run", "--json")):
        with pytest.raises(CommandError, match="--dry-run and --check"):
            run("dynasem_createtable", *args)


@pytest.mark.parametrize(
    "query", [{}, {"resource": ""}, {"resource": "", "fence": "5"}, {"resource": "r38l:1"}]
)
def test_a_break_link_naming_no_hold_says_so_not_changed_since_listed(
    lock_table, admin_user, client, query
):
    """A link cut short (no resource, or no fence nor token) names no hold: 'changed since
    listed' sent the operator looking for a hold that was never named."""
    client.force_login(admin_user)
    body = client.get(reverse(RELEASE), query, follow=True).content.decode()
    assert "changed since listed" not in body
    assert "names no hold" in body and "nothing broken" in body
