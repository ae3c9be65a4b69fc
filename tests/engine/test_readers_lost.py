"""Reader items under lost answers and throttling (issue 40, point G): an admission whose
answer was lost counts its reader once; an item's write whose answer was lost, broken by an
operator before it is sent again, does not make the broken reader again; a count-down that
is throttled pauses between its tries and says so when it gives up."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from dynasem import SemaphoreBusy, semaphore
from dynasem._engine import reader_hold as reader_held
from dynasem._engine import readers
from dynasem._engine.queue import Pace
from dynasem._operators import locks
from dynasem._storage import dynamodb, lock_rows
from dynasem._storage import reader_items as items
from dynasem.exceptions import LimitExceeded
from tests.engine.test_trust_at_return import LEASE, PAST, LateAnswers, admission, sk_of
from tests.support.faults import Faults
from tests.support.helpers import in_another_thread, queue_of, take, wait_for

pytestmark = pytest.mark.django_db(transaction=False)

# The readers a row keeps inline (the first reader of a row is one, whatever the setting).
INLINE = max(1, items.READERS_INLINE)


@pytest.fixture(autouse=True)
def forget_rows() -> None:
    """No row remembered from an earlier test's table (same resource name): each test's
    first readers join the row's holders, the next take items, as counted below."""
    reader_held.rows.clear()


class LoseAnswer:
    """The answer of the first ``times`` UpdateItems (or ``operation``s) that ``match`` (their
    JSON body) is replaced by a 500 after DynamoDB applied them: botocore sends the same
    request again, as it does on AWS when an applied write's answer is lost
    (tests/support/faults.py's lose_response, aimed at one kind of write)."""

    def __init__(
        self, match: Any, times: int = 1, operation: str = "UpdateItem", refusals: bool = False
    ):
        self.match, self.remaining, self.fired = match, times, 0
        self.client = dynamodb.get_client()
        self.event = f"needs-retry.dynamodb.{operation}"
        self.answers = (200, 400) if refusals else (200,)  # a refusal's answer lost too

    def _hook(self, request_dict: dict[str, Any], response: Any, **kwargs: Any) -> None:
        import json

        if response is None or response[0].status_code not in self.answers:
            return
        if self.remaining <= 0:
            return
        if not self.match(json.loads(request_dict["body"] or b"{}")):
            return
        self.remaining -= 1
        self.fired += 1
        http, parsed = response
        http.status_code = 500
        parsed.clear()
        parsed.update(
            {
                "Error": {"Code": "InternalServerError", "Message": "response lost"},
                "ResponseMetadata": {"HTTPStatusCode": 500},
            }
        )

    def __enter__(self) -> LoseAnswer:
        self.client.meta.events.register_first(self.event, self._hook)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.client.meta.events.unregister(self.event, self._hook)


def undone(body: dict[str, Any]) -> bool:
    """Whether ``body`` is an interrupted admission's undo of its reader item: our own
    tombstone where the item is (reader_items.retire_reader), not a delete."""
    return sk_of(body).startswith("r#") and "SET #bt = :tok, #f = :f" in body["UpdateExpression"]


class BreakBetweenSends(LoseAnswer):
    """The first write of a reader item (``operation``: its put; DeleteItem: its release's
    delete; ``match``: of those, the ones it is, say :func:`undone`): applied, its answer
    lost (as :class:`LoseAnswer`), and before botocore sends it again an operator breaks
    that reader (``dynasem_release``, the admin's break): ``broken`` says whether the break
    was made (or what ``between`` does instead)."""

    def __init__(self, operation: str = "UpdateItem", match: Any = None) -> None:
        super().__init__(match or (lambda body: sk_of(body).startswith("r#")), operation=operation)
        self.broken: list[bool] = []

    def between(self, resource: str, token: str) -> bool:
        return locks.break_hold(resource, token)

    def _hook(self, request_dict: dict[str, Any], response: Any, **kwargs: Any) -> None:
        import json

        if self.remaining <= 0 or response is None or response[0].status_code != 200:
            return
        body = json.loads(request_dict["body"] or b"{}")
        if self.match(body):
            resource, token = body["Key"]["pk"]["S"], sk_of(body)[2:]

            def operator() -> None:  # on a thread of its own: another client's request
                with dynamodb.quick():
                    self.broken.append(self.between(resource, token))

            thread = threading.Thread(target=operator)
            thread.start()
            thread.join()
        super()._hook(request_dict, response, **kwargs)


