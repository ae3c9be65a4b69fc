"""The simulated network: DynamoDB requests in flight, and UDP datagrams (hand-over pushes).

A request leaves its process and is applied to the database at a moment the network's rng
draws (it lands even if its process crashed or stalled meanwhile); its answer travels back
and resumes the caller, unless it is lost (the caller's read timeout ends the attempt).
Attempts are retried as dynasem's botocore client would (legacy mode, DynamoDB's schedule of
50, 100, 200 ms; :func:`client_config`), and the final error is the one botocore raises, so
``dynasem._storage.dynamodb`` maps it as in production (throttled, ambiguous or not).
"""

from __future__ import annotations

import collections
import functools
import random
from collections.abc import Callable
from typing import Any, Protocol

from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from .faults import Profile
from .scheduler import Scheduler, Waiter

ENDPOINT = "https://dynamodb.sim.invalid"
TABLE = "sim-locks"  # dynasem's table in a simulation (TABLE_NAME)
THROTTLE_CODE = "ProvisionedThroughputExceededException"
# What botocore's legacy mode retries (its _retry.json: throttling, 5xx, socket errors).
RETRIED_CODES = frozenset(
    {THROTTLE_CODE, "ThrottlingException", "RequestLimitExceeded", "InternalServerError"}
)


WRITES = frozenset({"UpdateItem", "PutItem", "DeleteItem", "TransactWriteItems"})


class Database(Protocol):
    """The simulated DynamoDB (``SimDynamoDB``, or :class:`moto_db.MotoDB` until it lands)."""

    def apply(self, operation: str, params: dict[str, Any]) -> dict[str, Any]: ...


def pascal(method: str) -> str:
    """``update_item`` -> ``UpdateItem`` (DynamoDB's operation names)."""
    return "".join(part.title() for part in method.split("_"))


@functools.cache
def client_config(quick: bool) -> tuple[int, float]:
    """(retries after the first attempt, read timeout) of dynasem's own client, read off
    a client :func:`dynasem._storage.dynamodb.build_client` builds (once per process)."""
    from dynasem._storage import dynamodb

    config: Any = dynamodb.build_client(quick).meta.config
    retries = config.retries or {}
    if "total_max_attempts" in retries:
        after_first = int(retries["total_max_attempts"]) - 1
    else:
        after_first = int(retries.get("max_attempts", 4))
    return after_first, float(config.read_timeout)


def written(params: dict[str, Any]) -> set[str]:
    """The resources (partition keys) a write request names."""
    if "TransactItems" in params:
        bodies = [next(iter(action.values())) for action in params["TransactItems"]]
    else:
        bodies = [params]
    keys = [body.get("Key") or body.get("Item") or {} for body in bodies]
    return {key["pk"]["S"] for key in keys if "pk" in key}


def client_error(code: str, status: int, operation: str) -> ClientError:
    response: Any = {
        "Error": {"Code": code, "Message": f"simulated {code}"},
        "ResponseMetadata": {"HTTPStatusCode": status, "RetryAttempts": 0},
    }
    return ClientError(response, operation)


