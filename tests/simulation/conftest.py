"""Recording what dynasem asks DynamoDB Local and what it answers, to replay on the simulated
DynamoDB (tests/simulation/test_differential.py)."""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from botocore.client import BaseClient
from botocore.exceptions import ClientError

# Requests that report the capacity they consumed when asked: the recording asks every one.
CAPACITY = frozenset(
    {"GetItem", "PutItem", "UpdateItem", "DeleteItem", "Query", "Scan", "BatchGetItem"}
    | {"TransactWriteItems"}
)


@dataclass
class Call:
    """One request as sent and its answer (``error``: a ClientError's response)."""

    operation: str
    params: dict[str, Any]
    response: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


@dataclass
class Recording:
    """Every DynamoDB request of the process, in the order DynamoDB Local applied them: each
    is sent under one lock, so threads (a waiter, a heartbeat) take turns."""

    calls: list[Call] = field(default_factory=list)
    on: bool = True
    lock: threading.RLock = field(default_factory=threading.RLock)

    def send(self, client: BaseClient, original: Any, operation: str, params: Any) -> Any:
        if not self.on or client.meta.service_model.service_name != "dynamodb":
            return original(client, operation, params)
        sent = copy.deepcopy(dict(params))
        if operation in CAPACITY:
            sent.setdefault("ReturnConsumedCapacity", "INDEXES")
        with self.lock:
            call = Call(operation, copy.deepcopy(sent))
            self.calls.append(call)
            try:
                response = original(client, operation, sent)
            except ClientError as exc:
                call.error = copy.deepcopy(dict(exc.response))
                raise
            call.response = copy.deepcopy(dict(response))
            return response


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recording]:
    """Records every DynamoDB request from here on (for the whole test: start it after the
    table is made, as the fixture order does)."""
    found = Recording()
    original = BaseClient._make_api_call  # type: ignore[attr-defined]

    def send(client: BaseClient, operation: str, params: Any) -> Any:
        return found.send(client, original, operation, params)

    monkeypatch.setattr(BaseClient, "_make_api_call", send)
    yield found
    found.on = False