class WriteOffBetweenSends(BreakBetweenSends):
    """As :class:`BreakBetweenSends`, but a waiting writer writes the epoch's readers off
    between the sends (every reader counted that has an item was found dead, none was found
    live), and a reader opens the next epoch (``taken``): ``broken`` says whether the epoch
    moved on."""

    taken: list[Any] = []

    def between(self, resource: str, token: str) -> bool:
        seen = lock_rows.get(resource)
        after = readers.try_write_off(seen, skew=0.5)
        self.taken = [semaphore(resource, shared=True, lease=30).acquire()]
        return after is not None and seen is not None and after.reader_epoch > seen.reader_epoch


def counted(resource: str) -> tuple[int, int]:
    """The row's reader count and the reader items of its epoch (every one live here)."""
    stored = lock_rows.get_item(resource)
    assert stored is not None
    found = [r for r in items.readers(resource) if r.epoch == stored.get("repoch", 0)]
    return int(stored.get("rc", 0)), len(found)


def all_leave_and_a_writer_gets_in(holds: list[Any], resource: str) -> None:
    """Every reader gives its hold back: the count is 0, the sentinel gone, and a writer takes
    the resource at once (no wait for a write-off of readers nobody holds)."""
    for held in holds:
        held.release()
    holds.clear()
    stored = lock_rows.get_item(resource)
    assert stored is not None
    assert stored.get("rc", 0) == 0
    assert items.SENTINEL not in stored.get("holders", {})
    take(holds, resource, wait=0)


def one_reader_holds_and_then_a_writer_gets_in(holds: list[Any], reader: Any) -> None:
    """The count is ``reader`` alone (one item reader of the epoch), who holds (renews): a
    writer waits for it; once every reader leaves, a writer gets in at once."""
    assert counted("doc") == (1, 1)
    with pytest.raises(SemaphoreBusy):
        semaphore("doc", wait=0, lease=30).acquire()
    reader.renew()
    assert not reader.lost
    all_leave_and_a_writer_gets_in(holds, "doc")


def no_writer_beside(holds: list[Any], other: Any) -> None:
    """Only ``other`` reads (the row's readers leave): no writer gets in beside it."""
    writers: list[Any] = []

    def writer() -> None:  # another thread: this one holds readers
        try:
            writers.append(semaphore("doc", wait=0, lease=30).acquire())
        except SemaphoreBusy:
            pass

    other.renew()
    assert not other.lost
    in_another_thread(writer)
    holds.extend(writers)
    assert not writers, f"two holders: reader {other.token[:8]} and a writer"


def test_a_joining_admission_whose_answer_was_lost_counts_once(holds: list[Any]) -> None:
    readers = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE + 2)]
    assert counted("doc") == (2, 2)
    with LoseAnswer(admission) as lost:
        readers.append(take(holds, "doc", shared=True, lease=30))
    assert lost.fired == 1, "the admission's answer was never lost: the test missed its write"
    assert counted("doc") == (3, 3)
    all_leave_and_a_writer_gets_in(holds, "doc")


def test_an_admission_opening_an_epoch_whose_answer_was_lost_counts_once(
    holds: list[Any],
) -> None:
    for _ in range(INLINE):
        take(holds, "doc", shared=True, lease=30)
    assert not items.has_readers(lock_rows.get("doc"))
    with LoseAnswer(admission) as lost:
        take(holds, "doc", shared=True, lease=30)
    assert lost.fired == 1, "the admission's answer was never lost: the test missed its write"
    assert counted("doc") == (1, 1)
    all_leave_and_a_writer_gets_in(holds, "doc")


