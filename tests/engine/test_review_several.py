"""Review of holds of several resources at once (review-3): faults found, as failing tests."""

from __future__ import annotations

from typing import Any

import pytest

from dynasem import semaphore
from dynasem._engine import reader_hold as reader_held
from dynasem._storage import lock_rows
from dynasem.exceptions import SemaphoreUnavailable
from tests.support.helpers import OwnRequests, take

pytestmark = pytest.mark.django_db(transaction=False)


@pytest.fixture(autouse=True)
def forget_rows() -> None:
    reader_held.rows.clear()


def test_readers_of_several_whose_inline_join_was_answered_lost_leave_no_inline_entry(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shared acquire of ``["a", "b"]``, each row with one reader inline already: its
    first try joins both rows inline, in one transaction, applied with its answer lost (a
    timeout: ambiguous). Sent again, it is refused (each row now keeps two readers, ours
    among them), and the refusals show rows whose next reader takes an item: the acquire
    turns to ``readers.acquire_many`` and is admitted in reader items, while its inline
    entries, applied by the first try, stay in both rows. Nothing renews them and its
    release does not take them off: each row is held by our token, for nobody, until its
    lease runs out, and a writer waits for it after the release."""
    for r in ("sev:a", "sev:b"):
        take(holds, r, shared=True, lease=30)  # one reader inline in each, another's
    send = lock_rows.transact
    calls: list[str] = []

    def lost(actions: list[dict[str, Any]]) -> None:
        send(actions)
        if not calls:
            calls.append("applied, answer lost")
            raise SemaphoreUnavailable("read timeout", transient=True, ambiguous=True)

    monkeypatch.setattr(lock_rows, "transact", lost)
    pair = semaphore(["sev:a", "sev:b"], shared=True, lease=30, wait=2).acquire()
    monkeypatch.setattr(lock_rows, "transact", send)
    assert calls == ["applied, answer lost"]
    pair.release()
    rows = {r: lock_rows.get(r) for r in ("sev:a", "sev:b")}
    stuck = {
        r: row.holders[pair.token].expires_ms
        for r, row in rows.items()
        if row and pair.token in row.holders
    }
    assert not stuck, f"our inline reader entries left behind after the release: {stuck}"


def test_permits_of_several_are_not_kept_out_by_a_stale_hint(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A permit row may hint a slot that is held: a release frees its permit, then hints
    its slot in a write of its own; a taker that read the permits between the two (no hint
    left, every slot in use) finds the slot free, takes it (its row write requires the slot
    not hinted: it is not, yet), and the hint lands after. A take of one resource pops such a
    hint in its row write, is refused by the permit, and takes another slot. A take of
    several resources sends the pop and the permit's write in one transaction: refused
    together, the hint is never popped, and the next try, planned from the row read again,
    pops the same hint. It never takes a permit while that slot's holder holds it, though
    15 of 16 are free, and sends a transaction every 10-20 ms until its wait is over."""
    from dynasem import SemaphoreBusy
    from dynasem._storage import permit_items

    holder = take(holds, "sev:pool", limit=16, lease=30)  # slot 0
    assert holder.slots == {"sev:pool": 0}
    lock_rows.update(permit_items.hint("sev:pool", 0))  # the hint that landed late
    sent: list[int] = []
    transact = lock_rows.transact

    def counted(actions: list[dict[str, Any]]) -> None:
        sent.append(len(actions))
        transact(actions)

    monkeypatch.setattr(lock_rows, "transact", counted)
    try:
        pair = take(holds, ["sev:pool", "sev:other"], limit=16, lease=30, wait=2)
    except SemaphoreBusy:
        pytest.fail(
            f"busy after its wait, with 15 of 16 permits free: {len(sent)} transactions, "
            "each refused by the stale hint's held permit"
        )
    assert pair.slots["sev:pool"] != 0


def test_a_release_of_several_with_one_hot_row_gives_the_others_back(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hold of ``["a", "b"]`` is given back in one transaction. ``a`` is a hot key,
    throttled (a transaction is throttled when any of its items is): every send of the
    release is throttled until RELEASE_PATIENCE, and the release gives up. ``b``, which
    nobody else writes, could be given back by a write of its own, but is left held by our
    token for its whole lease while the process goes on: whoever waits for ``b`` alone
    waits for a lapse, not for a hot key it does not use. The release need not be all or
    none: each row's give-back is conditional on our token anyway."""
    from dynasem._engine import resend
    from dynasem.exceptions import LimitExceeded

    monkeypatch.setattr(resend, "RELEASE_PATIENCE", 1.0)
    pair = take(holds, ["sev:hot", "sev:calm"], lease=30)
    throttled = LimitExceeded("throttled (the hot key)", "throughput", transient=True)
    update, transact = lock_rows.update, lock_rows.transact
    sends: list[str] = []

    def hot_update(action: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if action["Key"]["pk"]["S"] == "sev:hot":
            sends.append("update of the hot row, throttled")
            raise throttled
        return update(action, *args, **kwargs)

    def hot_transact(actions: list[dict[str, Any]]) -> None:
        if any(a["Key"]["pk"]["S"] == "sev:hot" for a in actions):
            sends.append("transaction, throttled")
            raise throttled
        transact(actions)

    monkeypatch.setattr(lock_rows, "update", hot_update)
    monkeypatch.setattr(lock_rows, "transact", hot_transact)
    pair.release()
    monkeypatch.setattr(lock_rows, "update", update)
    monkeypatch.setattr(lock_rows, "transact", transact)
    calm = lock_rows.get("sev:calm")
    holders = {} if calm is None else calm.holders
    assert pair.token not in holders, (
        f"the calm row left held by the released hold after {len(sends)} throttled sends "
        f"({sorted(set(sends))}): until {holders[pair.token].expires_ms}"
    )


def test_readers_of_more_resources_than_items_allow_are_refused_when_made(
    holds: list[Any],
) -> None:
    """A shared semaphore of 51 resources is accepted (up to 100 may be taken at once), and
    its acquire works while each row keeps its readers inline; once one of its rows keeps
    two readers, the acquire turns to reader items, two actions a resource, and raises
    ``ValueError`` ("at most 50"): the same call, on the same arguments, fails or not by
    what other processes hold. Arguments it can never take at all times should be refused
    by ``semaphore()`` itself, as any bad argument is."""
    names = [f"sev:many:{i}" for i in range(51)]
    try:
        many = semaphore(names, shared=True, lease=30, wait=0)
    except ValueError:
        return  # refused when made, whatever the rows hold
    many.acquire().release()  # fine: every reader inline
    take(holds, names[0], shared=True, lease=30)
    take(holds, names[0], shared=True, lease=30)  # two readers inline: the next takes an item
    try:
        many.acquire().release()
    except ValueError as exc:
        pytest.fail(f"accepted when made, refused by the state of a row at its acquire: {exc}")


@pytest.mark.parametrize("kind", ["rows", "permits", "readers"])
def test_a_hold_of_several_lost_on_one_resource_names_that_one(holds: list[Any], kind: str) -> None:
    """A hold of ``["a", "b"]`` whose ``b`` an operator broke: its next renewal is refused
    for ``b`` and the hold is lost, rightly. ``LockLost`` (and the warning, and
    ``lock_lost``) name ``a``, the hold's first resource, "taken over": an operator looking
    at ``a`` finds it was never touched; the resource that was is named nowhere."""
    from dynasem.exceptions import LockLost
    from tests.support.helpers import break_holds

    options = {"rows": {}, "permits": {"limit": 16}, "readers": {"shared": True}}[kind]
    if kind == "readers":
        for _ in range(2):  # the next reader of sev:lb takes an item
            take(holds, "sev:lb", shared=True, lease=30)
    pair = take(holds, ["sev:la", "sev:lb"], lease=30, **options)
    assert [h.token for h in break_holds("sev:lb", pair.token)] == [pair.token]
    with pytest.raises(LockLost) as lost:
        pair.renew()
    assert "sev:lb" in str(lost.value), f"the loss names another resource: {lost.value}"


def test_a_hold_of_several_renews_and_releases_at_one_write_unit_a_row(
    holds: list[Any],
) -> None:
    """Renewing and releasing a hold of several resources need no transaction: each row's
    write is conditional on our token by itself, and nothing is gained by all or none (a
    row found not ours loses the hold either way; the others are given back by their own
    release). A transaction is billed two write units an item (docs/explanation/cost.md),
    so one made of these writes doubled what a hold of several pays for every renewal of
    its life and for its release. Billed here: each request's consumed units as DynamoDB
    Local reports them, doubled for a transaction as AWS bills it."""
    from dynasem._storage import dynamodb

    pair = take(holds, ["sev:bill-a", "sev:bill-b"], lease=30)
    pair.renew()  # the first renewal names the user in userId: index writes, once
    client = dynamodb.get_client()
    billed: list[tuple[str, float]] = []
    own = OwnRequests(this_thread=True)  # not a heartbeat's, nor another test's thread's

    def ask(params: dict[str, Any], **kwargs: Any) -> None:
        params["ReturnConsumedCapacity"] = "TOTAL"

    def told(parsed: dict[str, Any], model: Any, **kwargs: Any) -> None:
        if not own(None):  # after-call is told of no request: this thread's only
            return
        consumed = parsed.get("ConsumedCapacity", [])
        units = sum(
            c.get("CapacityUnits", 0.0)
            for c in (consumed if isinstance(consumed, list) else [consumed])
        )
        twice = model.name == "TransactWriteItems"
        billed.append((model.name, units * (2 if twice else 1)))

    events = client.meta.events
    for op in ("UpdateItem", "TransactWriteItems"):
        events.register(f"provide-client-params.dynamodb.{op}", ask)
        events.register(f"after-call.dynamodb.{op}", told)
    try:
        pair.renew()
        pair.release()
    finally:
        for op in ("UpdateItem", "TransactWriteItems"):
            events.unregister(f"provide-client-params.dynamodb.{op}", ask)
            events.unregister(f"after-call.dynamodb.{op}", told)
    assert all(lock_rows.get(r).holders == {} for r in ("sev:bill-a", "sev:bill-b"))
    total = sum(units for _, units in billed)
    assert total == 4.0, f"write units billed for a renewal and a release of two rows: {billed}"
