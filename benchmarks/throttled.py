"""Under throttling (issue 40): one hot lock, 8 processes, on an engine that throttles.

    .venv/bin/python benchmarks/throttled.py [--processes 8] [--rounds 30] [--hold 0.01]
        [--shares 0,0.05,0.2] [--partition-wcu 30] [--kinds sync,async] [--no-doc]

One DynamoDB Local, and in front of it one unkind engine (``tests/support/unkind.py``, profile
``throttle``: no stale reads, no latency, only throttling) per scenario:

* ``share S``: a share S of all requests is answered ``ProvisionedThroughputExceededException``
  or ``ThrottlingException`` at random (the partition limits at AWS's 1,000 WCU/s and
  3,000 RCU/s, which DynamoDB Local on 2 cores never reaches);
* ``partition limit``: no random throttling, but the lock's partition key is throttled past
  ``--partition-wcu`` WCU/s (and 3 x that in RCU/s), a bucket of one second per key counting
  the units DynamoDB Local reports. AWS's limit is 1,000 WCU/s; scaled down so that 8
  processes on 2 cores can reach it.

``--processes`` spawned workers (one boto3 client each) live through every run. A run: one
scenario x one kind (``sync``: ``with semaphore(res, wait=60[, fair=True])`` in each worker's
main thread; ``async``: ``async with`` in one coroutine per worker) x fair or not: the workers
meet at a barrier and each takes a fresh resource ``--rounds`` times, holding it ``--hold`` s.
Meanwhile the parent probes with ``semaphore(res, wait=0)`` every 50-150 ms.

Reported per run:

* acq/s = acquisitions / wall (first acquire called .. last release returned);
* requests/acq: every API call of the workers (botocore ``before-call``) / acquisitions, and
  HTTP attempts (``before-send``: botocore's retries of throttled requests show here) /
  acquisitions; engine requests/acq: what the engine answered (its journal, prober's
  requests subtracted), and its throttled answers / acquisition;
* wait p50 / p99 = acquire returned - acquire called;
* errors: exceptions a caller that asked to wait 60 s got (``LimitExceeded``, ``LockLost``, any
  other), by class; overlaps: holds that began before an earlier one ended (must be 0);
* order: the queue ticket each acquisition drew (the ``ADD qin`` write's answer, read through
  a botocore ``after-call`` hook), compared along the order of acquisition: how many
  acquisitions came after a later ticket of the same queue (``out of order``; must be 0 with
  ``fair=True``);
* Retry-After: each ``SemaphoreBusy.retry_after`` the prober was told against when the lock
  actually became free (the next release after the refusal) and when the prober's turn came
  (the ``queue_position``-th release): the share within ``retry_after``, and its largest value
  (the documented bound: never later than a dead holder could be taken over, ``LEASE`` +
  ``CLOCK_SKEW``).

Targets: requests/acq at 20 % < 2 x at 0 %; no errors; 0 overlaps; 0 out of order with
``fair=True``; every ``retry_after`` <= LEASE + CLOCK_SKEW and the lock free within it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import math
import os
import random
import re
import sys
import threading
import time
import traceback
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SECTION = "throttled"

# ---------------------------------------------------------------------------------------------
# Worker process
# ---------------------------------------------------------------------------------------------


class Tickets:
    """The last queue ticket (qbase, qin) this process drew: the ``ADD #qin`` write's answer.
    One acquisition at a time per worker, so a process-wide value is enough."""

    def __init__(self) -> None:
        self.last: tuple[int, int] | None = None
        self.drawn = 0  # tickets drawn since the last reset
        self._names = threading.local()

    def attach(self, client: Any) -> None:
        events = client.meta.events
        events.register("before-parameter-build.dynamodb.UpdateItem", self._before)
        events.register("after-call.dynamodb.UpdateItem", self._after)

    def _before(self, params: Any = None, **kwargs: Any) -> None:
        expr = (params or {}).get("UpdateExpression", "")
        names = (params or {}).get("ExpressionAttributeNames", {})
        drawn = expr.startswith("ADD #qin")
        self._names.drawn = (names["#qin"], names["#qbase"]) if drawn else None

    def _after(self, parsed: Any = None, **kwargs: Any) -> None:
        drawn = getattr(self._names, "drawn", None)
        attrs = (parsed or {}).get("Attributes") if isinstance(parsed, dict) else None
        if drawn and attrs and drawn[0] in attrs:
            self.last = (int(attrs[drawn[1]]["N"]), int(attrs[drawn[0]]["N"]))
            self.drawn += 1


def point_at(endpoint: str, table_name: str) -> Any:
    """Settings for one run: its engine, its table (a context manager)."""
    from django.test import override_settings

    from dynasem.conf import settings

    return override_settings(
        DYNASEM=dict(settings.raw, ENDPOINT_URL=endpoint, TABLE_NAME=table_name)
    )


def one_sync(res: str, fair: bool, hold: float) -> tuple[float, float]:
    from dynasem import semaphore

    with semaphore(res, wait=60, fair=fair):
        t_acq = time.monotonic()
        time.sleep(hold)
        t_end = time.monotonic()
    return t_acq, t_end


async def one_async(res: str, fair: bool, hold: float) -> tuple[float, float]:
    from dynasem import semaphore

    async with semaphore(res, wait=60, fair=fair):
        t_acq = time.monotonic()
        await asyncio.sleep(hold)
        t_end = time.monotonic()
    return t_acq, t_end


def where(exc: BaseException) -> str:
    """The last frames of dynasem's own code an exception came through."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/dynasem/" in f.filename]
    return " < ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames[-4:]))


