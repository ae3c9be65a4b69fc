"""Review 38b: a run_once job's life in time (its trusted deadline, as a hold's: see
tests/engine/test_review38b_time.py)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction

from dynasem import LockLost, SemaphoreBusy, run_once
from dynasem._storage import job_rows


@pytest.mark.django_db(transaction=True)
def test_a_stalled_job_s_confirmation_answered_past_its_trust_rolls_the_work_back(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside ``transaction.atomic`` a body that stalled past its lease is confirmed by a
    write of its own at the block's end (``Job.confirm``), its work rolled back if the job is
    not ours. The confirmation is trusted from its send; its answer came later than its own
    trust (``lease - CLOCK_SKEW`` after the send: a slow network), by when the stored lease
    end (a lease from the send) had run out and another process had claimed the job and begun
    its run. ``confirm()`` cleared the loss all the same: the block ended without
    ``LockLost`` and the stale run's work committed beside the new run's."""
    key = f"rv38b:late-confirm-{uuid.uuid4().hex[:8]}"
    others: list[str] = []

    def another_process_claims() -> None:
        try:
            other = run_once(key).claim()
        except SemaphoreBusy:
            others.append("busy")
        else:
            others.append("claimed")
            other._stop_heartbeat()
            other._finish(RuntimeError("the test's second run"))

    real_update = job_rows.update_job
    armed = threading.Event()

    def answered_late(action: dict[str, Any], **kwargs: Any) -> Any:
        answer = real_update(action, **kwargs)
        if armed.is_set() and threading.current_thread() is threading.main_thread():
            armed.clear()
            time.sleep(2.2)  # the answer on its way: past lease + CLOCK_SKEW (2 s) from the send
            claimer = threading.Thread(target=another_process_claims)
            claimer.start()
            claimer.join()
        return answer

    monkeypatch.setattr(job_rows, "update_job", answered_late)
    with pytest.raises(LockLost), transaction.atomic():
        with run_once(key, lease=1.5) as job:
            User.objects.create(username="rv38b-stale-run")
            job._stop_heartbeat()  # the body stalls: nothing renews it
            time.sleep(1.2)  # past its trust (lease 1.5 - CLOCK_SKEW 0.5)
            armed.set()  # the block's end confirms it: that answer comes late
    assert others == ["claimed"]
    assert not User.objects.filter(username="rv38b-stale-run").exists(), (
        "the stale run's work committed while another run had the job"
    )


@pytest.mark.django_db(transaction=True)
def test_a_job_renewal_answered_past_its_trust_raises_lock_lost(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``job.renew()`` (as ``held.renew()``: tests/engine/test_review38b_time.py) whose
    answer came after the trust it gave returned as if the lease were extended."""
    key = f"rv38b:late-renewal-{uuid.uuid4().hex[:8]}"
    real_update = job_rows.update_job
    with run_once(key, lease=1.5) as job:
        job._stop_heartbeat()  # the caller's own renewal only

        def answered_late(action: dict[str, Any], **kwargs: Any) -> Any:
            answer = real_update(action, **kwargs)
            time.sleep(1.2)  # past the trust it gives (1.0 s from its send)
            return answer

        monkeypatch.setattr(job_rows, "update_job", answered_late)
        with pytest.raises(LockLost):
            job.renew()
        monkeypatch.undo()
        assert job.seconds_left() == 0
        job.confirm()  # the run goes on: ours again (nobody claimed it), DONE at its end
