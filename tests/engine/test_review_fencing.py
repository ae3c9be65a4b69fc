"""Review (fencing tokens, end to end): a hold's fence is above every earlier holder's of
its resource, also when the lock row was deleted and made anew in between."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import call_command

from dynasem import semaphore
from dynasem._storage import dynamodb, lock_rows
from tests.support.helpers import OwnRequests, in_another_thread

SKEW = 0.5  # CLOCK_SKEW of the test settings


def reap_until_gone(resource: str, timeout: float = 8.0) -> None:
    deadline = time.monotonic() + timeout
    while lock_rows.get_item(resource) is not None:
        assert time.monotonic() < deadline, "the row was never reaped"
        call_command("dynasem_reap", stdout=io.StringIO())
        time.sleep(0.2)


class PausedBeforeSend:
    """The first ``operation`` request this thread sends waits, before it leaves, while
    ``meanwhile()`` runs in another thread: a process stopped (SIGSTOP, a VM paused, a long
    GC) between building its write and sending it."""

    def __init__(
        self, operation: str, meanwhile: Callable[[], None], *, lose_answer: bool = False
    ) -> None:
        self.operation, self.meanwhile = operation, meanwhile
        self.thread = threading.get_ident()
        self.fired = False
        # ``lose_answer``: that request is applied, and its answer replaced by a 500.
        self.lose_answer, self.lost = lose_answer, False
        self.client = dynamodb.get_client()

    def _lose(self, response: Any, **kwargs: Any) -> None:
        if not self.lose_answer or self.lost or threading.get_ident() != self.thread:
            return
        if response is None or response[0] is None or response[0].status_code != 200:
            return
        self.lost = True
        http_response, parsed = response
        http_response.status_code = 500
        parsed.clear()
        parsed.update(
            {
                "Error": {"Code": "InternalServerError", "Message": "response lost"},
                "ResponseMetadata": {"HTTPStatusCode": 500},
            }
        )

    def _hook(self, **kwargs: Any) -> None:
        if self.fired or threading.get_ident() != self.thread:
            return
        self.fired = True
        in_another_thread(self.meanwhile)

    def __enter__(self) -> PausedBeforeSend:
        events = self.client.meta.events
        events.register_first(f"before-send.dynamodb.{self.operation}", self._hook)
        events.register_first(f"needs-retry.dynamodb.{self.operation}", self._lose)
        return self

    def __exit__(self, *exc: Any) -> None:
        events = self.client.meta.events
        events.unregister(f"before-send.dynamodb.{self.operation}", self._hook)
        events.unregister(f"needs-retry.dynamodb.{self.operation}", self._lose)


@pytest.mark.usefixtures("one_second_buckets")
@pytest.mark.parametrize("answer", ["answered", "lost"])
def test_a_take_paused_before_its_send_over_a_reap_gets_a_fence_above_the_earlier_holders(
    lock_table: str, answer: str
) -> None:
    """A (lease 30 s) draws its fence, builds its take of a free lock and is paused before
    the send. Meanwhile B (lease 1 s) takes the lock (a later fence), releases it, and the
    reaper deletes the idle row. A's take is sent: the row is gone, so the condition
    ``attribute_not_exists(fence) OR fence < :fence`` passes, and A holds (trusted: its lease
    is long) under the fence drawn before B's. A fenced store that saw B's fence refuses the
    legitimate holder A; one that only keeps the fence it last saw goes backwards. ``lost``:
    A's take is applied and its answer lost; the re-send finds A's own entry (its old
    fence) and A holds under it."""
    earlier: list[int] = []

    def b_takes_releases_and_the_row_is_reaped() -> None:
        with semaphore("res", lease=1) as b:
            earlier.append(b.fence)
        reap_until_gone("res")

    lose = answer == "lost"
    meanwhile = b_takes_releases_and_the_row_is_reaped
    with PausedBeforeSend("UpdateItem", meanwhile, lose_answer=lose) as paused:
        a = semaphore("res", lease=30).acquire()
    try:
        assert paused.fired and earlier and paused.lost == lose
        assert a.fence > earlier[0], (
            f"A's fence {a.fence} is not above B's {earlier[0]}: B held before A, the fence "
            "went back across the reap"
        )
    finally:
        a.release()


def test_a_take_answered_late_within_its_bucket_costs_no_second_write(lock_table: str) -> None:
    """The mend's cost: a take whose answer came more than CLOCK_SKEW after its fence was
    drawn, but before its draw's ``expires`` bucket ended (nothing could have been reaped
    meanwhile), is returned as it is: one write, its own fence."""
    client = dynamodb.get_client()
    updates: list[str] = []
    late = [True]

    own = OwnRequests(this_thread=True)  # not another test's thread's

    def count(params: Any, **kwargs: Any) -> None:
        if own(params):
            updates.append("UpdateItem")

    def answer_late(response: Any, request_dict: Any, **kwargs: Any) -> None:
        if not own(request_dict):
            return
        if late[0] and response is not None and response[0] is not None:
            late[0] = False
            time.sleep(SKEW + 0.3)

    client.meta.events.register("before-call.dynamodb.UpdateItem", count)
    client.meta.events.register("needs-retry.dynamodb.UpdateItem", answer_late)
    try:
        a = semaphore("res", lease=30).acquire()
    finally:
        client.meta.events.unregister("before-call.dynamodb.UpdateItem", count)
        client.meta.events.unregister("needs-retry.dynamodb.UpdateItem", answer_late)
    try:
        assert not late[0] and len(updates) == 1, updates
        stored = lock_rows.get("res")
        assert stored is not None and stored.holders[a.token].fence == a.fence
    finally:
        a.release()