def run_rounds(job: dict[str, Any], tickets: Tickets) -> list[dict[str, Any]]:
    """The run's acquisitions, one record each (an error instead of times if one came)."""
    res, fair, hold = job["resource"], job["fair"], job["hold"]
    records: list[dict[str, Any]] = []
    loop = asyncio.new_event_loop() if job["kind"] == "async" else None
    try:
        for _ in range(job["rounds"]):
            tickets.last, tickets.drawn = None, 0
            rec: dict[str, Any] = {"req": time.monotonic()}
            try:
                if loop is not None:
                    rec["acq"], rec["end"] = loop.run_until_complete(one_async(res, fair, hold))
                else:
                    rec["acq"], rec["end"] = one_sync(res, fair, hold)
            except Exception as exc:
                rec["error"] = type(exc).__name__
                rec["message"] = f"{str(exc)[:200]} at {where(exc)}"
            rec["rel"] = time.monotonic()
            rec["ticket"], rec["drawn"] = tickets.last, tickets.drawn
            records.append(rec)
    finally:
        if loop is not None:
            loop.close()
    return records


def worker(cfg: dict[str, Any], idx: int, jobs: Any, barrier: Any, out: Any) -> None:
    try:
        common.setup_dynasem(cfg["endpoint"], cfg["table"])
        tickets = Tickets()
        out.put(("ready", idx, None))
    except BaseException:
        out.put(("error", idx, traceback.format_exc()))
        return
    while (job := jobs.get()) is not None:
        try:
            with point_at(job["endpoint"], job["table"]):
                counter = common.RequestCounter()
                client = common.dynasem_client(counter)
                tickets.attach(client)
                throttles = ThrottleCounter()
                throttles.attach(client)
                client.describe_table(TableName=job["table"])  # the connection, opened
                counter.reset()
                barrier.wait()
                records = run_rounds(job, tickets)
                payload = {"records": records, "requests": counter.snapshot()}
                out.put(("done", idx, dict(payload, throttled=throttles.seen)))
        except BaseException:
            out.put(("error", idx, traceback.format_exc()))
            try:
                barrier.abort()
            except Exception:
                pass
            return


# ---------------------------------------------------------------------------------------------
# The prober (parent process): wait=0 callers and what they are told
# ---------------------------------------------------------------------------------------------


def probe(
    res: str, stop: threading.Event, refusals: list[dict[str, Any]], errors: Counter[str]
) -> None:
    from dynasem import SemaphoreBusy, semaphore

    while not stop.wait(random.uniform(0.05, 0.15)):
        try:
            semaphore(res, wait=0, user="prober").acquire().release()
        except SemaphoreBusy as exc:
            refusals.append(
                {
                    "at": time.monotonic(),
                    "retry_after": exc.retry_after,
                    "estimate": exc.estimated_wait,
                    "position": exc.queue_position or 1,
                }
            )
        except Exception as exc:
            errors[type(exc).__name__] += 1


