"""Review 36 (bad input and DynamoDB's limits), the semaphore's arguments: each refused by
its own name, before any request."""

from __future__ import annotations

from typing import Any

import pytest

from dynasem import semaphore
from tests.support.faults import Faults


@pytest.mark.parametrize(
    ("value", "error", "said"),
    [
        (5, TypeError, "metrics_name must be a str, not int"),
        ("", ValueError, "metrics_name must be a non-empty str"),
        ("m" * 2000, ValueError, "metrics_name is 2000 UTF-8 bytes"),
        ("m\x1b", ValueError, "metrics_name 'm.*contains the control character"),
    ],
    ids=["int", "empty", "too-long", "control"],
)
def test_a_bad_metrics_name_is_refused_naming_metrics_name(
    value: Any, error: type[Exception], said: str
) -> None:
    """Before: "resource must be a str, not int: 5", about an argument that was right."""
    with pytest.raises(error, match=said):
        semaphore("r36", metrics_name=value)


@pytest.mark.parametrize("reason", ["ProvisionedThroughputExceeded", "ThrottlingError"])
def test_a_take_of_several_cancelled_for_throughput_is_tried_again(lock_table, reason):
    """DynamoDB cancels a transaction over a provisioned table's (or index's) capacity with
    the reason ``ProvisionedThroughputExceeded`` (an on-demand table's: ``ThrottlingError``).
    Before, only the latter was read as throttling: a take of several resources on a
    provisioned table failed at once, well inside its wait, with a plain non-transient
    "refused the request: TransactionCanceledException", not retried, not named a
    throughput limit (the metrics already counted it as throttled)."""
    from dynasem import LimitExceeded
    from dynasem._storage import dynamodb

    with Faults(dynamodb.get_client()) as faults:
        rule = faults.cancel("TransactWriteItems", 1, reasons=[reason, "None"])
        with semaphore(["r36-a", "r36-b"], wait=5) as held:
            assert set(held.fences) == {"r36-a", "r36-b"}
    assert rule.fired == 1
    with Faults(dynamodb.get_client()) as faults:
        faults.cancel("TransactWriteItems", 100, reasons=["None", reason])
        with pytest.raises(LimitExceeded, match=reason) as raised:
            with semaphore(["r36-a", "r36-b"], wait=0):
                pass  # pragma: no cover - never entered
    assert (raised.value.limit, raised.value.transient) == ("throughput", True)