def test_both_answers_lost_counts_once(holds: list[Any]) -> None:
    """The admission's answer lost, and the answer of the write that confirms it (the same
    request sent again by botocore): still one count."""
    for _ in range(INLINE + 1):
        take(holds, "doc", shared=True, lease=30)
    with LoseAnswer(lambda body: sk_of(body) == "lock", times=2) as lost:
        take(holds, "doc", shared=True, lease=30)
    assert lost.fired == 2
    assert counted("doc") == (2, 2)
    all_leave_and_a_writer_gets_in(holds, "doc")


def test_an_admission_answered_too_late_and_given_back_counts_once(holds: list[Any]) -> None:
    """Admitted, answered past its trust: given back (item and count) and admitted again
    with the same token; that admission is counted, not taken for the one given back."""
    for _ in range(INLINE + 1):
        take(holds, "doc", shared=True, lease=30)
    with LateAnswers("UpdateItem", admission, PAST) as late:
        held = semaphore("doc", shared=True, lease=LEASE).acquire()
    holds.append(held)
    assert late.fired == 1
    assert counted("doc") == (2, 2)
    all_leave_and_a_writer_gets_in(holds, "doc")


def test_an_admission_answered_too_late_and_broken_before_its_give_back_is_counted_again(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Admitted, its item written, and broken by an operator before that answer came, past
    the admission's trust (the break counts it down): the give-back is refused by the break's
    tombstone and counts nothing down, and the same token is admitted again. The row still
    showed that admission as its last (``rlast``): admitted again, it must be counted, not
    taken for the admission confirmed. Before, it was not counted, and its release counted
    the reader beside it out: a writer took the lock beside that reader (found by the
    simulator's ``breaks`` mix, every reader in items: seed 6 of ``pauses``)."""
    others = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE + 1)]
    send, armed, broken = items.send, [True], []

    def broken_while_late(action: dict[str, Any], **kwargs: Any) -> Any:
        sent = send(action, **kwargs)
        if armed and action["Key"]["sk"]["S"].startswith("r#"):
            armed.clear()  # (the break's own write of the item comes through here too)
            broken.append(locks.break_hold("doc", action["Key"]["sk"]["S"][2:]))
            time.sleep(PAST)  # the answer comes past the admission's trust
        return sent

    monkeypatch.setattr(items, "send", broken_while_late)
    held = semaphore("doc", shared=True, lease=LEASE).acquire()
    monkeypatch.setattr(items, "send", send)
    assert broken == [True], "the operator's break did not land before the answer"
    assert counted("doc") == (2, 2)
    held.release()
    one_reader_holds_and_then_a_writer_gets_in(holds, others[-1])


def interrupted_once_its_item_landed(
    monkeypatch: pytest.MonkeyPatch, resource: str, first: Callable[[str], object] = print
) -> None:
    """A reader's acquire of ``resource``, interrupted (Ctrl-C) once its item's write landed,
    before its answer is used; ``first`` (given the reader's token) runs in between."""
    send, landed = items.send, []

    def interrupted(action: dict[str, Any], **kwargs: Any) -> Any:
        sent = send(action, **kwargs)
        sk = action["Key"]["sk"]["S"]
        if sk.startswith("r#") and not landed:
            landed.append(sk)
            first(sk[2:])
            raise KeyboardInterrupt
        return sent

    monkeypatch.setattr(items, "send", interrupted)
    with pytest.raises(KeyboardInterrupt):
        semaphore(resource, shared=True, lease=LEASE).acquire()
    monkeypatch.setattr(items, "send", send)
    assert landed, "the acquire was never interrupted: the test missed its write"


