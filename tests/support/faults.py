"""Fault injection for tests, through botocore's event hooks only (dynasem is not patched).

``Faults(client)`` makes chosen requests fail the way DynamoDB and networks fail:

* ``throttle(op, n)``: answer n requests with ProvisionedThroughputExceededException (never sent);
* ``server_error(op, n, status=500)``: answer n requests with a 500/503 (never sent);
* ``connection_error(op, n)`` / ``read_timeout(op, n)``: raise the transport error (never sent);
* ``refuse(op, n, code=...)``: a 400 such as UnrecognizedClientException (never sent);
* ``cancel(op, n, reasons)``: a TransactionCanceledException with these cancellation reason
  codes (never sent);
* ``lose_response(op, n)``: the ambiguous case — the request IS sent and applied by the engine,
  then its response is replaced by a 500, before botocore decides whether to retry.

Each rule counts how often it fired (``.fired``). Use as a context manager to unhook.
Only requests naming the table configured when ``Faults`` was made are failed (the client is
shared by the worker: see ``tests.support.helpers.OwnRequests``).
``Faults(client, this_thread=True)`` fails only the requests sent by the thread that made it
(not this test's own heartbeats either).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from botocore.awsrequest import AWSResponse
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

from tests.support.helpers import OwnRequests


@dataclass
class Rule:
    kind: str
    operation: str
    remaining: int
    status: int = 500
    fired: int = 0
    after: int = 0  # let this many matching requests through first
    seen: int = field(default=0)

    def take(self, operation: str) -> bool:
        if operation != self.operation and self.operation != "*":
            return False
        self.seen += 1
        if self.seen <= self.after or self.remaining == 0:
            return False
        self.remaining -= 1
        self.fired += 1
        return True


class _Raw:
    """Just enough of a urllib3 response for botocore's parsers."""

    def __init__(self, body: bytes):
        self._body = body

    def stream(self, *args: Any, **kwargs: Any) -> Any:
        yield self._body


def _error_response(status: int, code: str, message: str, **extra: Any) -> AWSResponse:
    body = json.dumps(
        {"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": message, **extra}
    )
    return AWSResponse(
        url="http://fault.invalid/",
        status_code=status,
        headers={"x-amzn-RequestId": "fault", "Content-Type": "application/x-amz-json-1.0"},
        raw=_Raw(body.encode()),
    )


class Faults:
    def __init__(self, client: Any, *, this_thread: bool = False):
        self.client = client
        self.rules: list[Rule] = []
        self._ours = OwnRequests(this_thread=this_thread)
        events = client.meta.events
        events.register_first("before-send.dynamodb", self._before_send)
        events.register_first("needs-retry.dynamodb", self._needs_retry)

    def close(self) -> None:
        events = self.client.meta.events
        events.unregister("before-send.dynamodb", self._before_send)
        events.unregister("needs-retry.dynamodb", self._needs_retry)

    def __enter__(self) -> Faults:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _add(self, kind: str, operation: str, n: int, **kw: Any) -> Rule:
        rule = Rule(kind, operation, n, **kw)
        self.rules.append(rule)
        return rule

    def throttle(self, operation: str, n: int = 1, *, after: int = 0) -> Rule:
        return self._add("throttle", operation, n, status=400, after=after)

    def server_error(self, operation: str, n: int = 1, *, status: int = 500, after: int = 0):
        return self._add("server", operation, n, status=status, after=after)

    def connection_error(self, operation: str, n: int = 1, *, after: int = 0) -> Rule:
        return self._add("connection", operation, n, after=after)

    def read_timeout(self, operation: str, n: int = 1, *, after: int = 0) -> Rule:
        return self._add("timeout", operation, n, after=after)

    def refuse(self, operation: str, n: int = 1, *, code: str = "UnrecognizedClientException"):
        """A 400 the way AWS refuses bad credentials or permissions (never sent)."""
        rule = self._add("refuse", operation, n, status=400)
        rule.code = code  # type: ignore[attr-defined]
        return rule

    def cancel(self, operation: str, n: int = 1, *, reasons: list[str]) -> Rule:
        """A transaction cancelled for these reason codes ("None": an action that was not
        the cause), as DynamoDB answers one (never sent)."""
        rule = self._add("cancel", operation, n, status=400)
        rule.reasons = reasons  # type: ignore[attr-defined]
        return rule

    def lose_response(self, operation: str, n: int = 1, *, after: int = 0) -> Rule:
        return self._add("lose", operation, n, after=after)

    @property
    def fired(self) -> int:
        return sum(r.fired for r in self.rules)

    # -- hooks -------------------------------------------------------------------------------

    def _operation(self, request: Any) -> str:
        target = request.headers.get("X-Amz-Target", b"")
        if isinstance(target, bytes):
            target = target.decode()
        return target.rsplit(".", 1)[-1]

    def _before_send(self, request: Any, **kwargs: Any) -> Any:
        if not self._ours(request.body):
            return None
        operation = self._operation(request)
        for rule in self.rules:
            if rule.kind == "lose" or not rule.take(operation):
                continue
            if rule.kind == "throttle":
                return _error_response(
                    400, "ProvisionedThroughputExceededException", "injected throttling"
                )
            if rule.kind == "server":
                return _error_response(rule.status, "InternalServerError", "injected 5xx")
            if rule.kind == "refuse":
                return _error_response(400, rule.code, "injected refusal")  # type: ignore[attr-defined]
            if rule.kind == "cancel":
                codes = rule.reasons  # type: ignore[attr-defined]
                return _error_response(
                    400,
                    "TransactionCanceledException",
                    "Transaction cancelled, please refer cancellation reasons for specific "
                    f"reasons [{', '.join(codes)}]",
                    CancellationReasons=[
                        {"Code": c} if c == "None" else {"Code": c, "Message": f"injected {c}"}
                        for c in codes
                    ],
                )
            if rule.kind == "connection":
                raise EndpointConnectionError(endpoint_url=request.url)
            if rule.kind == "timeout":
                raise ReadTimeoutError(endpoint_url=request.url)
        return None

    def _needs_retry(self, response: Any, operation: Any, **kwargs: Any) -> None:
        if response is None or not self._ours(kwargs.get("request_dict", {}).get("body")):
            return
        http_response, parsed = response
        if http_response is None or http_response.status_code != 200:
            return
        for rule in self.rules:
            if rule.kind == "lose" and rule.take(operation.name):
                http_response.status_code = 500
                parsed.clear()
                parsed.update(
                    {
                        "Error": {"Code": "InternalServerError", "Message": "response lost"},
                        "ResponseMetadata": {"HTTPStatusCode": 500},
                    }
                )
                return
