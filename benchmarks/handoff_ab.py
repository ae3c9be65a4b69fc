"""Hand-overs between processes, A/B interleaved per acquisition: is a library switch worth it?

    .venv/bin/python benchmarks/handoff_ab.py [--flag dynasem._engine.push:READ_OWN]
        [--processes 8] [--rounds 300] [--warmup 20] [--hold 0.01] [--seed 1]

``--processes`` processes take turns on one lock (``wait=60``) for ``--rounds`` acquisitions
each, holding it ``--hold`` seconds. Before each acquisition a process sets the module
attribute ``--flag`` (a boolean switch of dynasem's, e.g. ``push.READ_OWN``) to a coin's
throw, and each hand-over's gap (the releaser's last stamp in its block to the heir's first)
is put down to the heir's arm. Its first ``--warmup`` acquisitions are left out.

Why not runs side by side, or alternating blocks: a fresh DynamoDB Local's writes get faster
through the first hundreds of requests, and a machine's load drifts, by more than the effects
worth measuring here (tenths of a millisecond). Throwing the arm per acquisition spreads any
drift over both arms alike; what remains is the standard error printed beside each mean.
Prints each arm's count, p50, mean (with its standard error) and p90, and the differences.
Records nothing: its figures go into docs/BENCHMARKS.md with the command that gave them.
"""

from __future__ import annotations

import argparse
import importlib
import multiprocessing as mp
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def worker(cfg: dict[str, Any], index: int, barrier: Any, out: Any) -> None:
    common.setup_dynasem(cfg["endpoint"], cfg["table"])
    from dynasem import semaphore

    module_name, _, attribute = cfg["flag"].partition(":")
    module = importlib.import_module(module_name)
    coin = random.Random(cfg["seed"] * 1000 + index)
    stamps: list[tuple[float, str, bool | None]] = []
    with semaphore("warm", wait=60):
        pass
    barrier.wait()
    for done in range(cfg["rounds"]):
        arm = coin.random() < 0.5
        setattr(module, attribute, arm)
        held = semaphore("ab", wait=60).acquire()
        stamps.append((time.monotonic(), "got", arm if done >= cfg["warmup"] else None))
        time.sleep(cfg["hold"])
        stamps.append((time.monotonic(), "end", None))
        held.release()
    out.put((index, stamps))


def gaps(stamps: dict[int, list[tuple[float, str, bool | None]]]) -> dict[bool, list[float]]:
    """Each hand-over's gap (ms), by the heir's arm: from the end of a hold to the next
    holder's first stamp, when the next holder is another process."""
    events = sorted((t, index, kind, arm) for index, s in stamps.items() for t, kind, arm in s)
    found: dict[bool, list[float]] = {False: [], True: []}
    last_end: tuple[float, int] | None = None
    for t, index, kind, arm in events:
        if kind == "end":
            last_end = (t, index)
        elif last_end is not None and last_end[1] != index and arm is not None:
            found[arm].append((t - last_end[0]) * 1000)
    return found


def report(found: dict[bool, list[float]], flag: str) -> None:
    for arm in (False, True):
        g = sorted(found[arm])
        se = statistics.stdev(g) / len(g) ** 0.5
        print(
            f"{flag} = {arm!s:5}: {len(g)} hand-overs, p50 {statistics.median(g):.3f} ms, "
            f"mean {statistics.mean(g):.3f} ms (se {se:.3f}), p90 {g[int(len(g) * 0.9)]:.3f} ms"
        )
    off, on = sorted(found[False]), sorted(found[True])
    print(
        f"True - False: p50 {statistics.median(on) - statistics.median(off):+.3f} ms, "
        f"mean {statistics.mean(on) - statistics.mean(off):+.3f} ms, "
        f"p90 {on[int(len(on) * 0.9)] - off[int(len(off) * 0.9)]:+.3f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flag", default="dynasem._engine.push:READ_OWN")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--hold", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if ":" not in args.flag:
        parser.error("--flag is MODULE:ATTRIBUTE, e.g. dynasem._engine.push:READ_OWN")
    with common.engine() as ddb:
        cfg = {
            "endpoint": ddb.endpoint_url,
            "table": common.new_name("bench-ab"),
            **{k: getattr(args, k) for k in ("flag", "rounds", "warmup", "hold", "seed")},
        }
        common.setup_dynasem(cfg["endpoint"], cfg["table"])
        common.create_dynasem_table()
        ctx = mp.get_context("spawn")
        barrier, out = ctx.Barrier(args.processes), ctx.Queue()
        procs = [
            ctx.Process(target=worker, args=(cfg, i, barrier, out)) for i in range(args.processes)
        ]
        for proc in procs:
            proc.start()
        stamps = dict(out.get(timeout=3600) for _ in procs)
        for proc in procs:
            proc.join()
    report(gaps(stamps), args.flag.partition(":")[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