class Requests:
    """Every DynamoDB request of the run: attempts, retries, faults, the database."""

    def __init__(self, sim: Any, db: Database, rng: random.Random, profile: Profile):
        self.sim, self.db, self.rng, self.profile = sim, db, rng, profile
        self.sched: Scheduler = sim.sched
        self.sent = 0
        self.tokens = 0  # ClientRequestTokens drawn (no rng draw: every other run unchanged)
        self.landed: set[Waiter] = set()  # writes applied, their callers still waiting

    def latency(self) -> float:
        """One way, seconds: a few ms mostly, a tail to a few hundred ms."""
        rng = self.rng
        one_way = 0.001 + rng.expovariate(1 / 0.003)
        if rng.random() < 0.01:
            one_way += rng.uniform(0.05, 0.4)
        return one_way

    def call(self, proc: Any, method: str, quick: bool, **params: Any) -> dict[str, Any]:
        """A client call of a simulated thread: its response, or botocore's error."""
        operation = pascal(method)
        if operation == "TransactWriteItems" and "ClientRequestToken" not in params:
            # botocore's before-parameter-build hook (handlers.generate_idempotent_uuid; the
            # member is an idempotencyToken in its service model) fills it in once per call:
            # its own re-sends carry the same one, and DynamoDB replays an applied one.
            self.tokens += 1
            params = {**params, "ClientRequestToken": f"sim-{self.tokens:032x}"}
        retries, read_timeout = client_config(quick)
        attempt = 0
        while True:
            kind, value = self._attempt(proc, operation, params, read_timeout, attempt)
            if kind == "ok":
                return value  # type: ignore[no-any-return]
            if attempt < retries and self._retried(kind, value):
                attempt += 1
                self.sched.sleep(0.05 * 2 ** (attempt - 1))
                continue
            raise self._final(kind, value, attempt)

    @staticmethod
    def _retried(kind: str, value: Any) -> bool:
        if kind in ("timeout", "unsent"):
            return True
        error = value.response.get("Error", {}).get("Code", "")
        status = value.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return error in RETRIED_CODES or status >= 500

    @staticmethod
    def _final(kind: str, value: Any, attempt: int) -> Exception:
        if kind == "timeout":
            return ReadTimeoutError(endpoint_url=ENDPOINT)
        if kind == "unsent":
            return EndpointConnectionError(endpoint_url=ENDPOINT)
        value.response.setdefault("ResponseMetadata", {})["RetryAttempts"] = attempt
        return value  # type: ignore[no-any-return]

    def _attempt(
        self,
        proc: Any,
        operation: str,
        params: dict[str, Any],
        read_timeout: float,
        attempt: int = 0,
    ) -> tuple[str, Any]:
        me = self.sched.me()
        interrupts = self.sim.interrupts
        tag = interrupts.sending(proc, operation in WRITES, params, attempt)  # may raise it
        from dynasem._storage import dynamodb

        dynamodb.count_send()  # as botocore's request-created event counts each attempt
        self.sent += 1
        self.sim.monitor.request(proc, me)
        fault = self.sim.request_fault(proc, write=operation in WRITES)
        if fault == "unsent":
            dynamodb.count_unsent()  # as a needs-retry event of a caught connect error does
            self.sim.record("unsent", proc, operation, params)
            self.sim.interrupts.failed(proc, tag)
            self.sched.sleep(self.latency())
            return "unsent", None
        waiter = Waiter(me)
        apply = functools.partial(self._apply, proc, waiter, operation, params, fault, tag)
        sent = self.sched.now
        self.sched.at(self.latency(), apply)
        answered = self.sched.block(waiter, read_timeout)
        if waiter in self.landed:
            self.landed.discard(waiter)
            if not answered:  # applied, its answer lost: the caller knew nothing till now
                self.sim.monitor.timed_out(sent, written(params))
        if not answered:
            self.sim.interrupts.failed(proc, tag)
            return "timeout", None
        return waiter.value  # type: ignore[no-any-return]

    def _apply(
        self,
        proc: Any,
        waiter: Waiter,
        operation: str,
        params: dict[str, Any],
        fault: str | None,
        tag: Any = None,
    ) -> None:
        """The request reaches the database (in the hub: atomic), and its answer leaves."""
        result: tuple[str, Any]
        if fault == "dropped":
            self.sim.record("dropped", proc, operation, params)
            self.sim.interrupts.dropped(proc, tag)
            return  # lost on its way: never applied, never answered
        if fault == "throttled":
            result = ("error", client_error(THROTTLE_CODE, 400, operation))
        elif fault == "error_before":
            result = ("error", client_error("InternalServerError", 500, operation))
        else:
            result = self.sim.apply(proc, operation, params)
            if operation in WRITES and result[0] == "ok" and not waiter.timed_out:
                self.landed.add(waiter)
            if fault == "error_after":
                result = ("error", client_error("InternalServerError", 500, operation))
        self.sim.record("apply", proc, operation, params, result, fault)
        write = operation in WRITES
        if self.sim.interrupts.applied(proc, waiter, write, result, tag, params):
            return  # a Ctrl-C as the answer was on its way: never read
        if fault == "lost":
            return  # applied; the answer never comes
        answer = functools.partial(self._answer, proc, waiter, result, write)
        self.sched.at(self.latency(), answer)

    def _answer(self, proc: Any, waiter: Waiter, result: tuple[str, Any], write: bool) -> None:
        if self.sim.cut_off(proc) or self.sim.deaf(proc):
            self.sim.record("cut", proc, "answer")
            return  # applied; its answer dropped on the way back
        if self.sched.resolve(waiter, result) and write:
            self.sim.interrupts.answered(proc, waiter)
            self.sim.answered(proc)


