"""Shared plumbing of the comparative benchmarks (uncontended, contended, many_resources,
reap_and_list): the engine and tables, request counting, statistics, the results table, the
target lines and docs/BENCHMARKS.md.

Every script starts its own DynamoDB Local (``tests.support.dynamodb_local``), configures Django
with ``tests.support.settings`` (``LEASE`` 10 s, ``CLOCK_SKEW`` 0.5 s) exactly as the race tests'
worker processes do (``tests.support.workers.setup_django``), and runs dynasem, the peer
(``python-dynamodb-lock``) and, where there is one, a raw-boto3 floor against that one engine
in one run.

Requests are counted with botocore event hooks: ``before-call.dynamodb`` (one per API call,
whatever botocore retries), ``before-send.dynamodb`` (every HTTP attempt, so retries show) and
``after-call.dynamodb`` (``Count``/``ScannedCount`` of Query and Scan, items of GetItem).
Requests sent from a lock library's heartbeat thread (dynasem: ``dynasem-heartbeat...``;
python-dynamodb-lock: ``DynamoDBLockClient-HS-...``) are counted apart from the rest.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import multiprocessing as mp
import os
import platform
import queue
import re
import shlex
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

DOC = REPO_ROOT / "docs" / "BENCHMARKS.md"
SECTIONS = (
    "uncontended",
    "cycle_profile",
    "contended",
    "many_resources",
    "reap_and_list",
    "cost",
    "telemetry",
)
PEER = "python-dynamodb-lock"

# The peer's configuration, the same in every script: a lease like dynasem's under
# tests.support.settings (10 s), a heartbeat about as often as dynasem renews ((10 - 0.5) / 3 s).
PEER_LEASE = timedelta(seconds=10)
PEER_HEARTBEAT = timedelta(seconds=3)
PEER_SAFE = timedelta(seconds=7)
PEER_EXPIRY = timedelta(hours=1)

# The machine's load when this script started (before its own engine and workers).
START_LOAD = "?"
with contextlib.suppress(OSError):
    START_LOAD = " ".join(f"{x:.1f}" for x in os.getloadavg())

DUMMY = {
    "region_name": "us-east-1",
    "aws_access_key_id": "dummy",
    "aws_secret_access_key": "dummy",
}

for _key, _value in (
    ("AWS_ACCESS_KEY_ID", "dummy"),
    ("AWS_SECRET_ACCESS_KEY", "dummy"),
    ("AWS_DEFAULT_REGION", "us-east-1"),
):
    os.environ.setdefault(_key, _value)


# ---------------------------------------------------------------------------------------------
# Request counting
# ---------------------------------------------------------------------------------------------

HEARTBEAT_THREADS = ("dynasem-heartbeat", "DynamoDBLockClient-HS")


def _category() -> str:
    name = threading.current_thread().name
    return "heartbeat" if name.startswith(HEARTBEAT_THREADS) else "work"


class RequestCounter:
    """Counts requests by (category, operation) on every client it is attached to."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: Counter[tuple[str, str]] = Counter()
        self.refused: Counter[tuple[str, str]] = Counter()  # ConditionalCheckFailed answers
        self.sends = 0  # HTTP attempts (botocore retries included)
        self.items_read = 0  # ScannedCount of Query/Scan, items returned by GetItem
        self.items_returned = 0  # Count of Query/Scan (after filters)

    def attach(self, client: Any) -> Any:
        events = client.meta.events
        events.register("before-call.dynamodb", self._before_call)
        events.register("before-send.dynamodb", self._before_send)
        events.register("after-call.dynamodb", self._after_call)
        return client

    def _before_call(self, model: Any, **kwargs: Any) -> None:
        key = (_category(), model.name)
        with self._lock:
            self.calls[key] += 1

    def _before_send(self, **kwargs: Any) -> None:
        with self._lock:
            self.sends += 1

    def _after_call(self, parsed: Any = None, model: Any = None, **kwargs: Any) -> None:
        if not isinstance(parsed, dict) or model is None:
            return
        with self._lock:
            code = (parsed.get("Error") or {}).get("Code")
            if code in ("ConditionalCheckFailedException", "TransactionCanceledException"):
                self.refused[(_category(), model.name)] += 1
            if model.name in ("Query", "Scan"):
                self.items_read += int(parsed.get("ScannedCount", parsed.get("Count", 0)))
                self.items_returned += int(parsed.get("Count", 0))
            elif model.name == "GetItem" and "Item" in parsed:
                self.items_read += 1
                self.items_returned += 1

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()
            self.refused.clear()
            self.sends = self.items_read = self.items_returned = 0

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "calls": {f"{c}:{op}": n for (c, op), n in self.calls.items()},
                "refused": {f"{c}:{op}": n for (c, op), n in self.refused.items()},
                "sends": self.sends,
                "items_read": self.items_read,
                "items_returned": self.items_returned,
            }


