"""dynasem.exceptions: what each error carries, declared, not set from outside."""

from __future__ import annotations

import pickle

from dynasem import SemaphoreUnavailable, TableMissing


def test_unavailable_says_whether_to_retry_and_whether_it_may_have_applied() -> None:
    plain = SemaphoreUnavailable("refused")
    assert (plain.transient, plain.ambiguous, str(plain)) == (False, False, "refused")
    timeout = SemaphoreUnavailable("timed out", transient=True, ambiguous=True)
    assert (timeout.transient, timeout.ambiguous) == (True, True)
    assert (TableMissing("no table").transient, TableMissing("no table").ambiguous) == (
        False,
        False,
    )


def test_unavailable_keeps_its_attributes_through_pickle() -> None:
    """As a Celery task's error does."""
    again = pickle.loads(pickle.dumps(SemaphoreUnavailable("x", transient=True)))
    assert (again.transient, again.ambiguous, str(again)) == (True, False, "x")