@pytest.mark.parametrize("how", ["interrupted", "answered-late"])
def test_an_admission_given_back_whose_delete_was_answered_lost_counts_its_reader_down(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Admitted (the row's answer came: counted), and its item given back: the caller
    interrupted once the item's write landed, or the admission answered past its trust. The
    item's delete applied, its answer lost, and botocore's re-send refused, the item gone:
    the count-down is ours, as a release's is. Interrupted, the reader is counted down and a
    writer gets in once the others leave; answered late, the same token admitted again is
    counted once. Before, the interrupted reader's count stayed, and writers waited for a
    write-off: the epoch's longest lease and the skew after the row last changed (3.5 s
    with a 3 s lease, measured)."""
    for _ in range(INLINE + 1):
        take(holds, "doc", shared=True, lease=30)
    lose = LoseAnswer(undone)
    if how == "interrupted":
        with lose as lost:
            interrupted_once_its_item_landed(monkeypatch, "doc")
        assert counted("doc") == (1, 1)
    else:
        with LateAnswers("UpdateItem", admission, PAST) as late, lose as lost:
            holds.append(semaphore("doc", shared=True, lease=LEASE).acquire())
        assert late.fired == 1
        assert counted("doc") == (2, 2)
    assert lost.fired == 1, "the give-back's answer was never lost: the test missed its write"
    all_leave_and_a_writer_gets_in(holds, "doc")


def test_a_give_back_refused_by_a_break_before_it_is_not_counted_down_again(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader broken by an operator once its item landed, before the interrupted acquire
    gives it back (the break counts it down): the give-back's delete is refused by the break's
    tombstone (that refusal's answer lost, botocore's re-send refused too), and it counts
    nothing down. The reader beside it still holds, counted: a writer waits for it."""
    others = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE + 1)]
    broken: list[bool] = []
    lose = LoseAnswer(undone, refusals=True)
    with lose as lost:
        interrupted_once_its_item_landed(
            monkeypatch, "doc", lambda token: broken.append(locks.break_hold("doc", token))
        )
    assert broken == [True]
    assert lost.fired == 1, "the refusal's answer was never lost: the test missed it"
    one_reader_holds_and_then_a_writer_gets_in(holds, others[-1])


@pytest.mark.parametrize(
    "hook", [BreakBetweenSends, WriteOffBetweenSends], ids=["break", "write-off"]
)
def test_a_give_back_between_whose_sends_the_reader_went_is_counted_down_once(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch, hook: type[BreakBetweenSends]
) -> None:
    """The give-back's delete applied, its answer lost, and before botocore sends it again an
    operator breaks the reader (beside another item reader: the item is gone, the break
    counts nothing down) or a waiting writer writes the epoch off (the only item reader)
    and another reader opens the next epoch (our count-down's condition refuses it: that
    reader's count is not ours). Either way the reader is counted down once: the reader
    left holds, counted, and a writer waits for it."""
    write_off = hook is WriteOffBetweenSends
    for _ in range(INLINE + (not write_off)):
        take(holds, "doc", shared=True, lease=30)
    with hook(match=undone) as between:
        interrupted_once_its_item_landed(monkeypatch, "doc")
    holds += getattr(between, "taken", [])
    assert between.broken == [write_off]
    one_reader_holds_and_then_a_writer_gets_in(holds, holds[-1])


def test_readers_of_several_resources_given_back_whose_deletes_were_answered_lost(
    holds: list[Any],
) -> None:
    """The same for a transaction of several admissions answered past its trust: each item's
    delete applied and its answer lost; each reader counted down once, and admitted again."""
    resources = ["doc-x", "doc-y"]
    for _ in range(INLINE + 1):
        take(holds, resources, shared=True, lease=30)
    lose = LoseAnswer(lambda body: sk_of(body).startswith("r#"), 2, operation="DeleteItem")
    late = LateAnswers("TransactWriteItems", lambda body: True, PAST)
    with late, lose as lost:
        held = semaphore(resources, shared=True, lease=LEASE).acquire()
    holds.append(held)
    assert late.fired == 1
    assert lost.fired == 2, "the give-backs' answers were never lost: the test missed them"
    assert [counted(r) for r in resources] == [(2, 2), (2, 2)]
    for held in holds:
        held.release()
    holds.clear()
    for resource in resources:
        assert counted(resource) == (0, 0)
        take(holds, resource, wait=0)