def merge(snapshots: Iterable[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {
        "calls": Counter(),
        "refused": Counter(),
        "sends": 0,
        "items_read": 0,
        "items_returned": 0,
    }
    for snap in snapshots:
        total["calls"].update(snap["calls"])
        total["refused"].update(snap["refused"])
        for key in ("sends", "items_read", "items_returned"):
            total[key] += snap[key]
    total["calls"] = dict(total["calls"])
    total["refused"] = dict(total["refused"])
    return total


def diff(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """What a counter counted between two snapshots."""
    calls = Counter(after["calls"])
    calls.subtract(before["calls"])
    refused = Counter(after["refused"])
    refused.subtract(before["refused"])
    return {
        "calls": {k: n for k, n in calls.items() if n},
        "refused": {k: n for k, n in refused.items() if n},
        **{k: after[k] - before[k] for k in ("sends", "items_read", "items_returned")},
    }


def work_calls(snap: dict[str, Any]) -> int:
    return sum(n for k, n in snap["calls"].items() if k.startswith("work:"))


def heartbeat_calls(snap: dict[str, Any]) -> int:
    return sum(n for k, n in snap["calls"].items() if k.startswith("heartbeat:"))


def all_calls(snap: dict[str, Any]) -> int:
    return sum(snap["calls"].values())


def retries(snap: dict[str, Any]) -> int:
    return max(0, snap["sends"] - all_calls(snap))


def by_operation(snap: dict[str, Any], per: float = 1.0, category: str = "work") -> str:
    """``UpdateItem 1.50 (0.50 refused) + GetItem 0.50`` (per ``per`` units), largest first;
    "refused": answered ConditionalCheckFailed (or a cancelled transaction)."""
    ops = {k.split(":", 1)[1]: n for k, n in snap["calls"].items() if k.startswith(category + ":")}
    if not ops:
        return "-"
    refused = snap.get("refused") or {}

    def one(op: str, n: int) -> str:
        text = f"{op} {n / per:.2f}"
        r = refused.get(f"{category}:{op}", 0)
        if not r:
            return text
        return text + (f" ({r / per:.2f} refused)" if r / per >= 0.005 else f" ({r} refused)")

    return " + ".join(one(op, n) for op, n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])))


# ---------------------------------------------------------------------------------------------
# Engine, Django, tables, clients
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def engine() -> Iterator[Any]:
    """A DynamoDB Local of our own for this script."""
    from tests.support.dynamodb_local import DynamoDBLocal

    with DynamoDBLocal() as ddb:
        yield ddb


def setup_dynasem(endpoint: str, table_name: str) -> None:
    """Configure Django (``tests.support.settings``) for this process, as the race tests' workers
    do."""
    from tests.support.workers import setup_django

    setup_django(endpoint, table_name)


def create_dynasem_table() -> None:
    """``dynasem_createtable --wait``, then TTL off: DynamoDB Local's TTL sweep deletes expired
    rows at moments of its own, which would race the reaper being measured."""
    import io

    from django.core.management import call_command

    from dynasem._storage import dynamodb
    from dynasem.conf import settings

    call_command("dynasem_createtable", "--wait", stdout=io.StringIO())
    dynamodb.get_client().update_time_to_live(
        TableName=settings.TABLE_NAME,
        TimeToLiveSpecification={"Enabled": False, "AttributeName": "expires"},
    )


