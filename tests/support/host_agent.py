"""A Django process on one of the test hosts of ``tests/support/netns.py``, driven by the test.

The server side runs as ``python -m tests.support.host_agent --netns NS --hostname H --endpoint URL
--table T [--push ADDR]``: it enters the host's namespaces first, sets Django up with
``tests.support.settings`` (``ENDPOINT_URL`` pointing at DynamoDB Local through the gateway,
``PUSH`` at the host's own address), then takes commands, one JSON object per line on stdin, and
answers each on stdout with the command's ``rid``. Commands run in threads of their own, so
an acquire that waits does not hold up the next command. Lines without a ``rid`` are events
(``{"event": "lost", ...}``).

:class:`Agent` is the test's side: it starts the process (with libfaketime's environment,
when the host's wall clock is to be shifted) and sends commands.

Times in answers: ``mono`` values are ``time.monotonic()`` (CLOCK_MONOTONIC, one clock for
every namespace on the machine, so comparable between hosts and with the test), ``wall``
values are the process's own (possibly shifted) ``time.time()``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import queue
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------
# The process on the host
# ---------------------------------------------------------------------------------------------


def _deadline(held: Any) -> float:
    """``held``'s trusted deadline on the clock of every ``mono`` here (CLOCK_MONOTONIC):
    dynasem reads CLOCK_BOOTTIME, ahead of it by every second the host ever slept."""
    from dynasem import _clock as clock

    return held._deadline - clock.monotonic() + time.monotonic()


class Server:
    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.out_lock = threading.Lock()
        self.held: dict[str, Any] = {}
        self.calls: Counter[str] = Counter()
        self.pushes: list[dict[str, Any]] = []  # every push this process tried to send
        self.signalled: dict[str, float] = {}  # token -> when lock_lost arrived (mono)
        self.warnings: list[str] = []
        self.override: Any = None
        self.patient_turn: Any = None

    # -- plumbing ----------------------------------------------------------------------------

    def emit(self, message: dict[str, Any]) -> None:
        line = json.dumps(message, default=str)
        with self.out_lock:
            self.out.write(line + "\n")
            self.out.flush()

    def setup(self) -> None:
        import logging

        from dynasem._engine import push as wakeup
        from dynasem._storage import dynamodb
        from dynasem.signals import lock_lost

        real_get_client = dynamodb.get_client
        hooked: list[Any] = []

        def count(model: Any, **kwargs: Any) -> None:
            self.calls[model.name] += 1

        def get_client(*, quick: bool = False) -> Any:  # count every request, of every client
            client = real_get_client(quick=quick)
            if not any(c is client for c in hooked):
                client.meta.events.register("before-call.dynamodb", count)
                hooked.append(client)
            return client

        from dynasem._storage import dynamodb as table_client
        from dynasem._storage import records as stored

        # 1 s expires buckets (not 15 minutes): the tests reap in real time, and a reap
        # finds a row once its bucket has passed.
        stored.BUCKET_S = 1

        dynamodb.get_client = get_client  # type: ignore[assignment]
        table_client.get_client = get_client  # type: ignore[assignment]

        real_push = wakeup.push

        def push(address: Any, resource: str, token: str, item: Any, **terms: Any) -> bool:
            sent = real_push(address, resource, token, item, **terms)
            self.pushes.append({"to": address, "resource": resource, "sent": sent})
            return sent

        wakeup.push = push  # type: ignore[assignment]

        def on_lost(sender: Any, token: str, **kwargs: Any) -> None:
            self.signalled.setdefault(token, time.monotonic())

        lock_lost.connect(on_lost, weak=False)

        server = self

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                server.warnings.append(record.getMessage())

        keep = Keep(level=logging.WARNING)
        logging.getLogger("dynasem").addHandler(keep)

    def run(self, lines: IO[str]) -> None:
        for line in lines:
            if not line.strip():
                continue
            command = json.loads(line)
            if command.get("op") == "exit":
                self.emit({"rid": command.get("rid"), "ok": True})
                return
            threading.Thread(target=self.serve, args=(command,), daemon=True).start()

    def serve(self, command: dict[str, Any]) -> None:
        rid = command.pop("rid", None)
        op = command.pop("op")
        try:
            answer = getattr(self, f"op_{op}")(**command)
        except Exception as exc:
            answer = {
                "error": type(exc).__name__,
                "message": str(exc),
                "reason": getattr(exc, "reason", None),
                "trace": traceback.format_exc(),
            }
        answer["rid"] = rid
        self.emit(answer)

    # -- commands ----------------------------------------------------------------------------

    def op_configure(
        self,
        table: str | None = None,
        push: str | None = "keep",
        skew: float | None = None,
        patient: bool | None = None,
    ) -> dict[str, Any]:
        """Settings for what follows: the table, ``PUSH``, ``CLOCK_SKEW``; ``patient``: a
        queued waiter's paced looks are 20 s away (only a push brings it a hand-over)."""
        from django.test import override_settings

        from dynasem._engine import push as wakeup
        from dynasem._engine import queue as queueing
        from dynasem.conf import settings

        raw = dict(settings.raw)
        if table is not None:
            raw["TABLE_NAME"] = table
        if push != "keep":
            raw["PUSH"] = push
        if skew is not None:
            raw["CLOCK_SKEW"] = skew
        if self.override is not None:
            self.override.disable()
        self.override = override_settings(DYNASEM=raw)
        self.override.enable()
        if patient is not None:
            if self.patient_turn is None:
                self.patient_turn = queueing.Pace.turn_in
            queueing.Pace.turn_in = (  # type: ignore[method-assign]
                (lambda *a, **k: 20.0) if patient else self.patient_turn
            )
        queueing.queued_recently.clear()
        queueing.pushed_recently.clear()
        listening = wakeup.available()
        address = wakeup._listener.address if listening and wakeup._listener else None
        return {"listening": listening, "address": address}

    def op_clock(self) -> dict[str, Any]:
        import socket

        from dynasem._engine import push as wakeup

        return {
            "wall": time.time(),
            "mono": time.monotonic(),
            "hostname": socket.gethostname(),
            "host_id": wakeup.HOST_ID,
            "pid": os.getpid(),
        }

    def op_acquire(
        self,
        id: str,
        resource: str,
        lease: float,
        wait: float = 0,
        user: str | None = None,
        fair: bool | None = None,
    ) -> dict[str, Any]:
        from dynasem import semaphore
        from dynasem._engine import queue as queueing

        before = Counter(self.calls)
        pushed_before = queueing.pushed_recently.get(resource)
        asked = time.monotonic()
        held = semaphore(resource, lease=lease, wait=wait, user=user or id, fair=fair).acquire()
        start, wall = time.monotonic(), time.time()
        self.held[id] = held
        return {
            "fence": held.fence,
            "token": held.token,
            "asked": asked,
            "start": start,
            "wall": wall,
            "deadline": _deadline(held),
            "expires_ms": held._expires_ms,
            "calls": dict(Counter(self.calls) - before),
            "pushed": queueing.pushed_recently.get(resource) != pushed_before,
        }

    def op_watch(self, id: str, poll: float = 0.005) -> dict[str, Any]:
        """Watch a hold as code inside its block would: ``held.lost`` every ``poll`` s. When
        it turns True, call ``renew()`` (it must raise LockLost without a request) and emit
        an event with the last moment ``held.lost`` was still False."""
        held = self.held[id]

        def watch() -> None:
            last_trusted = None
            while True:
                at = time.monotonic()
                if held.lost:
                    break
                last_trusted = at  # held.lost read the clock after ``at``: trusted at ``at``
                time.sleep(poll)
            first_lost = time.monotonic()
            try:
                held.renew()  # what the block's code gets when it asks: LockLost, at once
                raised = None
            except Exception as exc:
                raised = type(exc).__name__
            self.emit(
                {
                    "event": "lost",
                    "id": id,
                    "last_trusted": last_trusted,
                    "first_lost": first_lost,
                    "renew_raised": raised,
                    "renew_answered": time.monotonic(),
                    "deadline": _deadline(held),
                    "expires_ms": held._expires_ms,
                    "signalled": self.signalled.get(held.token),
                }
            )

        threading.Thread(target=watch, daemon=True).start()
        return {"deadline": _deadline(held)}

    def op_renew(self, id: str) -> dict[str, Any]:
        held = self.held[id]
        held.renew()
        return {"deadline": _deadline(held), "expires_ms": held._expires_ms}

    def op_abandon(self, id: str) -> dict[str, Any]:
        """Stop renewing the hold and never release it: a holder that died or hangs."""
        from dynasem.testing import abandon

        held = self.held[id]
        abandon(held)
        return {"deadline": _deadline(held), "expires_ms": held._expires_ms}

    def op_state(self, id: str) -> dict[str, Any]:
        held = self.held[id]
        return {
            "lost": held.lost,
            "deadline": _deadline(held),
            "mono": time.monotonic(),
            "signalled": self.signalled.get(held.token),
        }

    def op_fenced_put(self, id: str, key: str) -> dict[str, Any]:
        from tests.support.fencing import FencedWriteRefused, fenced_put

        held = self.held[id]
        try:
            fenced_put(key, f"written by {id}", held.fence)
        except FencedWriteRefused:
            return {"result": "refused", "fence": held.fence}
        return {"result": "accepted", "fence": held.fence}

    def op_release(self, id: str) -> dict[str, Any]:
        held = self.held.pop(id)
        pushes = len(self.pushes)
        sent = time.monotonic()
        held.release()  # LockLost goes back as an error
        return {"sent": sent, "done": time.monotonic(), "pushes": self.pushes[pushes:]}

    def op_reap(self) -> dict[str, Any]:
        from dynasem._operators import reaper as reaping

        result = reaping.reap()
        return {"deleted": result.deleted, "found": result.found, "wall": time.time()}

    def op_udp(self, host: str, port: int, data: str) -> dict[str, Any]:
        import socket

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(base64.b64decode(data), (host, port))
        return {"sent": True}

    def op_warnings(self) -> dict[str, Any]:
        """The dynasem warnings logged since the last call; the next bad signature is logged
        again at once (they are logged at most once a minute)."""
        from dynasem._engine import push as wakeup

        said, self.warnings = self.warnings, []
        wakeup._mac_warned_at = -float("inf")
        return {"warnings": said}

    def op_loop(
        self,
        resource: str,
        rounds: int,
        hold: float,
        lease: float,
        wait: float,
        user: str,
        pause: float = 0.0,
    ) -> dict[str, Any]:
        """``rounds`` holds of ``resource`` one after the other; each hold's interval (from
        inside the block), fence, requests and whether a push brought it."""
        from dynasem import semaphore
        from dynasem._engine import queue as queueing

        holds = []
        for _ in range(rounds):
            before = Counter(self.calls)
            pushed_before = queueing.pushed_recently.get(resource)
            with semaphore(resource, lease=lease, wait=wait, user=user) as held:
                start = time.monotonic()
                time.sleep(hold)
                end = time.monotonic()
            holds.append(
                {
                    "start": start,
                    "end": end,
                    "fence": held.fence,
                    "calls": dict(Counter(self.calls) - before),
                    "pushed": queueing.pushed_recently.get(resource) != pushed_before,
                    "user": user,
                }
            )
            time.sleep(pause)
        return {"holds": holds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--netns", required=True)
    parser.add_argument("--hostname", required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--push", default=None)
    args = parser.parse_args(argv)

    from tests.support import netns

    netns.die_with_parent()
    netns.enter(args.netns, args.hostname)  # before any socket or thread (and HOST_ID)
    netns.sleep_despite_faketime()
    if args.push:
        os.environ["DYNASEM_TEST_PUSH"] = args.push
    from tests.support.workers import setup_django

    setup_django(args.endpoint, args.table)
    server = Server(sys.stdout)
    server.setup()
    server.emit({"event": "ready", **server.op_clock()})
    server.run(sys.stdin)
    return 0


# ---------------------------------------------------------------------------------------------
# The test's side
# ---------------------------------------------------------------------------------------------


class AgentError(AssertionError):
    pass


class Agent:
    """One agent process on a host (``netns.Host``), started at once; ``wait_ready()`` waits
    until it is set up. ``call(op, **kwargs)`` sends a command and waits for its answer,
    ``send`` + ``reply`` split the two."""

    def __init__(
        self,
        host: Any,
        *,
        endpoint: str,
        table: str,
        push: str | None,
        log_path: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.host = host
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in close()
        cmd = [
            sys.executable, "-m", "tests.support.host_agent", "--netns", host.netns,
            "--hostname", host.hostname, "--endpoint", endpoint, "--table", table,
        ]  # fmt: skip
        if push:
            cmd += ["--push", push]
        self.proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
            env={**os.environ, **(env or {})},
        )
        self._replies: dict[str, queue.Queue[dict[str, Any]]] = {}
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._lock = threading.Lock()
        self._seq = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.ready: dict[str, Any] = {}

    def wait_ready(self, timeout: float = 60) -> Agent:
        """Wait for the process to be set up (its ``ready`` event: clock, hostname, host id)."""
        if not self.ready:
            self.ready = self.event("ready", timeout=timeout)
        return self

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                continue
            rid = message.get("rid")
            if rid is None:
                self._events.put(message)
            else:
                self._box(rid).put(message)

    def _box(self, rid: str) -> queue.Queue[dict[str, Any]]:
        with self._lock:
            return self._replies.setdefault(rid, queue.Queue())

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def send(self, op: str, **kwargs: Any) -> str:
        with self._lock:
            self._seq += 1
            rid = f"{op}-{self._seq}"
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"rid": rid, "op": op, **kwargs}) + "\n")
        self.proc.stdin.flush()
        return rid

    def reply(self, rid: str, timeout: float = 30) -> dict[str, Any]:
        try:
            return self._box(rid).get(timeout=timeout)
        except queue.Empty:
            code = self.proc.poll()
            state = "alive" if code is None else f"exited with {code}"
            raise AgentError(
                f"host {self.host.name}: no answer to {rid} within {timeout:g} s (agent "
                f"{state}); its log:\n{self.log_tail()}"
            ) from None

    def answered(self, rid: str) -> bool:
        return not self._box(rid).empty()

    def call(self, op: str, timeout: float = 30, **kwargs: Any) -> dict[str, Any]:
        """Send ``op`` and return its answer; an error answer raises ``AgentError`` (use
        ``send``/``reply`` to look at errors)."""
        answer = self.reply(self.send(op, **kwargs), timeout)
        if "error" in answer:
            raise AgentError(
                f"host {self.host.name}: {op} raised {answer['error']}: {answer['message']}\n"
                f"{answer.get('trace', '')}"
            )
        return answer

    def event(self, kind: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                message = self._events.get(timeout=max(0.0, left))
            except queue.Empty:
                raise AgentError(
                    f"host {self.host.name}: no {kind!r} event within {timeout:g} s; its log:\n"
                    f"{self.log_tail()}"
                ) from None
            if message.get("event") == kind:
                return message

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("exit")
                self.proc.wait(5)
            except Exception:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


if __name__ == "__main__":
    sys.exit(main())