@pytest.mark.parametrize("before", [0, 1], ids=["last-reader", "beside-an-item-reader"])
def test_a_reader_broken_between_its_items_sends_never_holds_beside_a_writer(
    holds: list[Any], before: int
) -> None:
    """The reader's item written, its answer lost, and broken by an operator before botocore
    sends it again (the break counts the reader down: the last one, it takes the readers'
    sentinel off the row; beside another, the row still shows our admission as its last).
    The write sent again is refused by the break's tombstone: the reader is admitted again,
    counted, so a writer waits for it. Before, it wrote the item again: the reader held,
    renewed, and was listed nowhere, and a writer took the lock beside it at once."""
    others = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE + before)]
    with BreakBetweenSends() as hook:
        reader = take(holds, "doc", shared=True, lease=30)
    assert hook.broken == [True], "the operator's break did not land between the sends"
    assert counted("doc") == (before + 1, before + 1)
    for held in others:
        held.release()
        holds.remove(held)
    reader.renew()
    assert not reader.lost  # the reader holds: no writer beside it
    try:
        writer = semaphore("doc", wait=0, lease=30).acquire()
    except SemaphoreBusy:
        pass
    else:
        holds.append(writer)
        pytest.fail(
            f"two holders: reader {reader.token[:8]} (shared, renewing) and writer "
            f"{writer.token[:8]} (exclusive, fence {writer.fence})"
        )
    assert counted("doc") == (1, 1)
    assert reader.token in {h.token for h in locks.holds_on("doc")}  # operators see it
    all_leave_and_a_writer_gets_in(holds, "doc")


@pytest.mark.parametrize("before", [0, 1], ids=["last-reader", "beside-an-item-reader"])
def test_a_release_whose_delete_was_answered_lost_still_counts_its_reader_down(
    holds: list[Any], before: int
) -> None:
    """The reader item's delete applied, its answer lost: botocore's re-send is refused, the
    item gone. Nothing but our own delete takes an item away while a break of it would still
    show (its tombstone), so the count-down is ours: the reader is counted down (the last
    one takes the sentinel off), and a writer gets in once the readers have left. Before, the
    count stayed one too high, and writers waited for a write-off: the epoch's longest lease
    and the skew after the row last changed."""
    readers = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE + 1 + before)]
    assert counted("doc") == (before + 1, before + 1)
    with LoseAnswer(lambda body: sk_of(body).startswith("r#"), operation="DeleteItem") as lost:
        readers[-1].release()
    holds.remove(readers[-1])
    assert lost.fired == 1, "the delete's answer was never lost: the test missed its write"
    assert not readers[-1].lost
    assert counted("doc") == (before, before)
    all_leave_and_a_writer_gets_in(holds, "doc")


def test_a_reader_broken_between_its_deletes_sends_is_counted_down_once(
    holds: list[Any],
) -> None:
    """The reader item's delete applied, its answer lost, and an operator's break before
    botocore sends it again: the item is gone, so the break finds no reader and counts
    nothing down; our re-send's refusal does, once. The reader beside it still holds, counted:
    a writer waits for it."""
    readers = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE + 2)]
    with BreakBetweenSends(operation="DeleteItem") as hook:
        readers[-1].release()
    holds.remove(readers[-1])
    assert hook.broken == [False], "the break found a reader the delete had taken away"
    one_reader_holds_and_then_a_writer_gets_in(holds, readers[-2])


def test_a_count_down_throttled_for_a_moment_still_counts(holds: list[Any]) -> None:
    """A crowd's partition throttled for a moment (after botocore's retries of the item's
    delete): the count-down's tries, paused, outlast it."""
    readers = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE + 2)]
    with Faults(dynamodb.get_client(quick=True)) as faults:
        rule = faults.throttle("UpdateItem", 10**6)
        lift = threading.Timer(0.5, lambda: setattr(rule, "remaining", 0))
        lift.start()
        start = time.monotonic()
        readers[-1].release()
        took = time.monotonic() - start
        lift.join()
    holds.remove(readers[-1])
    assert rule.fired >= 1
    assert counted("doc") == (1, 1)
    assert took < 2.0
    all_leave_and_a_writer_gets_in(holds, "doc")


