"""Several resources taken all or none in one transaction (TransactWriteItems), applied with
its answer lost (review 39, helper g): botocore sends it again with the same
``ClientRequestToken`` (an idempotency token it fills in once per call), which DynamoDB, and
DynamoDB Local, answer as the first try applied; every try of a call lost, dynasem's next
call (a new token) is cancelled by what the first one wrote, and plans again from it. Either
way the caller holds every resource exactly once (no count doubled, no reader or permit
counted twice), and its release gives everything back."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from dynasem import SemaphoreError, semaphore
from dynasem._engine import reader_hold as reader_held
from dynasem._storage import dynamodb, lock_rows, permit_items, reader_items
from tests.engine.test_readers_lost import INLINE
from tests.support.faults import Faults, Rule
from tests.support.helpers import take

pytestmark = pytest.mark.django_db(transaction=False)

PAIR = ["sev:a", "sev:b"]
# Every attempt botocore makes of one call (legacy mode, max_attempts 3: four sends).
ONE_CALL = 4


@pytest.fixture(autouse=True)
def forget_rows() -> None:
    reader_held.rows.clear()


def _answers(client: Any) -> list[int]:
    """The HTTP status of every answer to a TransactWriteItems, as botocore got it (before
    the lost-answer rule replaced it)."""
    answers: list[int] = []

    def record(response: Any, **kwargs: Any) -> None:
        if response is not None and response[0] is not None:
            answers.append(response[0].status_code)

    client.meta.events.register_first("needs-retry.dynamodb.TransactWriteItems", record)
    return answers


@dataclasses.dataclass
class AfterLost(Rule):
    """A refusal (never sent, not transient: the acquire fails) of every transaction sent
    once ``lost``'s answers were all lost."""

    lost: Rule | None = None

    def take(self, operation: str) -> bool:
        return self.lost is not None and not self.lost.remaining and super().take(operation)


def _hold(
    holds: list[Any], kind: str, lost: int, *, then_refused: bool = False
) -> tuple[Any, list[int]]:
    """The pair taken as ``kind``, the first ``lost`` answers to its transactions lost (and,
    ``then_refused``, every transaction after them refused)."""
    kwargs: dict[str, Any] = {"lease": 30, "wait": 5}
    if kind == "shared items":
        for _ in range(reader_items.READERS_INLINE):
            take(holds, PAIR[0], shared=True, lease=30)  # the next reader of sev:a: an item
        kwargs["shared"] = True
    elif kind == "permits":
        kwargs["limit"] = 9
    elif kind == "counting inline":
        kwargs["limit"] = 3
    client = dynamodb.get_client()
    answers = _answers(client)
    with Faults(client) as faults:
        rule = faults.lose_response("TransactWriteItems", lost)
        if then_refused:
            refuse = AfterLost("refuse", "TransactWriteItems", 100, status=400, lost=rule)
            refuse.code = "AccessDeniedException"  # type: ignore[attr-defined]
            faults.rules.append(refuse)
        held = semaphore(PAIR, **kwargs).acquire()
        assert faults.fired == lost
    return held, answers


def _holders(resource: str) -> list[str]:
    """Every holder counted of ``resource`` (a token once per time it is counted): the row's
    holders, its permits, its reader items (the readers' count checked against them)."""
    row = lock_rows.get(resource)
    if row is None:
        return []
    found = [t for t, h in row.holders.items() if t != reader_items.SENTINEL]
    if row.slots_used is not None:
        found += [p.token for p in permit_items.permits(resource) if p.token]
    if reader_items.has_readers(row):
        items = [r for r in reader_items.readers(resource) if r.epoch == row.reader_epoch]
        assert row.reader_count == len(items), f"{resource}: counted {row.reader_count}"
        found += [r.token for r in items]
    return found


def _ours(resource: str, token: str) -> int:
    """How many times ``token`` is counted as a holder of ``resource``."""
    return _holders(resource).count(token)


