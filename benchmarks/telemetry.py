"""OpenTelemetry's cost to the client: CPU per uncontended acquire + release, with telemetry
off and on, side by side in one run.

    .venv/bin/python benchmarks/telemetry.py [--cycles 3000] [--block 10]

One process, one DynamoDB Local, ``with semaphore(resource, wait=0): pass`` over 10 resources.
The configurations take turns in blocks of ``--block`` cycles (after ``--warmup`` unmeasured
cycles each), in a random order each round, so drift hits all of them alike. DynamoDB Local
is pinned to one core and this process to the others: on a small machine the JVM's bursts
would otherwise land in whichever block runs.

* off: ``telemetry.ON`` False, the path taken when opentelemetry is not installed (each hook is
  one ``if``);
* metrics: the SDK's MeterProvider with an in-memory reader, no TracerProvider (no spans made);
* metrics + spans: the same, and the SDK's TracerProvider with a BatchSpanProcessor to an
  in-memory exporter (what a project exporting traces runs).

CPU is the process's user + system time over each block (every thread: the span processor's
included), compared with the same round's "off"; the median of those ratios is the figure.
DynamoDB Local runs in its own process and is not counted. Also counted: requests per cycle
(must be equal: telemetry sends none of its own).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

CAPACITY_ONLY = "off, capacity asked (diagnostic)"


def _pin(engine_pid: int) -> str:
    """DynamoDB Local's threads on the last core, this process on the others (with 2 or more
    cores): the client's CPU time then measures its own work, not its fight with the JVM."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return "not pinned (one core)"
    for tid in os.listdir(f"/proc/{engine_pid}/task"):
        try:
            os.sched_setaffinity(int(tid), {cores[-1]})
        except OSError:
            pass  # a thread that ended meanwhile
    os.sched_setaffinity(0, set(cores[:-1]))
    return f"client on core(s) {cores[:-1]}, DynamoDB Local on core {cores[-1]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=3000, help="measured cycles per system")
    parser.add_argument("--block", type=int, default=10, help="cycles per turn")
    parser.add_argument("--warmup", type=int, default=200, help="unmeasured cycles per system")
    parser.add_argument("--no-doc", action="store_true", help="do not update docs/BENCHMARKS.md")
    args = parser.parse_args(argv)
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")

    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    with common.engine() as ddb:
        cores = os.sched_getaffinity(0)
        pinned = _pin(ddb.process.pid)
        common.setup_dynasem(ddb.endpoint_url, common.new_name("bench-otel"))
        common.create_dynasem_table()
        from dynasem import semaphore
        from dynasem._observability import telemetry
        from dynasem._storage import dynamodb

        requests: Counter[str] = Counter()
        current = ["warmup"]
        dynamodb.get_client().meta.events.register(
            "before-call.dynamodb", lambda **kw: requests.update([current[0]])
        )
        # The process has one TracerProvider (OpenTelemetry sets it once): "metrics" runs as
        # a project without one does, where telemetry makes no span at all.
        with_spans = telemetry._tracer

        # Diagnostic: telemetry off, but every request asks for its capacity units as
        # telemetry does. DynamoDB Local takes longer to answer those, and on this machine a
        # longer wait alone shows as more client CPU (an idle core clocks down): this row
        # tells that share from dynasem's own.
        asking = [False]

        def ask(params: dict[str, object], **kwargs: object) -> None:
            if asking[0]:
                params.setdefault("ReturnConsumedCapacity", "TOTAL")

        dynamodb.get_client().meta.events.register("provide-client-params.dynamodb", ask)

        def configure(name: str) -> None:
            telemetry.ON = name in ("metrics", "metrics + spans")
            telemetry._tracer = with_spans if name == "metrics + spans" else lambda: None
            asking[0] = name == CAPACITY_ONLY

        systems = ["off", "metrics", "metrics + spans", CAPACITY_ONLY]
        cpu: dict[str, float] = dict.fromkeys(systems, 0.0)
        rounds: dict[str, list[float]] = {name: [] for name in systems}  # CPU per round
        wall: dict[str, float] = dict.fromkeys(systems, 0.0)
        done: dict[str, int] = dict.fromkeys(systems, 0)

        def run(n: int, offset: int) -> None:
            for i in range(n):
                with semaphore(f"bench-otel:{(offset + i) % 10}", wait=0):
                    pass

        for name in systems:
            configure(name)
            run(args.warmup, 0)
        order = list(systems)
        while min(done.values()) < args.cycles:
            random.shuffle(order)  # no configuration always runs after the same one
            for name in order:
                configure(name)
                current[0] = name
                c0, w0 = time.process_time(), time.perf_counter()
                run(args.block, done[name])
                cpu[name] += time.process_time() - c0
                rounds[name].append(time.process_time() - c0)
                wall[name] += time.perf_counter() - w0
                done[name] += args.block
        current[0] = "after"
        provider.force_flush()
        os.sched_setaffinity(0, cores)  # the machine's header below counts every core
        spans = len(exporter.get_finished_spans())

    # Each round ran every configuration once, in turn: its ratio to that round's "off" is
    # free of the machine's drift; the median of those ratios is the figure.
    ratios = {
        name: statistics.median(a / b for a, b in zip(rounds[name], rounds["off"], strict=True))
        for name in systems
    }
    rows = []
    for name in systems:
        per = cpu[name] / done[name]
        rows.append(
            f"| {name} | {per * 1e6:.0f} µs | {ratios[name]:.3f}x | "
            f"{wall[name] / done[name] * 1e3:.2f} ms | {requests[name] / done[name]:.2f} |"
        )
    table_text = "\n".join(
        [
            "| telemetry | client CPU per cycle | vs off (median of rounds) | latency per cycle "
            "| requests per cycle |",
            "|---|---|---|---|---|",
            *rows,
        ]
    )
    print(table_text)
    print(f"spans exported: {spans}")
    targets = common.Targets()
    # Issue 26's target is the SDK's reader; exported spans are reported, not targeted (each
    # is the SDK's span object, its processor's queue and its export).
    targets.check(
        "client CPU, metrics / off",
        ratios["metrics"] <= 1.05,
        f"{ratios['metrics']:.3f}x",
        "<= 1.05x",
    )
    same = requests["off"] / done["off"] == requests["metrics + spans"] / done["metrics + spans"]
    targets.check(
        "requests per cycle, telemetry on / off",
        same,
        f"{requests['metrics + spans'] / done['metrics + spans']:.2f} / "
        f"{requests['off'] / done['off']:.2f}",
        "equal",
    )
    if not args.no_doc:
        intro = f"""
One process, {done["off"]} uncontended `with semaphore(res, wait=0): pass` cycles per
configuration over 10 resources, in turns of {args.block} cycles after {args.warmup} warm-up
cycles each, in random order each round ({pinned}). *off*: `telemetry.ON` False, the path
of an install without opentelemetry (one
`if` per hook). *metrics*: the OpenTelemetry SDK's MeterProvider with an in-memory reader
(no TracerProvider: no span is made). *metrics + spans*: also the SDK's TracerProvider with a
BatchSpanProcessor to an in-memory exporter ({spans} spans exported). *off, capacity
asked*: telemetry off, every request asking `ReturnConsumedCapacity="TOTAL"` as telemetry's
do: DynamoDB Local answers those more slowly, and on this machine a longer wait alone reads
as more client CPU (an idle core clocks down: 0.3 ms of `time.sleep` per request read as
+5.6% in a trial run), so this row is the share of the figure that is the engine's answer
time, not dynasem's work (AWS's answer time was not measured here). Client CPU: this
process's user + system time, every thread; DynamoDB Local's is not counted.
"""
        common.write_section(
            "telemetry",
            common.section(
                "Telemetry's cost to the client (`telemetry.py`)",
                started,
                intro,
                [table_text],
                targets,
            ),
        )
    return 1 if targets.missed else 0


if __name__ == "__main__":
    sys.exit(main())