class SimClient:
    """What ``dynamodb.get_client()`` returns in a simulated process: botocore's client
    methods (``update_item(**request)``...), each a :meth:`Requests.call`."""

    def __init__(self, requests: Requests, proc: Any, quick: bool):
        self._requests, self._proc, self._quick = requests, proc, quick

    def __getattr__(self, method: str) -> Callable[..., dict[str, Any]]:
        if method.startswith("_"):
            raise AttributeError(method)
        return functools.partial(self._requests.call, self._proc, method, self._quick)


class UdpSocket:
    """A UDP socket of a simulated process (``socket.socket(AF_INET, SOCK_DGRAM)``)."""

    def __init__(self, net: Datagrams, proc: Any):
        self.net, self.proc = net, proc
        self.address: tuple[str, int] | None = None
        self.inbox: collections.deque[tuple[bytes, tuple[str, int]]] = collections.deque()
        self.readers: list[Waiter] = []
        self.closed = False
        self.timeout: float | None = None

    def settimeout(self, value: float | None) -> None:
        self.timeout = value

    def bind(self, address: tuple[str, int]) -> None:
        self.address = self.net.bind(self, address[0])

    def getsockname(self) -> tuple[str, int]:
        if self.address is None:
            return ("0.0.0.0", 0)
        return self.address

    def recvfrom(self, size: int) -> tuple[bytes, tuple[str, int]]:
        sched = self.net.sched
        while not self.inbox:
            if self.closed:
                raise OSError("closed")
            waiter = Waiter(sched.me())
            self.readers.append(waiter)
            try:
                answered = sched.block(waiter, self.timeout)
            finally:  # timed out, or interrupted: no reader any more
                if waiter in self.readers:
                    self.readers.remove(waiter)
            if not answered and not self.inbox:
                raise TimeoutError("timed out")
        data, sender = self.inbox.popleft()
        return data[:size], sender

    def sendto(self, data: bytes, address: tuple[str, int]) -> int:
        if self.closed:
            raise OSError("closed")
        self.net.send(self.proc, data, address)
        return len(data)

    def deliver(self, data: bytes, sender: tuple[str, int]) -> None:
        if self.closed or self.proc.dead:
            return
        self.inbox.append((data, sender))
        while self.readers:
            if self.net.sched.resolve(self.readers.pop(0), True):
                break

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.net.unbind(self)
            for waiter in self.readers:
                self.net.sched.resolve(waiter, error=OSError("closed"))

    def __enter__(self) -> UdpSocket:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Datagrams:
    """UDP between simulated processes: a loopback address reaches the sender's host only;
    another address, the host that has it. Lost, doubled or late as the profile says."""

    def __init__(self, sim: Any, rng: random.Random, profile: Profile):
        self.sim, self.rng, self.profile = sim, rng, profile
        self.sched: Scheduler = sim.sched
        self.bound: dict[tuple[str, str, int], UdpSocket] = {}
        self._ports = 40000
        self.sent = self.delivered = 0

    def bind(self, sock: UdpSocket, ip: str) -> tuple[str, int]:
        self._ports += 1
        self.bound[(self._where(sock.proc, ip), ip, self._ports)] = sock
        return ip, self._ports

    def unbind(self, sock: UdpSocket) -> None:
        for key, bound in list(self.bound.items()):
            if bound is sock:
                del self.bound[key]

    def _where(self, proc: Any, ip: str) -> str:
        return proc.host.name if ip.startswith("127.") else "net"

    def send(self, proc: Any, data: bytes, address: tuple[str, int]) -> None:
        self.sent += 1
        target = (self._where(proc, address[0]), address[0], address[1])
        fault = self.sim.push_fault()
        self.sim.record("push", proc, f"{address[0]}:{address[1]}", fault or "")
        if fault == "push_lost":
            return
        copies = 2 if fault == "push_twice" else 1
        for _ in range(copies):
            delay = 0.0002 + self.rng.expovariate(1 / 0.0005)
            if fault == "push_late":
                delay += self.rng.uniform(0.2, 3.0)
            sender = ("127.0.0.1", 0)
            self.sched.at(delay, functools.partial(self._arrive, target, data, sender))

    def _arrive(self, target: tuple[str, str, int], data: bytes, sender: tuple[str, int]) -> None:
        sock = self.bound.get(target)
        if sock is not None:
            self.delivered += 1
            sock.deliver(data, sender)

    def drop(self, proc: Any) -> None:
        """``proc`` crashed: its sockets are gone with it."""
        for sock in [s for s in self.bound.values() if s.proc is proc]:
            sock.closed = True
            self.unbind(sock)
