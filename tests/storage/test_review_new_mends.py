"""Review of the day's mends (a3486cb..) in the storage layer: faults they bring, as failing
tests."""

from __future__ import annotations

import time

import pytest
from django.test import override_settings

import dynasem
from dynasem._storage import dynamodb, lock_rows, lock_writes
from dynasem.exceptions import SemaphoreUnavailable
from tests.support.helpers import dynasem_settings


def test_a_request_that_never_connected_is_not_ambiguous_after_botocores_retries(
    dynamodb_local: str,
) -> None:
    """DynamoDB unreachable (a closed port: every attempt refused before anything is sent).
    botocore retries the connection error, so the request was created more than once, and
    count_send's ``resent`` makes the error ambiguous ("an earlier attempt may have been
    applied"), though no attempt ever connected. A write that was surely never applied is
    then treated as one that may have been: the acquire sends it again past its wait, then
    a withdrawal (to an endpoint it cannot reach), before it can say DynamoDB is down."""
    with override_settings(DYNASEM=dynasem_settings("http://127.0.0.1:1", "nowhere")):
        action = lock_writes.give_back("res:review-unsent", "a" * 32, 0, sole=True)
        with pytest.raises(SemaphoreUnavailable) as raised:
            lock_rows.update(action)
    assert raised.value.transient
    assert not raised.value.ambiguous, f"never connected, yet ambiguous: {raised.value}"


def test_an_acquire_with_dynamodb_unreachable_fails_as_fast_as_before(
    dynamodb_local: str,
) -> None:
    """The same seen from the public API: ``acquire(wait=0)`` with DynamoDB unreachable.
    Each take's failure now reads ambiguous, so the loop tries MIN_TRANSIENT_RETRIES more
    times past its wait, and gives back (patiently, to the same closed port) what the
    takes never took."""
    with override_settings(DYNASEM=dynasem_settings("http://127.0.0.1:1", "nowhere")):
        started = time.monotonic()
        with pytest.raises(SemaphoreUnavailable) as raised:
            dynasem.semaphore("res:review-unreachable", lease=10, wait=0).acquire()
        took = time.monotonic() - started
    # Well under the seconds of re-sends past the wait and a patient give-back (the fault),
    # with room for a loaded machine (1.3 s seen with CI beside six other test runs).
    assert took < 3.0, f"{took:.1f}s to say DynamoDB cannot be reached"
    assert not raised.value.ambiguous, f"never connected, yet ambiguous: {raised.value}"
    assert dynamodb  # the module under review


def test_a_connection_closed_before_the_answer_is_transient_and_ambiguous() -> None:
    """Found by ci84 (tests/engine/test_races.py under the unkind engine): botocore's
    ConnectionClosedError ("Connection was closed before we received a valid response") is
    an HTTPClientError, not a ConnectionError. It read as neither transient nor ambiguous:
    an acquire with 120 s to wait raised at once, and a take it may have applied (the
    request was sent; only its answer was lost) was not given back."""
    from botocore.exceptions import ConnectionClosedError

    from dynasem._storage import dynamodb

    exc = dynamodb._unavailable(ConnectionClosedError(endpoint_url="http://127.0.0.1:1/"))
    assert exc.transient and exc.ambiguous, (exc.transient, exc.ambiguous)
