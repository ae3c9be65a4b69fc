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
