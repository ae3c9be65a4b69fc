"""A stand-in for the simulated DynamoDB (``dynamodb.SimDynamoDB``) until it lands: moto's
DynamoDB, in process, through a boto3 low-level client. moto evaluates every condition and
update expression and answers synchronously, one request at a time, so a request applied by
the runtime is atomic and the same requests in the same order get the same answers.

Same shape as ``SimDynamoDB(rng, now, profile)``: :meth:`MotoDB.apply` takes an operation
(``"UpdateItem"`` or boto3's ``"update_item"``) and its request as boto3's low-level client
takes it (the wire format), returns the response dict, and raises botocore's ``ClientError``
as DynamoDB answers a refusal. It never throttles, never answers late and never loses an
answer: the runtime's network does that. moto reads real clocks inside (request ids,
timestamps nobody here reads); that is the database's time, not a simulated host's.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Callable
from typing import Any

import boto3
from botocore.config import Config
from moto import mock_aws

from .network import TABLE


def snake(operation: str) -> str:
    """``UpdateItem`` -> ``update_item`` (boto3's method names)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", operation).lower()


class MotoDB:
    """moto's DynamoDB (empty: the runtime makes dynasem's table with a CreateTable)."""

    def __init__(self, rng: random.Random, now: Callable[[], float], profile: str = "moto"):
        self.rng, self.now, self.profile = rng, now, profile
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            os.environ.setdefault(name, "simulation")
        self._mock = mock_aws()
        self._mock.start()
        self._client = boto3.session.Session().client(
            "dynamodb",
            region_name="us-east-1",
            config=Config(retries={"total_max_attempts": 1}, parameter_validation=False),
        )
        self.requests = 0

    def apply(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        """One request, applied now; its response, or botocore's ClientError."""
        self.requests += 1
        response: dict[str, Any] = getattr(self._client, snake(operation))(**params)
        return response

    def peek(self, key: dict[str, Any]) -> dict[str, Any] | None:
        """The item at ``key`` as stored (low-level), read from moto's backend without a
        request: what the runtime's monitor reads after each write (a GetItem through
        boto3 and moto's serializers costs as much as the write)."""
        from moto.core import DEFAULT_ACCOUNT_ID  # type: ignore[attr-defined]
        from moto.dynamodb.models import dynamodb_backends

        backend = dynamodb_backends[DEFAULT_ACCOUNT_ID]["us-east-1"]
        item = backend.get_item(TABLE, key)
        return None if item is None else dict(item.to_json()["Attributes"])

    def client(self) -> Any:
        """A boto3-like client of this database (no network, no faults)."""
        return self._client

    def expire_ttl(self, deleted: list[tuple[str, str]] | None = None) -> int:
        """Delete the items whose TTL (``expires``, epoch seconds) is past by ``now()``, as
        DynamoDB's sweep eventually does; how many (their keys appended to ``deleted``)."""
        gone = 0
        for item in self.snapshot():
            expires = item.get("expires", {}).get("N")
            if expires is not None and float(expires) < self.now():
                key = {"pk": item["pk"], "sk": item["sk"]}
                self._client.delete_item(TableName=TABLE, Key=key)
                gone += 1
                if deleted is not None:
                    deleted.append((item["pk"]["S"], item["sk"]["S"]))
        return gone

    def snapshot(self) -> list[dict[str, Any]]:
        """Every item of the table, low-level, in key order."""
        items: list[dict[str, Any]] = []
        start: dict[str, Any] | None = None
        while True:
            request: dict[str, Any] = {"TableName": TABLE, "ConsistentRead": True}
            if start:
                request["ExclusiveStartKey"] = start
            page = self._client.scan(**request)
            items += page.get("Items", [])
            start = page.get("LastEvaluatedKey")
            if not start:
                break
        return sorted(items, key=lambda i: (i["pk"]["S"], i["sk"]["S"]))

    def close(self) -> None:
        self._mock.stop()