@pytest.mark.parametrize("lost", [1, ONE_CALL])
@pytest.mark.parametrize("kind", ["exclusive", "shared items", "permits", "counting inline"])
def test_several_resources_whose_transaction_was_applied_unanswered_are_held_once(
    holds: list[Any], kind: str, lost: int
) -> None:
    """``lost`` 1: botocore's second try of the same call is answered as the first (the
    same idempotency token), and the acquire goes on as if nothing was lost. ``lost`` 4:
    every try of the first call lost (an ambiguous failure); the next call is cancelled by
    the first's writes, the refusals show our hold, which is confirmed."""
    held, answers = _hold(holds, kind, lost)
    if lost == 1:
        first = answers.index(200)  # the try applied, its answer lost (refusals before it)
        assert answers[first + 1] == 200, "the re-send with the same token was not replayed"
    assert {r: _ours(r, held.token) for r in PAIR} == {r: 1 for r in PAIR}
    held.release()
    assert {r: _ours(r, held.token) for r in PAIR} == {r: 0 for r in PAIR}
    if kind == "shared items":
        for resource in PAIR:  # no reader of ours left counted: a writer may take each
            held_after = [h for h in holds if h.resource == resource]
            for other in held_after:
                other.release()
        holds.clear()
        semaphore(PAIR, lease=30, wait=0).acquire().release()


@pytest.mark.parametrize("kind", ["exclusive", "shared items", "permits", "counting inline"])
def test_several_resources_whose_transaction_was_applied_unanswered_then_failed_hold_none(
    holds: list[Any], kind: str
) -> None:
    """Every try of the first call lost, the acquire then fails (its next transaction
    refused for good): what the first call took is given back, each reader counted down;
    only the test's own readers of ``sev:a`` are counted."""
    with pytest.raises(SemaphoreError, match="AccessDenied"):
        _hold(holds, kind, ONE_CALL, then_refused=True)
    for resource in PAIR:
        ours = {h.token for h in holds if h.resource == resource}
        left = sorted(_holders(resource))
        assert left == sorted(ours), f"{resource}: a holder left by the failed acquire"


def test_readers_of_several_wait_while_a_permit_rows_permits_cannot_be_read(
    holds: list[Any],
) -> None:
    """Readers of several resources in reader items, one of them a counting semaphore's
    permit row (no permit live): its permits must be read, and fenced out, before readers
    take it. The first read of them throttled (past botocore's retries), who holds is not
    known: the acquire waits and reads them again, then takes it; it never plans an
    admission to a row whose permits were not read (refused by the admission itself, a
    ``ValueError`` that would fail the acquire)."""
    for _ in range(INLINE + 1):
        take(holds, "mix:r", shared=True, lease=30)  # the last one in a reader item
    semaphore("mix:s", limit=9, lease=30).acquire().release()  # a permit row, no permit live
    with Faults(dynamodb.get_client()) as faults:
        faults.throttle("Query", 4)  # one read, every attempt botocore makes
        held = semaphore(["mix:r", "mix:s"], shared=True, wait=5, lease=30).acquire()
        assert faults.fired == 4
    holds.append(held)
    row = lock_rows.get("mix:s")
    assert row is not None and row.slots_used is None and held.token in _holders("mix:s")


def test_permits_of_several_refused_again_and_again_are_busy_once_their_wait_is_over(
    lock_table: str,
) -> None:
    """A take of permits of several resources whose transaction is refused at every try
    (another taker always first): past its wait and MAX_REPLANS refusals, busy, not a loop
    of refusals for as long as they come."""
    from dynasem import SemaphoreBusy
    from dynasem._engine import queue

    semaphore(["pool:a", "pool:b"], limit=9).acquire().release()  # the permit rows exist
    reasons = ["ConditionalCheckFailed"] * 4
    tries = 4 * queue.MAX_REPLANS
    with Faults(dynamodb.get_client()) as faults:
        faults.cancel("TransactWriteItems", tries, reasons=reasons)
        with pytest.raises(SemaphoreBusy):
            semaphore(["pool:a", "pool:b"], limit=9, wait=0.2, lease=30).acquire()
        assert queue.MAX_REPLANS < faults.fired < tries


def test_readers_of_several_open_items_on_a_row_of_fewer_inline_readers(
    holds: list[Any],
) -> None:
    """Readers of several resources take reader items in each when any of their rows would
    give its next reader one: here ``sev:a`` keeps as many readers inline as a row does,
    ``sev:b`` fewer. The epoch opened on ``sev:b`` is not conditional on its row keeping as
    many inline (that condition is for a row that did: its readers may have left): the
    reader is admitted to both, each counted once."""
    for _ in range(reader_items.READERS_INLINE):
        take(holds, PAIR[0], shared=True, lease=30)
    take(holds, PAIR[1], shared=True, lease=30)  # one reader inline: fewer
    held = semaphore(PAIR, shared=True, lease=30, wait=1).acquire()
    holds.append(held)
    assert set(held.epochs) == set(PAIR)
    assert {r: _ours(r, held.token) for r in PAIR} == {r: 1 for r in PAIR}