def retry_after_stats(refusals: list[dict[str, Any]], releases: list[float]) -> dict[str, Any]:
    releases = sorted(releases)
    free_in, turn_in, counted, late = 0, 0, 0, 0.0
    for r in refusals:
        after = [t for t in releases if t > r["at"]]
        if len(after) < r["position"]:
            continue  # the run ended first
        counted += 1
        free_in += after[0] - r["at"] <= r["retry_after"]
        late = max(late, after[0] - r["at"] - r["retry_after"])
        turn_in += after[r["position"] - 1] - r["at"] <= r["retry_after"]
    told = [r["retry_after"] for r in refusals]
    return {
        "refusals": len(refusals),
        "counted": counted,
        "free_in": free_in,
        "turn_in": turn_in,
        "late": late,
        "max": max(told, default=0),
        "min": min(told, default=0),
    }


# ---------------------------------------------------------------------------------------------
# Throttled answers, as the client sees them (every attempt, botocore's retries included)
# ---------------------------------------------------------------------------------------------

THROTTLE_CODES = frozenset(
    {"ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"}
)


class ThrottleCounter:
    def __init__(self) -> None:
        self.seen = 0

    def attach(self, client: Any) -> None:
        client.meta.events.register("needs-retry.dynamodb", self._answer)

    def _answer(self, response: Any = None, **kwargs: Any) -> None:
        if response and isinstance(response[1], dict):
            if (response[1].get("Error") or {}).get("Code") in THROTTLE_CODES:
                self.seen += 1


# ---------------------------------------------------------------------------------------------
# Analysis
# ---------------------------------------------------------------------------------------------


def out_of_order(records: list[dict[str, Any]]) -> tuple[int, int]:
    """(acquisitions that drew a ticket, those served after a later ticket of their queue)."""
    ticketed = sorted((r["acq"], r["ticket"]) for r in records if r["ticket"] and "acq" in r)
    latest: dict[int, int] = {}
    late = 0
    for _, (queue_id, queue_in) in ticketed:
        if queue_in < latest.get(queue_id, 0):
            late += 1
        latest[queue_id] = max(latest.get(queue_id, 0), queue_in)
    return len(ticketed), late


def analyse(results: list[dict[str, Any]]) -> dict[str, Any]:
    records = [r for res in results for r in res["records"]]
    ok = sorted((r for r in records if "acq" in r), key=lambda r: r["acq"])
    errors = Counter(r["error"] for r in records if "error" in r)
    messages = sorted({f"{r['error']}: {r['message']}" for r in records if "error" in r})
    overlaps, max_end = 0, -math.inf
    for r in ok:
        overlaps += r["acq"] < max_end
        max_end = max(max_end, r["end"])
    wall = max(r["rel"] for r in records) - min(r["req"] for r in records)
    waits = [r["acq"] - r["req"] for r in ok]
    requests = common.merge(res["requests"] for res in results)
    ticketed, late = out_of_order(records)
    rejoined = sum(1 for r in records if r["drawn"] > 1)
    return {
        "n": len(ok),
        "asked": len(records),
        "wall": wall,
        "rate": len(ok) / wall,
        "errors": errors,
        "messages": messages[:5],
        "overlaps": overlaps,
        "wait_p50": common.percentile(waits, 50),
        "wait_p99": common.percentile(waits, 99),
        "calls": common.all_calls(requests),
        "sends": requests["sends"],
        "requests": requests,
        "ticketed": ticketed,
        "late": late,
        "rejoined": rejoined,
        "releases": [r["rel"] for r in ok],
        "throttled_seen": sum(res["throttled"] for res in results),
    }


# ---------------------------------------------------------------------------------------------
# Engines
# ---------------------------------------------------------------------------------------------


