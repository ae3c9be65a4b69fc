"""Review 38f: ``dynasem_jobs`` shows the columns its help and the commands reference list:
key, status, user, attempt, started, finished, last error."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from dynasem import run_once


def run(name: str, *args: str) -> str:
    out = io.StringIO()
    call_command(name, *args, stdout=out)
    return out.getvalue()


def test_the_jobs_table_shows_user_and_finished_as_its_help_says(lock_table):
    with run_once("import:1", user="importer"):
        pass
    with pytest.raises(ValueError), run_once("import:2", user="importer"):
        raise ValueError("bad header")
    finished = {r.key: r.finished for r in _jobs()}
    for listing in (run("dynasem_jobs"), run("dynasem_jobs", "import:1")):
        header, *rows = listing.splitlines()
        assert header.split()[:5] == ["KEY", "STATUS", "USER", "ATTEMPT", "STARTED"]
        assert "FINISHED (UTC)" in header
        for row in rows:
            key = row.split()[0]
            assert "importer" in row.split()
            assert finished[key].strftime("%Y-%m-%d %H:%M:%S") in row


def _jobs() -> list:
    from dynasem._operators import jobs

    return jobs.job_page(size=500).jobs


@pytest.mark.django_db
@pytest.mark.parametrize("command", ["dynasem_release", "dynasem_jobs"])
def test_an_empty_log_as_is_refused_before_anything_changes(lock_table, command):
    """``--log-as "$OPERATOR"`` with the variable unset: refused as an empty ``--user`` is,
    not read as no --log-as (the OS login's user, else the change unrecorded)."""
    from django.core.management import CommandError

    from dynasem._operators.locks import holds_on
    from dynasem.testing import held_elsewhere

    with run_once("import:9"):
        pass
    with held_elsewhere("tbl_issues:9", user="alice"):
        args = ["tbl_issues:9"] if command == "dynasem_release" else ["--reset", "import:9"]
        with pytest.raises(CommandError, match="--log-as: empty"):
            run(command, *args, "--yes", "--log-as", "")
        assert [h.user_id for h in holds_on("tbl_issues:9")] == ["alice"]
    assert _jobs()[0].status == "DONE"
