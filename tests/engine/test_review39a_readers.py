"""Ninth review, readers held in items: an admission re-sent by botocore after its answer was
lost must find its own mark on the row (``rlast``), or it counts its reader twice."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from dynasem import semaphore
from dynasem._engine import reader_hold
from dynasem._storage import reader_items
from tests.engine.test_readers_lost import (
    INLINE,
    LoseAnswer,
    all_leave_and_a_writer_gets_in,
    counted,
)
from tests.engine.test_trust_at_return import LEASE, PAST, admission
from tests.support.helpers import take

pytestmark = pytest.mark.django_db(transaction=False)


@pytest.fixture(autouse=True)
def forget_rows() -> None:
    """No row remembered from an earlier test's table (same resource name)."""
    reader_hold.rows.clear()


class GiveBackBetweenSends(LoseAnswer):
    """The first admission's answer lost after it was applied (as :class:`LoseAnswer`), and
    before botocore sends it again, an earlier reader's admission, answered past its trust,
    is given back (``release``: let that reader's thread go on; ``given_back``: its count
    is down)."""

    def __init__(self, release: threading.Event, given_back: threading.Event) -> None:
        super().__init__(admission)
        self.release, self.given_back = release, given_back

    def _hook(self, request_dict: dict[str, Any], response: Any, **kwargs: Any) -> None:
        import json

        if self.remaining > 0 and response is not None and response[0].status_code == 200:
            if threading.current_thread() is not threading.main_thread():
                return  # a renewal, or reader Z's own writes
            if not self.match(json.loads(request_dict["body"] or b"{}")):
                return
            self.release.set()
            assert self.given_back.wait(10), "the late admission was never given back"
        super()._hook(request_dict, response, **kwargs)


def test_an_admission_resent_after_another_readers_give_back_counts_once(
    holds: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Readers in items: reader Z's admission is applied and its item written, but its answer
    comes past its trust. Meanwhile reader A is admitted, its answer lost; before botocore
    sends it again, Z gives its admission back: its count-down took the row's mark with it,
    though the mark was A's by then, not Z's. A's re-send then found no mark and counted A a
    second time: after every reader left, the count stayed at one and a writer waited for
    the readers' write-off though nobody read."""
    for _ in range(INLINE + 1):
        take(holds, "doc", shared=True, lease=30)
    assert counted("doc") == (1, 1)
    written, release, given_back, go_on = (threading.Event() for _ in range(4))
    send, count_down = reader_items.send, reader_hold.count_down
    late: list[Any] = []

    def late_answer(action: dict[str, Any], **kwargs: Any) -> Any:
        sent = send(action, **kwargs)
        if threading.current_thread().name == "late" and not written.is_set():
            written.set()  # Z's item is written; its answer comes after A's first send
            assert release.wait(10)
            time.sleep(PAST)
        return sent

    def counted_down(*args: Any, **kwargs: Any) -> None:
        count_down(*args, **kwargs)
        if threading.current_thread().name == "late" and not given_back.is_set():
            given_back.set()  # Z admitted again only once A's take returned
            assert go_on.wait(10)

    def reader_z() -> None:
        late.append(semaphore("doc", shared=True, lease=LEASE).acquire())

    monkeypatch.setattr(reader_items, "send", late_answer)
    monkeypatch.setattr(reader_hold, "count_down", counted_down)
    z = threading.Thread(target=reader_z, name="late")
    z.start()
    assert written.wait(10)
    with GiveBackBetweenSends(release, given_back) as lost:
        take(holds, "doc", shared=True, lease=30)
    go_on.set()
    z.join(10)
    holds.extend(late)
    monkeypatch.undo()
    assert lost.fired == 1, "the admission's answer was never lost: the test missed its write"
    assert len(late) == 1
    assert counted("doc") == (3, 3)
    all_leave_and_a_writer_gets_in(holds, "doc")
