"""An operator's reset of a run_once key whose answer is lost after it was applied (as
DynamoDB's may be: a 500, a connection closed, an answer later than the client's timeout)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import call_command

from dynasem import run_once
from dynasem._operators import jobs
from dynasem._storage import dynamodb
from tests.support.faults import Faults


def failed_job(key: str) -> jobs.JobInfo:
    with pytest.raises(RuntimeError), run_once(key):
        raise RuntimeError("boom")
    job = jobs.job_info(key)
    assert job is not None and job.status == "FAILED"
    return job


@pytest.mark.django_db
def test_a_reset_applied_whose_answer_was_lost_says_reset_and_is_recorded(
    lock_table: str, django_user_model: Any
) -> None:
    """``dynasem_jobs --reset``'s write (the quick client: one attempt) is applied and its
    answer lost. The key is reset; before, the operator was told DynamoDB refused the
    request (exit status 1), and the reset, made, was missing from the admin's history.
    Run again to be sure, the reset would then find the key NEW, or, had it run and failed
    once more meanwhile, reset that failure unseen."""
    from django.contrib.admin.models import LogEntry

    django_user_model.objects.create_user("ops")
    failed_job("reset:lost")
    out = io.StringIO()
    with Faults(dynamodb.get_client(quick=True)) as quick:
        lost = quick.lose_response("UpdateItem")
        call_command(
            "dynasem_jobs", "--reset", "reset:lost", "--yes", "--log-as", "ops", stdout=out
        )
    assert lost.fired == 1
    assert "Reset 'reset:lost' (was FAILED)" in out.getvalue()
    assert jobs.job_info("reset:lost").status == "NEW"  # type: ignore[union-attr]
    (entry,) = LogEntry.objects.all()
    assert (entry.object_id, entry.user.get_username()) == ("reset:lost", "ops")


def test_a_reset_whose_resend_is_refused_by_its_own_applied_write_is_made(lock_table: str) -> None:
    """On the locks' client (botocore sends again): the first send applied, its answer lost,
    the re-send refused by the reset itself. Before, that refusal read as "ran again since
    it was read: not reset"."""
    job = failed_job("reset:resent")
    with Faults(dynamodb.get_client()) as faults:
        lost = faults.lose_response("UpdateItem")
        assert jobs.reset_job(job.key, job.status, job.finished_ms)
    assert lost.fired == 1
    assert jobs.job_info(job.key).status == "NEW"  # type: ignore[union-attr]


def test_a_reset_refused_because_the_job_ran_again_is_still_not_made(lock_table: str) -> None:
    job = failed_job("reset:again")
    failed_job("reset:again")  # ran and failed again since the operator read it
    assert not jobs.reset_job(job.key, job.status, job.finished_ms)
    assert jobs.job_info(job.key).attempt == 2  # type: ignore[union-attr]


@pytest.mark.django_db
def test_the_admins_reset_applied_whose_answer_was_lost_says_reset_and_is_recorded(
    lock_table: str, admin_user: Any, client: Any
) -> None:
    """The same from the admin's reset page: before, it said DynamoDB did not answer (look
    whether the job is new), and the reset, made, was missing from the admin's history."""
    from django.contrib.admin.models import LogEntry
    from django.urls import reverse

    job = failed_job("reset:admin")
    client.force_login(admin_user)
    form = {"key": job.key, "status": job.status, "finished": str(job.finished_ms)}
    with Faults(dynamodb.get_client(quick=True)) as quick:
        lost = quick.lose_response("UpdateItem")
        response = client.post(reverse("admin:dynasem_job_reset"), form)
    assert lost.fired == 1 and response.status_code == 302
    messages = [str(m) for m in client.get(response["Location"]).context["messages"]]
    assert messages == ["Reset 'reset:admin' (was FAILED): it will run again."]
    assert jobs.job_info(job.key).status == "NEW"  # type: ignore[union-attr]
    (entry,) = LogEntry.objects.all()
    assert (entry.object_id, entry.user) == ("reset:admin", admin_user)
