"""Review (thirty-sixth session): a hold or a run_once job inside a user's own ``atomic`` in
a Django ``TestCase``, whose transaction never commits."""

from __future__ import annotations

import pytest
from django.db import transaction

from dynasem import AlreadyDone, run_once, semaphore
from dynasem._operators.locks import holds_on


def _hold(name: str) -> None:
    with semaphore(name):
        pass


def _job(name: str) -> None:
    with run_once(name):
        pass


def _given_back(name: str) -> bool:
    return holds_on(name) == []


def _done(name: str) -> bool:
    try:
        with run_once(name, on_commit=False):
            return False  # claimed again: not DONE
    except AlreadyDone:
        return True


@pytest.mark.parametrize(
    ("body", "ended"), [(_hold, _given_back), (_job, _done)], ids=["hold", "run_once"]
)
def test_capture_on_commit_callbacks_ends_a_hold_after_an_earlier_hook(
    lock_table, db, django_capture_on_commit_callbacks, body, ended
):
    """Django's way to run a TestCase's commit hooks (the docs point to it for a hold given
    back inside your own ``atomic`` in a test) takes the hooks added since it began by their
    place in the list: dynasem moved its own to the front, so with any hook from before (an
    earlier request of the same test) the capture ran that old hook again and not ours: the
    lock stayed held, the job RUNNING, till the test ended."""
    earlier: list[str] = []
    transaction.on_commit(lambda: earlier.append("ran"))  # an earlier request's hook
    with django_capture_on_commit_callbacks(execute=True):
        with transaction.atomic():
            body("capture")
    assert ended("capture"), "the capture did not end what the block gave back"
    assert earlier == [], "the capture ran a hook registered before it"
