from __future__ import annotations
import time
from typing import Any
import pytest
from dynasem import semaphore
from dynasem._storage import dynamodb, permit_items, reader_items, lock_rows
from tests.support.faults import Faults

pytestmark = [pytest.mark.django_db(transaction=False)]


def test_lost_many_permits(lock_table: str) -> None:
    with Faults(dynamodb.get_client()) as faults:
        rule = faults.lose_response("TransactWriteItems", 1)
        held = semaphore(["p", "q"], limit=9, lease=5, wait=3).acquire()
    print("fired", rule.fired, held.slots)
    for r in ("p", "q"):
        ps = [p for p in permit_items.permits(r) if p.holder.expires_ms > time.time() * 1000]
        print(r, [(p.slot, p.token == held.token) for p in ps])
    held.release()
    for r in ("p", "q"):
        ps = [p for p in permit_items.permits(r) if p.holder.expires_ms > time.time() * 1000]
        print("after", r, [(p.slot, p.token == held.token) for p in ps])
        assert not ps


def test_lost_many_readers(lock_table: str) -> None:
    others = [semaphore(["p", "q"], shared=True, lease=5).acquire() for _ in range(3)]
    with Faults(dynamodb.get_client()) as faults:
        rule = faults.lose_response("TransactWriteItems", 1)
        held = semaphore(["p", "q"], shared=True, lease=5, wait=3).acquire()
    print("fired", rule.fired, type(held), getattr(held, "epochs", None))
    for r in ("p", "q"):
        row = lock_rows.get(r)
        print(r, row.reader_count, list(row.holders))
    held.release()
    for o in others:
        o.release()
    for r in ("p", "q"):
        row = lock_rows.get(r)
        print("after", r, row.reader_count, list(row.holders))
        assert not row.holders or row.reader_count == 0