def process_cpu(pid: int | None = None) -> float:
    """CPU seconds (user + system) used so far by a process (default: this one, all threads)."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def collect(out: Any, n: int, what: str, timeout: float) -> list[Any]:
    """One answer from each of ``n`` workers, by worker index; a worker's error is raised."""
    results: list[Any] = [None] * n
    deadline = time.monotonic() + timeout
    got = 0
    while got < n:
        try:
            status, idx, payload = out.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise RuntimeError(
                f"{what}: {n - got} workers did not answer in {timeout:g} s"
            ) from None
        if status == "error":
            raise RuntimeError(f"{what}: worker {idx} failed:\n{payload}")
        results[idx] = payload
        got += 1
    return results


@contextlib.contextmanager
def worker_pool(worker: Any, cfg: dict[str, Any], n: int) -> Iterator[tuple[list[Any], Any]]:
    """``n`` spawned processes running ``worker(cfg, i, jobs, barrier, out)``; yields their job
    queues and the answer queue once every one answered its start-up, and ends them after."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(n)
    out = ctx.Queue()
    job_queues = [ctx.Queue() for _ in range(n)]
    procs = [
        ctx.Process(target=worker, args=(cfg, i, job_queues[i], barrier, out), daemon=True)
        for i in range(n)
    ]
    for p in procs:
        p.start()
    try:
        collect(out, n, "start-up", 180)
        yield job_queues, out
    finally:
        for q in job_queues:
            q.put(None)
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()


def dynasem_client(counter: RequestCounter | None = None) -> Any:
    from dynasem._storage import dynamodb

    client = dynamodb.get_client()
    if counter is not None:
        counter.attach(client)
    return client


def raw_client(endpoint: str, counter: RequestCounter | None = None) -> Any:
    import boto3
    from botocore.config import Config

    client = boto3.session.Session().client(
        "dynamodb",
        endpoint_url=endpoint,
        config=Config(retries={"mode": "legacy", "max_attempts": 3}, max_pool_connections=32),
        **DUMMY,
    )
    if counter is not None:
        counter.attach(client)
    return client


def create_floor_table(client: Any, name: str, *, with_gsis: bool = False) -> None:
    """A plain pk/sk table for the raw-boto3 floor (optionally with dynasem's two GSIs)."""
    if with_gsis:
        from dynasem._storage import records

        definition = records.table_definition(name)
    else:
        definition = {
            "TableName": name,
            "BillingMode": "PAY_PER_REQUEST",
            "AttributeDefinitions": [
                {"AttributeName": "pk", "AttributeType": "S"},
                {"AttributeName": "sk", "AttributeType": "S"},
            ],
            "KeySchema": [
                {"AttributeName": "pk", "KeyType": "HASH"},
                {"AttributeName": "sk", "KeyType": "RANGE"},
            ],
        }
    client.create_table(**definition)
    client.get_waiter("table_exists").wait(
        TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60}
    )


def floor_acquire(
    client: Any, table_name: str, key: str, token: str, extra: dict[str, Any] | None = None
) -> bool:
    """The floor's acquire: PutItem conditional on the item not existing. False if taken.
    ``extra``: more attributes (low-level form) for the item."""
    from botocore.exceptions import ClientError

    try:
        client.put_item(
            TableName=table_name,
            Item={"pk": {"S": key}, "sk": {"S": "lock"}, "tok": {"S": token}, **(extra or {})},
            ConditionExpression="attribute_not_exists(pk)",
        )
    except ClientError as exc:
        if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
            return False
        raise
    return True


def floor_release(client: Any, table_name: str, key: str, token: str) -> None:
    """The floor's release: DeleteItem conditional on our token."""
    client.delete_item(
        TableName=table_name,
        Key={"pk": {"S": key}, "sk": {"S": "lock"}},
        ConditionExpression="tok = :t",
        ExpressionAttributeValues={":t": {"S": token}},
    )


def peer_resource(endpoint: str, counter: RequestCounter | None = None) -> Any:
    import boto3
    from botocore.config import Config

    resource = boto3.session.Session().resource(
        "dynamodb",
        endpoint_url=endpoint,
        config=Config(retries={"mode": "legacy", "max_attempts": 3}, max_pool_connections=32),
        **DUMMY,
    )
    if counter is not None:
        counter.attach(resource.meta.client)
    return resource


