"""Review (thirty-seventh session, h): dynasem.E015, the host's clock against DynamoDB's."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.core.checks import run_checks

from dynasem import _clock as clock
from dynasem._storage import dynamodb


@pytest.mark.parametrize("step", [-100, 100])
def test_a_clock_stepped_right_while_e014s_request_was_on_its_way_is_no_e015(
    lock_table: str, monkeypatch: pytest.MonkeyPatch, step: int
) -> None:
    """NTP steps the host's clock right (by 100 s) while the check's GetItem is on its way:
    the clock leases use from now on agrees with DynamoDB's, and the check passes. Measured
    by the wall clock at the send and at the answer, the offset was the clock's before the
    step: a false E015, an Error that stops ``migrate`` and ``runserver``."""
    off = [-float(step)]  # the clock's error until the step
    monkeypatch.setattr(clock, "wall_clock", lambda: time.time() + off[0])
    build = dynamodb.build_client

    class Stepped:
        def __init__(self, client: Any) -> None:
            self._client = client

        def __getattr__(self, name: str) -> Any:
            return getattr(self._client, name)

        def get_item(self, **kwargs: Any) -> Any:
            answer = self._client.get_item(**kwargs)
            off[0] = 0.0  # stepped right as the answer came
            return answer

    monkeypatch.setattr(dynamodb, "build_client", lambda *a, **k: Stepped(build(*a, **k)))
    found = [m for m in run_checks() if m.id in ("dynasem.E015", "dynasem.W002")]
    assert found == [], found[0].msg
