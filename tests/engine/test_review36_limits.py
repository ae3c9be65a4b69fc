"""Review 36 (bad input and DynamoDB's limits), the semaphore's arguments: each refused by
its own name, before any request."""

from __future__ import annotations

from typing import Any

import pytest

from dynasem import semaphore


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