def require_peer() -> None:
    """Exit with a clear message (before any engine starts) when python-dynamodb-lock, the
    peer this benchmark runs beside dynasem, is not installed: ``make venv`` leaves it out
    (benchmarks only); ``benchmarks/run_all.sh`` installs it."""
    try:
        import python_dynamodb_lock  # noqa: F401
    except ImportError:
        raise SystemExit(
            f"{Path(sys.argv[0]).name}: this benchmark runs python-dynamodb-lock beside dynasem, "
            "and it is not installed: `.venv/bin/python -m pip install python-dynamodb-lock` "
            "(benchmarks/run_all.sh installs it by itself)"
        ) from None


def create_peer_table(endpoint: str, name: str) -> None:
    from python_dynamodb_lock.python_dynamodb_lock import DynamoDBLockClient

    client = raw_client(endpoint)
    DynamoDBLockClient.create_dynamodb_table(client, table_name=name)
    # Its items expire an hour out (expiry_period), but keep DynamoDB Local's sweep away.
    client.update_time_to_live(
        TableName=name,
        TimeToLiveSpecification={"Enabled": False, "AttributeName": "expiry_time"},
    )


def peer_client(resource: Any, table_name: str) -> Any:
    """python-dynamodb-lock's client, configured like dynasem under tests.support.settings."""
    from python_dynamodb_lock.python_dynamodb_lock import DynamoDBLockClient

    return DynamoDBLockClient(
        resource,
        table_name=table_name,
        partition_key_name="lock_key",
        sort_key_name="sort_key",
        ttl_attribute_name="expiry_time",
        heartbeat_period=PEER_HEARTBEAT,
        safe_period=PEER_SAFE,
        lease_duration=PEER_LEASE,
        expiry_period=PEER_EXPIRY,
        heartbeat_tps=-1,
    )


def peer_config_text() -> str:
    return (
        f"lease_duration {PEER_LEASE.total_seconds():g} s, heartbeat_period "
        f"{PEER_HEARTBEAT.total_seconds():g} s, safe_period {PEER_SAFE.total_seconds():g} s"
    )


def new_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def has_fair() -> bool:
    import inspect

    import dynasem

    return "fair" in inspect.signature(dynasem.semaphore).parameters


# ---------------------------------------------------------------------------------------------
# Statistics and formatting
# ---------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (q in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.2f} ms"