def test_a_count_down_given_up_says_so(holds: list[Any], caplog: Any) -> None:
    caplog.set_level(logging.WARNING, logger="dynasem")
    readers = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE + 2)]
    with Faults(dynamodb.get_client(quick=True)) as faults:
        rule = faults.throttle("UpdateItem", 10**6)
        start = time.monotonic()
        readers[-1].release()
        took = time.monotonic() - start
    holds.remove(readers[-1])
    assert rule.fired >= 2
    assert took < 2.0  # a release is not held up long for a count a writer can write off
    assert counted("doc") == (2, 1)  # too high (never too low): a writer writes it off
    warned = [r for r in caplog.records if "count" in r.getMessage() and "doc" in r.getMessage()]
    assert warned, "the count-down gave up silently"
    assert "write" in warned[-1].getMessage()  # says what it means: writers wait a write-off


def test_a_count_left_too_high_is_written_off_by_a_writer_that_comes_later_at_once(
    holds: list[Any], caplog: Any
) -> None:
    """The row's last admission stamped the readers' sentinel: a writer that first looks a
    lease after it writes the count left too high off at once, not a lease after its own
    first look (the idle lock a simulated writer whose requests failed for a while met)."""
    caplog.set_level(logging.ERROR, logger="dynasem")
    lease = 3.0
    readers = [take(holds, "doc", shared=True, lease=lease) for _ in range(INLINE + 2)]
    with Faults(dynamodb.get_client(quick=True)) as faults:
        faults.throttle("UpdateItem", 10**6)
        readers[-1].release()  # its count-down given up: the count stays one too high
    holds.remove(readers[-1])
    for held in holds:
        held.release()
    holds.clear()
    assert counted("doc") == (1, 0)
    time.sleep(lease + 2 * 0.5)  # every reader's lease, and CLOCK_SKEW twice, since
    start = time.monotonic()
    take(holds, "doc", wait=30)
    assert time.monotonic() - start < lease / 2


def _interrupt_items(monkeypatch: pytest.MonkeyPatch, done: list[str]) -> None:
    """Ctrl-C once the row's admission has landed and been answered, before the item's
    write is sent."""
    send = items.send

    def interrupt_before_the_item(action: dict[str, Any], **kwargs: Any) -> Any:
        sk = action["Key"]["sk"]["S"]
        if sk.startswith("r#") and not done:
            done.append(sk)
            raise KeyboardInterrupt
        return send(action, **kwargs)

    monkeypatch.setattr(items, "send", interrupt_before_the_item)


def _throttle_items(monkeypatch: pytest.MonkeyPatch, done: list[str]) -> None:
    """Every write of a reader item throttled (never applied): the admission gives up after
    readers.ITEM_TRIES and raises; its undo finds no item to delete, and counts nothing."""
    send = items.send

    def throttled(action: dict[str, Any], **kwargs: Any) -> Any:
        if action["Key"]["sk"]["S"].startswith("r#") and "#ep" in action["UpdateExpression"]:
            done.append("throttled")
            raise LimitExceeded("throttled", "throughput", transient=True)
        return send(action, **kwargs)

    monkeypatch.setattr(items, "send", throttled)


def _interrupt_row(monkeypatch: pytest.MonkeyPatch, done: list[str]) -> None:
    """Ctrl-C once the row's admission write has landed, before its answer is used."""
    update = lock_rows.update

    def interrupt_after_the_admission(action: dict[str, Any], **kwargs: Any) -> Any:
        answer = update(action, **kwargs)
        expression = action.get("UpdateExpression", "")
        if action["Key"]["sk"]["S"] == "lock" and "#rc" in expression and not done:
            done.append("lock")
            raise KeyboardInterrupt
        return answer

    monkeypatch.setattr(lock_rows, "update", interrupt_after_the_admission)