def scenarios(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = [
        {"label": f"{s * 100:g} % throttled", "overrides": {"throttle_share": s}}
        for s in args.shares
    ]
    wcu = args.partition_wcu
    if not wcu:
        return out
    out.append(
        {
            "label": f"partition limit ({wcu:g} WCU/s)",
            "overrides": {"partition_wcu": wcu, "partition_rcu": 3 * wcu},
        }
    )
    return out


class Journal:
    """The engine's own count of what it answered, read from its journal between two marks."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0

    def mark(self) -> None:
        self.offset = os.path.getsize(self.path) if os.path.exists(self.path) else 0

    def since(self) -> tuple[int, int]:
        """(requests, throttled answers) since the mark."""
        with open(self.path) as f:
            f.seek(self.offset)
            lines = [json.loads(x) for x in f.read().splitlines() if x.strip()]
        mine = [e for e in lines if e.get("op") != "DescribeTable"]
        return len(mine), sum(1 for e in mine if "throttled" in e)


# ---------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------


def one_run(
    pool: tuple[list[Any], Any], scenario: dict[str, Any], kind: str, fair: bool, args: Any
) -> dict[str, Any]:
    """One run: the workers take a fresh resource, the parent probes it with wait=0."""
    job_queues, out = pool
    res = common.new_name(f"hot-{kind}-{'fair' if fair else 'greedy'}")
    job = {"endpoint": scenario["endpoint"], "table": scenario["table"], "resource": res,
           "kind": kind, "fair": fair, "rounds": args.rounds, "hold": args.hold}  # fmt: skip
    refusals: list[dict[str, Any]] = []
    probe_errors: Counter[str] = Counter()
    with point_at(scenario["endpoint"], scenario["table"]):
        counter, throttles = common.RequestCounter(), ThrottleCounter()
        throttles.attach(common.dynasem_client(counter))
        stop = threading.Event()
        prober = threading.Thread(target=probe, args=(res, stop, refusals, probe_errors))
        scenario["journal"].mark()
        for q in job_queues:
            q.put(job)
        prober.start()
        try:
            stats = analyse(common.collect(out, len(job_queues), f"{scenario['label']}", 900))
        finally:
            stop.set()
            prober.join()
    engine_requests, engine_throttled = scenario["journal"].since()
    stats["engine_requests"] = engine_requests - counter.sends
    stats["engine_throttled"] = engine_throttled - throttles.seen
    stats["retry_after"] = retry_after_stats(refusals, stats["releases"])
    stats["probe_errors"] = probe_errors
    return stats


def print_run(label: str, s: dict[str, Any]) -> None:
    n = max(1, s["n"])
    print(
        f"  {s['n']}/{s['asked']} acquired, {s['rate']:.1f} acq/s, "
        f"{s['calls'] / n:.2f} calls/acq ({s['sends'] / n:.2f} attempts), engine "
        f"{s['engine_requests'] / n:.2f} req/acq ({s['engine_throttled'] / n:.2f} throttled), "
        f"wait p50/p99 {common.ms(s['wait_p50'])}/{common.ms(s['wait_p99'])}, "
        f"errors {dict(s['errors'])}, overlaps {s['overlaps']}, "
        f"out of order {s['late']}/{s['ticketed']} ({s['rejoined']} queued again), "
        f"retry_after {s['retry_after']}",
        flush=True,
    )
    for m in s["messages"]:
        print(f"    {m}", flush=True)


def row(label: str, kind: str, fair: bool, s: dict[str, Any]) -> list[Any]:
    n = max(1, s["n"])
    ra = s["retry_after"]
    errors = ", ".join(f"{k} {v}" for k, v in sorted(s["errors"].items())) or "0"
    probe_errors = ", ".join(f"{k} {v}" for k, v in sorted(s["probe_errors"].items())) or "0"
    return [
        label,
        kind,
        "yes" if fair else "no",
        f"{s['n']}/{s['asked']}",
        common.fmt(s["rate"], 1),
        f"{s['calls'] / n:.2f} / {s['sends'] / n:.2f}",
        f"{s['engine_requests'] / n:.2f}",
        f"{s['engine_throttled'] / n:.2f}",
        f"{common.ms(s['wait_p50'])} / {common.ms(s['wait_p99'])}",
        errors,
        s["overlaps"],
        f"{s['late']} of {s['ticketed']}; {s['rejoined']}",
        f"{ra['min']}-{ra['max']} s; free {ra['free_in']}/{ra['counted']} "
        f"(else {ra['late']:.2f} s late at most), "
        f"turn {ra['turn_in']}/{ra['counted']}; errors {probe_errors}",
    ]


HEADERS = [
    "engine",
    "kind",
    "fair",
    "acquired",
    "acq/s",
    "calls / attempts per acq",
    "engine req/acq",
    "throttled/acq",
    "wait p50 / p99",
    "errors",
    "overlaps",
    "out of order; queued again",
    "wait=0 prober: retry_after; within it: lock free, its turn; errors",
]


def check_targets(runs: list[dict[str, Any]], lease_and_skew: float) -> common.Targets:
    targets = common.Targets()
    base = {
        (r["kind"], r["fair"]): r["stats"]
        for r in runs
        if r["overrides"] == {"throttle_share": 0.0}
    }
    for r in runs:
        s, name = r["stats"], f"{r['label']}, {r['kind']}, fair={r['fair']}"
        b = base.get((r["kind"], r["fair"]))
        if b is not None and r["stats"] is not b:
            ratio = (s["sends"] / max(1, s["n"])) / (b["sends"] / max(1, b["n"]))
            targets.check(f"{name}: attempts/acq vs 0 %", ratio < 2.0, f"{ratio:.2f}x", "< 2x")
        errors = sum(s["errors"].values())
        targets.check(f"{name}: errors to callers who wait", errors == 0, str(errors), "0")
        targets.check(f"{name}: overlaps", s["overlaps"] == 0, str(s["overlaps"]), "0")
        if r["fair"]:
            targets.check(
                f"{name}: served out of ticket order",
                s["late"] == 0,
                f"{s['late']} of {s['ticketed']}",
                "0",
            )
        ra = s["retry_after"]
        targets.check(
            f"{name}: retry_after",
            ra["max"] <= lease_and_skew,
            f"max {ra['max']} s",
            f"<= {lease_and_skew:g} s (LEASE + CLOCK_SKEW)",
        )
        # An estimate, not a promise: the holder's release may itself be throttled.
        share = ra["free_in"] / max(1, ra["counted"])
        targets.check(
            f"{name}: lock free within retry_after",
            share >= 0.95,
            f"{ra['free_in']}/{ra['counted']} ({ra['late']:.2f} s late at most)",
            ">= 95 % of refusals",
        )
    return targets


def write_doc(body: str) -> None:
    """This script's section of docs/BENCHMARKS.md (added at its end the first time)."""
    doc = common.DOC
    start, end = f"<!-- bench:{SECTION}:start -->", f"<!-- bench:{SECTION}:end -->"
    with open(doc.with_suffix(".md.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        text = doc.read_text()
        if start not in text:
            text = text.rstrip("\n") + f"\n\n{start}\n{end}\n"
        pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
        text = pattern.sub(lambda _: f"{start}\n{body.strip()}\n{end}", text, count=1)
        doc.write_text(text)
    with contextlib.suppress(OSError):
        doc.with_suffix(".md.lock").unlink()
    print(f"\nwrote the {SECTION!r} section of {doc.relative_to(common.REPO_ROOT)}", flush=True)


def start_engines(local: str, tmp: Path, args: Any) -> list[dict[str, Any]]:
    """One unkind engine and one table per scenario (the table made through DynamoDB Local)."""
    from tests.support.unkind import UnkindDynamoDB

    found = scenarios(args)
    for i, sc in enumerate(found):
        sc["table"] = common.new_name(f"bench-thr{i}")
        with point_at(local, sc["table"]):
            common.create_dynasem_table()
        path = str(tmp / f"journal-{i}.jsonl")
        sc["engine"] = UnkindDynamoDB(
            local, seed=args.seed + i, profile_name="throttle", overrides=sc["overrides"],
            journal=path,
        ).start()  # fmt: skip
        sc["endpoint"] = sc["engine"].endpoint_url
        sc["journal"] = Journal(path)
    return found


def run_all(found: list[dict[str, Any]], args: Any) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    cfg = {"endpoint": found[0]["endpoint"], "table": found[0]["table"]}
    with common.worker_pool(worker, cfg, args.processes) as pool:
        for kind in args.kinds:  # unmeasured: the engines' and workers' first requests
            one_run(pool, found[0], kind, True, argparse.Namespace(rounds=3, hold=args.hold))
        for sc in found:
            for kind in args.kinds:
                for fair in (False, True):
                    print(f"running {sc['label']}, {kind}, fair={fair} ...", flush=True)
                    stats = one_run(pool, sc, kind, fair, args)
                    print_run(sc["label"], stats)
                    runs.append({**sc, "kind": kind, "fair": fair, "stats": stats})
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=30, help="acquisitions per process")
    parser.add_argument("--hold", type=float, default=0.010, help="seconds held")
    parser.add_argument(
        "--shares", type=lambda s: [float(x) for x in s.split(",")], default=[0.0, 0.05, 0.2]
    )
    parser.add_argument("--partition-wcu", type=float, default=30.0)
    parser.add_argument("--kinds", type=lambda s: s.split(","), default=["sync", "async"])
    parser.add_argument("--seed", type=int, default=40)
    parser.add_argument("--no-doc", action="store_true", help="do not update docs/BENCHMARKS.md")
    args = parser.parse_args(argv)
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    import tempfile

    with common.engine() as ddb, tempfile.TemporaryDirectory() as tmp:
        common.setup_dynasem(ddb.endpoint_url, common.new_name("bench-thr"))
        found = start_engines(ddb.endpoint_url, Path(tmp), args)
        try:
            runs = run_all(found, args)
            counts = {sc["label"]: sc["engine"].stats()["counts"] for sc in found}
        finally:
            for sc in found:
                sc["engine"].stop()
        from dynasem.conf import settings

        lease_and_skew = settings.LEASE + settings.CLOCK_SKEW
    results = common.table_md(
        HEADERS, [row(r["label"], r["kind"], r["fair"], r["stats"]) for r in runs]
    )
    print(f"\n{args.processes} processes x {args.rounds} acquisitions of one resource, held "
          f"{args.hold * 1000:g} ms, per run\n\n{results}\n")  # fmt: skip
    counts_line = "Engine counts (whole run, warm-up and prober included): " + "; ".join(
        f"{label}: {json.dumps(c, sort_keys=True)}" for label, c in counts.items()
    )
    print(counts_line + "\n")
    targets = check_targets(runs, lease_and_skew)
    if not args.no_doc:
        write_doc(doc_body(started, args, results, counts_line, targets, lease_and_skew))
    return 0


def doc_body(
    started: str,
    args: Any,
    results: str,
    counts_line: str,
    targets: common.Targets,
    lease_and_skew: float,
) -> str:
    intro = f"""
One hot lock: {args.processes} OS processes (multiprocessing spawn, one boto3 client each) x
{args.rounds} acquisitions of one resource per run, each held {args.hold * 1000:g} ms, with
`semaphore(res, wait=60)`, with and without `fair=True` (`sync`: `with` in the worker's
thread; `async`: `async with` in one coroutine per worker), while the parent probes with
`wait=0` every 50-150 ms. The engine is `tests/support/unkind.py` (profile `throttle`: no stale
reads, no latency) in front of DynamoDB Local: *N % throttled* answers that share of all requests
`ProvisionedThroughputExceededException` or `ThrottlingException` at random; *partition
limit* throttles the lock's partition key past {args.partition_wcu:g} WCU/s and
{3 * args.partition_wcu:g} RCU/s (AWS's limits are 1,000 and 3,000; scaled down so that 8
processes on 2 cores reach it). *calls / attempts per acq*: the workers' API calls
(botocore `before-call`) and HTTP attempts (`before-send`: botocore's retries of throttled
requests) / acquisitions; *engine req/acq* and *throttled/acq*: what the engine answered (its
journal, the prober's requests taken out); *errors*: exceptions a caller that asked to wait 60
s got; *out of order*: acquisitions served after a later ticket of the same queue (the
ticket read from the `ADD qin` write's answer); *queued again*: acquisitions that drew more
than one ticket (passed over in the queue, then queued again at its back); *retry_after*: the
range the `wait=0` prober was told, and how many of its refusals saw the lock released (the
next release) and its own turn come (the `queue_position`-th release) within it, and the
errors it got. Settings: `tests.support.settings` (`LEASE` + `CLOCK_SKEW` = {lease_and_skew:g} s: a
dead holder's lock could be taken over that long after its last renewal, the most
`retry_after` may say).
"""
    return common.section(
        "Under throttling (issue 40)", started, intro, [results, counts_line], targets
    )


if __name__ == "__main__":
    sys.exit(main())