def fmt(value: float, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def table_md(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table, columns padded so it also reads well on a terminal."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"

    out = [line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


class Targets:
    """Target lines: ``met`` or ``MISSED``, printed and kept for the doc."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.missed = 0

    def check(self, what: str, ok: bool, measured: str, goal: str) -> bool:
        verdict = "met" if ok else "MISSED"
        if not ok:
            self.missed += 1
        self.lines.append(f"- {what}: {measured} (target {goal}): **{verdict}**")
        print(f"target {verdict:6} {what}: {measured} (target {goal})", flush=True)
        return ok

    def markdown(self) -> str:
        return "\n".join(self.lines) or "- none set for this benchmark."


# ---------------------------------------------------------------------------------------------
# The machine and the command
# ---------------------------------------------------------------------------------------------


def dynamodb_local_version() -> str:
    from tests.support.dynamodb_local import CACHE_DIR, NPM_PACKAGE

    pkg = CACHE_DIR / "node_modules" / NPM_PACKAGE
    folders = sorted(p.parent.name for p in (pkg / "lib").glob("*/DynamoDBLocal.jar"))
    npm_version = "?"
    with contextlib.suppress(OSError, ValueError):
        import json

        npm_version = json.loads((pkg / "package.json").read_text())["version"]
    folder = folders[-1] if folders else "?"
    return f"{folder} (npm {NPM_PACKAGE}@{npm_version})"


def _ram() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                kib = int(line.split()[1])
                return f"{kib / 1024 / 1024:.1f} GiB"
    return "?"


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return re.sub(r"\s+", " ", line.split(":", 1)[1]).strip()
    return platform.processor() or "?"


def _java() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["java", "-version"], capture_output=True, text=True, timeout=20
        ).stderr.splitlines()
        if out:
            return out[0].strip()
    return "?"


def _peer_version() -> str:
    from importlib import metadata

    try:
        return metadata.version(PEER)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine() -> str:
    import boto3
    import django

    nproc = os.cpu_count()
    with contextlib.suppress(AttributeError):
        nproc = len(os.sched_getaffinity(0))
    return (
        f"nproc {nproc} ({_cpu_model()}), RAM {_ram()}, load average {START_LOAD} when the "
        f"script started (1/5/15 min), Python {platform.python_version()}, "
        f"DynamoDB Local {dynamodb_local_version()}, {_java()}, boto3 {boto3.__version__}, "
        f"Django {django.__version__}, {PEER} {_peer_version()}"
    )


def command() -> str:
    exe = Path(sys.executable)
    try:
        python = str(exe.relative_to(REPO_ROOT)) if exe.is_absolute() else str(exe)
    except ValueError:
        python = str(exe)
    script = Path(os.path.abspath(sys.argv[0]))
    with contextlib.suppress(ValueError):
        script = script.relative_to(REPO_ROOT)
    return shlex.join([python, str(script), *sys.argv[1:]])


# ---------------------------------------------------------------------------------------------
# docs/BENCHMARKS.md
# ---------------------------------------------------------------------------------------------

DOC_HEADER = """# Benchmarks

dynasem against [python-dynamodb-lock](https://pypi.org/project/python-dynamodb-lock/) (the
Python port of the AWS Java lock client) and a raw-boto3 floor, on one DynamoDB Local per
script, all measured in the same run. Each section below is written by its script
(`benchmarks/<name>.py`) and says on what machine and with which command it was measured;
`benchmarks/run_all.sh` runs them all. How requests are counted, and what every column means,
is in `benchmarks/README.md` (section *Benchmarks*).

DynamoDB Local is not DynamoDB: its latency is a JVM on the same (2-core) machine as the
clients, so absolute numbers say little about AWS; request counts and the ratios between
libraries measured side by side are what carries over.
"""


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"


def write_section(name: str, body: str) -> None:
    """Replace (or add) this script's section of docs/BENCHMARKS.md, keeping the others."""
    assert name in SECTIONS, name
    DOC.parent.mkdir(parents=True, exist_ok=True)
    with open(DOC.with_suffix(".md.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        text = DOC.read_text() if DOC.exists() else DOC_HEADER
        for other in SECTIONS:  # every section has its place, in a fixed order
            start, end = _markers(other)
            if start not in text:
                placeholder = f"_Not run yet: `benchmarks/{other}.py`._"
                text = text.rstrip("\n") + f"\n\n{start}\n{placeholder}\n{end}\n"
        start, end = _markers(name)
        pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
        text = pattern.sub(lambda _: f"{start}\n{body.strip()}\n{end}", text, count=1)
        tmp = DOC.with_suffix(".md.tmp")
        tmp.write_text(text)
        tmp.replace(DOC)
    with contextlib.suppress(OSError):
        DOC.with_suffix(".md.lock").unlink()
    print(f"\nwrote the {name!r} section of {DOC.relative_to(REPO_ROOT)}", flush=True)


def _fill(text: str) -> str:
    import textwrap

    return textwrap.fill(
        " ".join(text.split()), width=96, break_long_words=False, break_on_hyphens=False
    )


def section(title: str, started: str, intro: str, parts: Sequence[str], targets: Targets) -> str:
    return "\n\n".join(
        [
            f"## {title}",
            _fill(f"Measured {started} on: {machine()}."),
            f"Command: `{command()}`",
            _fill(intro),
            *[p.strip() for p in parts if p.strip()],
            "Targets:\n\n" + targets.markdown(),
        ]
    )


def apart(sem: Any) -> Any:
    """``sem.acquire()`` as another holder would (a context of its own): a nested acquire in
    one thread re-enters that thread's holds, and these benchmarks stand in for several
    holders with one thread."""
    import contextvars

    return contextvars.Context().run(sem.acquire)