@pytest.mark.parametrize("where", ["before-item-write", "after-row-write", "item-throttled"])
def test_an_acquire_cut_short_between_admission_and_item_write_leaves_no_count(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """An admission counted on the row (``rc + 1``) whose item is never written: interrupted
    before the item's write, or during the row's (its answer not used), or every write of
    the item throttled. The undo finds no item to delete: the reader must be counted down
    all the same (the row's mark is still ours), or the count stays one too high with no
    reader, and a writer waits for a write-off once the real readers leave."""
    for _ in range(INLINE + 1):
        take(holds, "doc", shared=True, lease=30)
    assert counted("doc") == (1, 1)
    interrupted: list[str] = []
    with monkeypatch.context() as patch:
        if where == "before-item-write":
            _interrupt_items(patch, interrupted)
        elif where == "after-row-write":
            _interrupt_row(patch, interrupted)
        else:
            _throttle_items(patch, interrupted)
        with pytest.raises(KeyboardInterrupt if where != "item-throttled" else LimitExceeded):
            semaphore("doc", shared=True, lease=30).acquire()
    assert interrupted, "the acquire was never interrupted: the test missed its write"
    left = counted("doc")
    # Every real reader leaves: nobody holds "doc" now. A writer must get in at once.
    for held in holds:
        held.release()
    holds.clear()
    try:
        take(holds, "doc", wait=0, lease=30)
    except SemaphoreBusy as busy:
        pytest.fail(
            f"no reader holds 'doc', yet a writer is busy ({busy}): the interrupted admission "
            f"left its count (rc, items of the epoch, before the leave: {left}); the writer "
            "waits for a write-off, the epoch's lease and the skew after the row last changed"
        )


def _closes(update: str) -> Callable[[dict[str, Any]], bool]:
    """A match for :class:`LoseAnswer`: the row's write that takes the sentinel off, as
    ``update`` (leave_last's or close's) spells it."""
    return lambda body: sk_of(body) == "lock" and body.get("UpdateExpression") == update


@pytest.mark.kind_engine_only("loses one write's answer after the engine applied it")
@pytest.mark.parametrize(
    ("update", "known", "unanswered"),
    [
        ("SET #rc = :zero REMOVE #h.#s", True, False),
        ("SET #rc = :zero REMOVE #h.#s", True, True),
        ("REMOVE #h.#s", False, False),
    ],
    ids=["leave-last", "leave-last-unanswered", "close"],
)
def test_the_last_item_reader_whose_closing_answer_was_lost_still_wakes_the_writer(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch, update: str, known: bool, unanswered: bool
) -> None:
    """The last item reader's write that takes the sentinel off (leave_last, the row known
    to have one reader; else close, after the count-down) is applied, its answer lost, and
    botocore's re-send refused: the row as our write left it, held by nobody. Before the
    mend the count-down ended there, pushing nobody: the writer first in line waited for its
    own paced look (here 20 s; up to about a second by default) for a lock left free. The
    refusal's row is pushed now, as the answer would have been (handover.push_if_free: only
    a row held by nobody). The same when botocore's re-sends of leave_last are throttled to
    the end (``leave-last-unanswered``): the count-down that follows is refused with the row
    our write left."""
    monkeypatch.setattr(Pace, "turn_in", lambda *a, **k: 20.0)  # only a push wakes the writer
    readers = [take(holds, "doc", shared=True, lease=30) for _ in range(INLINE + 1)]
    for held in readers[:INLINE]:
        held.release()
    got: list[Any] = []
    writer = threading.Thread(target=lambda: got.append(semaphore("doc", wait=30).acquire()))
    writer.start()
    wait_for(lambda: queue_of("doc"), 10, "the writer never put its entry")
    if not known:
        reader_held.rows.clear()  # count down first, then close
    with LoseAnswer(_closes(update)) as lost, Faults(dynamodb.get_client()) as faults:
        throttled = faults.throttle("UpdateItem", 3 if unanswered else 0, after=1)
        readers[-1].release()  # every re-send throttled (unanswered): botocore gives up
    holds.clear()
    assert lost.fired == 1, "the closing write's answer was never lost: the test missed it"
    assert throttled.fired == (3 if unanswered else 0)
    writer.join(5)
    woken = bool(got)
    writer.join(30)  # its own look finds the lock free at last: let it end either way
    holds.extend(got)
    assert woken, "the writer was not pushed the lock left free: it sat idle until its look"
