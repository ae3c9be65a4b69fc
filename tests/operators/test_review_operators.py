"""Review of the operators' side (dynasem_release, the admin's break, dynasem_reap): what an
operator's action leaves behind when its request is answered late, or lost, or the command
is interrupted between two of its writes."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import time
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from dynasem import semaphore
from dynasem._engine import reader_hold as reader_held
from dynasem._storage import dynamodb, lock_rows, lock_writes, reader_items
from dynasem.testing import abandon
from tests.support.faults import Faults
from tests.support.helpers import take

pytestmark = pytest.mark.kind_engine_only("makes its own lost answers, to the request")

LEASE = 30  # long beside the test: a reader count left behind shows as a writer kept out


@pytest.fixture(autouse=True)
def forget_rows() -> None:
    reader_held.rows.clear()


@pytest.fixture
def one_reader_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The row keeps one reader; the second is in a reader item (as the 3rd is by default)."""
    monkeypatch.setattr(lock_writes, "READERS_INLINE", 1)
    monkeypatch.setattr(reader_items, "READERS_INLINE", 1)


def run(name: str, *args: str) -> str:
    out = io.StringIO()
    call_command(name, *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.mark.parametrize("answer", ["answered", "lost"])
def test_a_reader_break_whose_answer_was_lost_leaves_no_count_behind(
    lock_table, holds, one_reader_inline, answer
):
    """An operator breaks the reader in an item (dynasem_release --token): the tombstone's
    UpdateItem is applied, its answer lost (the quick client: one attempt). The break never
    counts the reader down; run again it finds no reader (the tombstone is none) and breaks
    nothing. The row keeps the count (and its sentinel) for a reader that is gone: once the
    other reader leaves, a writer is kept out until a write-off, the readers' lease and the
    skew after the row last changed (30 s here), though nobody holds the resource."""
    resource = "review:break-lost"
    inline = take(holds, resource, shared=True, lease=LEASE)
    broken = take(holds, resource, shared=True, lease=LEASE)
    assert reader_items.has_readers(lock_rows.get(resource))  # the second is in an item
    prefix = broken.token[:8]
    with Faults(dynamodb.get_client(quick=True)) as quick:
        lost = quick.lose_response("UpdateItem", 1 if answer == "lost" else 0)  # the tombstone
        with contextlib.suppress(CommandError):  # (before the mend: DynamoDB did not answer)
            run("dynasem_release", resource, "--token", prefix, "--yes")
    assert lost.fired == (answer == "lost")
    # Whatever it was told, the operator runs the break again: nothing is left to break.
    with pytest.raises(CommandError, match="No hold"):
        run("dynasem_release", resource, "--token", prefix, "--yes")
    abandon(broken)  # its holder learns it was broken at its next renewal; stop it here
    inline.release()
    row = lock_rows.get(resource)
    started = time.monotonic()
    try:
        writer = semaphore(resource, lease=LEASE, wait=3).acquire()
    except Exception as exc:  # SemaphoreBusy
        writer = None
        why: Any = exc
    waited = time.monotonic() - started
    if writer is not None:
        writer.release()
    assert writer is not None, (
        f"no writer got the free resource within {waited:.1f} s ({why!r}); the row still counts "
        f"{row.reader_count} reader(s) of epoch {row.reader_epoch} and keeps the sentinel "
        f"{sorted(row.holders)}"
    )


def test_a_reader_break_interrupted_after_its_tombstone_leaves_no_count_behind(
    lock_table, holds, one_reader_inline, monkeypatch
):
    """Ctrl-C in ``dynasem_release`` between a reader's tombstone (applied and answered) and
    its count-down: the break, run again, finds no reader and breaks nothing, and the row
    keeps counting a reader that is gone: a writer is kept out until a write-off (the
    readers' lease and the skew after the row last changed), though nobody holds."""
    resource = "review:break-interrupted"
    inline = take(holds, resource, shared=True, lease=LEASE)
    broken = take(holds, resource, shared=True, lease=LEASE)
    interrupts: list[str] = []

    def mark(params: dict[str, Any], context: dict[str, Any], **kwargs: Any) -> None:
        names = {
            value
            for request in [params, *(i.get("Update", {}) for i in params.get("TransactItems", []))]
            for value in request.get("ExpressionAttributeNames", {}).values()
        }
        context["review_tombstone"] = "bt" in names

    def interrupt(http_response: Any, context: dict[str, Any], **kwargs: Any) -> None:
        if context.get("review_tombstone") and http_response.status_code == 200 and not interrupts:
            interrupts.append("after the tombstone")
            # The operator's Ctrl-C, as the tombstone's answer comes: Python raises
            # KeyboardInterrupt in the main thread at its next instruction.
            os.kill(os.getpid(), signal.SIGINT)

    events = dynamodb.get_client(quick=True).meta.events
    events.register("before-parameter-build.dynamodb", mark)
    events.register("after-call.dynamodb", interrupt)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            run("dynasem_release", resource, "--token", broken.token[:8], "--yes")
    finally:
        events.unregister("before-parameter-build.dynamodb", mark)
        events.unregister("after-call.dynamodb", interrupt)
    assert interrupts
    with contextlib.suppress(CommandError):  # run again: "No hold" (the tombstone is none)
        run("dynasem_release", resource, "--token", broken.token[:8], "--yes")
    abandon(broken)
    inline.release()
    row = lock_rows.get(resource)
    try:
        writer = semaphore(resource, lease=LEASE, wait=3).acquire()
    except Exception as exc:  # SemaphoreBusy
        pytest.fail(
            f"no writer got the free resource within 3 s ({exc!r}); the row still counts "
            f"{row.reader_count} reader(s) and keeps {sorted(row.holders)}"
        )
    writer.release()


@pytest.mark.parametrize("answer", ["answered", "lost"])
def test_a_permit_break_whose_answer_was_lost_lets_the_waiter_in(lock_table, holds, answer):
    """A counting semaphore of permits, every permit held, a waiter in line; an operator
    breaks one permit (dynasem_release --token) and its answer is lost. The waiter takes
    the freed permit about as soon as when the break is answered (its slot hinted, the
    waiter pushed), not at the broken permit's lease end."""
    import threading

    resource = "review:permit-lost"
    limit = 9  # more than the row keeps inline: permit items
    held = [take(holds, resource, limit=limit, lease=LEASE) for _ in range(limit)]
    assert all(h.slots for h in held)
    got: list[Any] = []

    def wait() -> None:
        try:
            got.append(semaphore(resource, limit=limit, lease=LEASE, wait=8).acquire())
        except Exception as exc:
            got.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(1.0)  # queued behind the nine
    victim = held[0]
    with Faults(dynamodb.get_client(quick=True)) as quick:
        lost = quick.lose_response("UpdateItem", 1 if answer == "lost" else 0)
        with contextlib.suppress(CommandError):
            run("dynasem_release", resource, "--token", victim.token[:8], "--yes")
    assert lost.fired == (answer == "lost")
    abandon(victim)
    broke = time.monotonic()
    waiter.join(10)
    took = time.monotonic() - broke
    (outcome,) = got
    if not isinstance(outcome, Exception):
        holds.append(outcome)
    assert not isinstance(outcome, Exception) and took < 3, (outcome, took)


def test_breaking_every_reader_reads_each_reader_item_once_not_once_per_break(
    lock_table, holds, one_reader_inline
):
    """dynasem_release of a shared resource with N readers in items reads their items to list
    them (N items), then breaks each: a break looked its reader up by reading every reader
    item of the resource again (a Query of N items per break: N² items, 2,000 readers ~4
    million items), where the item's key (``r#<token>``) names it."""
    resource = "review:many-readers"
    readers = 20
    for _ in range(readers + 1):  # the first in the row, the others in items
        take(holds, resource, shared=True, lease=LEASE)
    read: list[int] = []

    def count(parsed: dict[str, Any], **kwargs: Any) -> None:
        read.append(parsed.get("Count", 0))

    events = dynamodb.get_client(quick=True).meta.events
    events.register("after-call.dynamodb.Query", count)
    try:
        run("dynasem_release", resource, "--yes")
    finally:
        events.unregister("after-call.dynamodb.Query", count)
    assert lock_rows.get(resource).holders == {}
    assert sum(read) <= 3 * readers, f"{sum(read)} items read by {len(read)} queries"


@pytest.mark.django_db
def test_a_release_cut_short_by_an_unanswered_break_records_the_breaks_it_made(
    lock_table, holds, django_user_model
):
    """dynasem_release of three holders (a counting resource): the first break is made, the
    second goes unanswered (DynamoDB's answer lost), and so does the read that would tell it
    applied (a break whose answer was lost is otherwise told by the row: see
    test_review37_operators.py). The command stops there with DynamoDB's error: the hold it
    did break is in no LogEntry (the admin's history is written after every break is made)
    and its output does not say it was broken."""
    from django.contrib.admin.models import LogEntry

    django_user_model.objects.create_user("ops")
    resource = "review:release-cut"
    for user in ("a", "b", "c"):
        take(holds, resource, limit=3, user=user, lease=LEASE)
    out = io.StringIO()
    with Faults(dynamodb.get_client(quick=True)) as quick:
        quick.lose_response("UpdateItem", after=1)  # the second break's answer is lost
        quick.connection_error("GetItem", after=1)  # and the look at the row after it fails
        with pytest.raises(CommandError):
            call_command(
                "dynasem_release", resource, "--yes", "--log-as", "ops", stdout=out, stderr=out
            )
    left = {h.user_id for h in lock_rows_holds(resource)}
    broken = {"a", "b", "c"} - left
    assert len(broken) == 2  # the first, and the second (applied, its answer lost)
    recorded = [entry.change_message for entry in LogEntry.objects.all()]
    assert len(recorded) >= 1, (
        f"broke the holds of {sorted(broken)}, recorded none; the command said: {out.getvalue()!r}"
    )


def lock_rows_holds(resource: str) -> list[Any]:
    from dynasem._operators.locks import holds_on

    return holds_on(resource)


def test_a_break_of_an_exclusive_hold_pushes_the_first_waiter(
    lock_table: Any, holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator breaks the holder of an exclusive lock that a waiter queues for: the break
    hands the lock over as a release does (the first waiter is pushed the row at once), not
    at the waiter's next paced look. A permit's or a reader's break pushes already."""
    import threading

    from dynasem._operators.locks import break_hold
    from tests.support.helpers import pushes_recorded, queue_of, wait_for

    holder = take(holds, "deploy", lease=LEASE)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(take(holds, "deploy", wait=20)))
    waiter.start()
    queued = wait_for(lambda: queue_of("deploy"), 10, "the waiter's entry")
    pushed = pushes_recorded(monkeypatch)
    assert break_hold("deploy", holder.token, fence=holder.fence)
    waiter.join(20)
    assert got, "the waiter never got the lock"
    assert pushed == list(queued), "the break told no waiter"
