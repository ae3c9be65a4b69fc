#!/usr/bin/env python3
"""Concurrent purge-and-rebuild requests through real HTTP: does every project end whole?

    .venv/bin/pip install -e ".[demo,load]"
    .venv/bin/python scripts/load_rebuild.py                  # 8 rounds x 5 projects x 4 POSTs
    .venv/bin/python scripts/load_rebuild.py --wait 0         # refused requests get 423

Starts everything it needs and stops it again: a PostgreSQL cluster of Debian's packages
(``initdb`` into a temporary folder, run as the ``postgres`` user when started as root; it
installs the ``postgresql`` package with apt-get first when started as root without it),
DynamoDB Local for the locks (``tests/support/dynamodb_local.py``; ``--engine embedded`` uses
``python -m dynasem.testing`` instead), and the example project under gunicorn with several
workers, ``ATOMIC_REQUESTS = True``. Every request goes to 127.0.0.1.

Each round, for every project at once, ``--concurrency`` logged-in clients POST a rebuild
(delete the project's issues, bulk-insert a fresh set of ``--rows``). After the round it reads
every project's rows: a project is whole when it holds exactly ``--rows`` rows, all from one
rebuild, no issue number twice. The same load runs against three URLs of one server:

* ``locked``: ``@semaphore("tbl_issues:{project_id}", wait=...)``, given back after the commit;
* ``released-before-commit``: the same with ``on_commit=False`` (given back when the view
  returns, before ``ATOMIC_REQUESTS`` commits: what locks did before dynasem followed the
  transaction);
* ``unlocked``: no lock at all.

Exit status 1 if the locked variant leaves any project other than whole.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.support.example_server import Client, example_env, example_project  # noqa: E402
from tests.support.servers import ServerUnavailable, postgresql, stop  # noqa: E402

PROJECTS = range(1, 6)  # example_project.projects.views.PROJECTS
VARIANTS = {
    "locked": "rebuild",
    "released-before-commit": "rebuild-released-before-commit",
    "unlocked": "rebuild-unlocked",
}


# -- the lock store ------------------------------------------------------------------------------


@contextlib.contextmanager
def lock_store(engine: str, workdir: Path) -> Iterator[str]:
    if engine == "dynamodb-local":
        from tests.support.dynamodb_local import DynamoDBLocal

        with DynamoDBLocal() as ddb:
            yield ddb.endpoint_url
        return
    port_file = workdir / "ddb-port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dynasem.testing", "--port", "0", "--port-file", str(port_file),
         "--quiet"],
        cwd=REPO,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port_file.read_text().strip()}"
    finally:
        stop(proc)


# -- HTTP ----------------------------------------------------------------------------------------


# -- the load ------------------------------------------------------------------------------------


@dataclass
class Figures:
    variant: str
    statuses: Counter[int] = field(default_factory=Counter)
    states: int = 0
    whole: int = 0
    mixed: int = 0  # rows of more than one rebuild
    wrong_count: int = 0  # not exactly --rows rows
    duplicates: int = 0  # rows whose (project, number) another row has too
    rows: list[int] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())


def check_projects(figures: Figures, rows_each: int) -> None:
    from django.db.models import Count

    from example_project.projects.models import Issue

    for project in PROJECTS:
        issues = Issue.objects.filter(project=project)
        count = issues.count()
        rebuilds = issues.values("rebuild").distinct().count()
        doubled = (
            issues.values("number")
            .annotate(n=Count("id"))
            .filter(n__gt=1)
            .values_list("n", flat=True)
        )
        duplicates = sum(n - 1 for n in doubled)
        figures.states += 1
        figures.rows.append(count)
        figures.duplicates += duplicates
        figures.mixed += rebuilds > 1
        figures.wrong_count += count != rows_each
        figures.whole += count == rows_each and rebuilds == 1 and duplicates == 0


def run_variant(
    variant: str, port: int, args: argparse.Namespace, clients: list[Client]
) -> Figures:
    from example_project.projects.models import Issue

    Issue.objects.all().delete()
    figures = Figures(variant)
    url_name = VARIANTS[variant]
    lock = threading.Lock()
    for _ in range(args.rounds):
        start = threading.Barrier(len(PROJECTS) * args.concurrency)

        def fire(client: Client, project: int, start: threading.Barrier = start) -> None:
            start.wait()  # every POST of the round leaves at once
            status = client.rebuild(url_name, project)
            with lock:
                figures.statuses[status] += 1

        threads = [
            threading.Thread(target=fire, args=(clients[i * len(PROJECTS) + p], project))
            for p, project in enumerate(PROJECTS)
            for i in range(args.concurrency)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        check_projects(figures, args.rows)
    return figures


def report(all_figures: list[Figures], args: argparse.Namespace) -> str:
    lines = [
        f"rounds {args.rounds} x projects {len(PROJECTS)} x concurrent POSTs "
        f"{args.concurrency}; gunicorn workers {args.workers}; rows per rebuild {args.rows}; "
        f"lock wait {args.wait:g} s; rebuild fetch time {args.fetch:g} s; engine {args.engine}",
        "",
        "| variant | requests | 200 | 423 | other | project states | whole | with rows of "
        "2+ rebuilds | without exactly "
        f"{args.rows} rows | duplicate rows | rows per project (min-max) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in all_figures:
        other = f.requests - f.statuses[200] - f.statuses[423]
        others = ", ".join(
            f"{s}: {n}" for s, n in sorted(f.statuses.items()) if s not in (200, 423)
        )
        lines.append(
            f"| {f.variant} | {f.requests} | {f.statuses[200]} | {f.statuses[423]} | "
            f"{other}{f' ({others})' if others else ''} | {f.states} | {f.whole} | {f.mixed} | "
            f"{f.wrong_count} | {f.duplicates} | {min(f.rows)}-{max(f.rows)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4, help="POSTs per project a round")
    parser.add_argument("--workers", type=int, default=4, help="gunicorn worker processes")
    parser.add_argument("--rows", type=int, default=50, help="issues a rebuild inserts")
    parser.add_argument("--wait", type=float, default=60, help="seconds a rebuild waits")
    parser.add_argument(
        "--fetch", type=float, default=0.0, help="seconds a rebuild fetches before its writes"
    )
    parser.add_argument(
        "--engine", choices=["dynamodb-local", "embedded"], default="dynamodb-local"
    )
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated: " + ", ".join(VARIANTS)
    )
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants: {', '.join(unknown)}")
    for module in ("gunicorn", "psycopg", "environ"):
        try:
            __import__(module)
        except ImportError:
            raise SystemExit(
                f"load_rebuild: {module} is missing: pip install -e '.[demo,load]'"
            ) from None

    workdir = Path(tempfile.mkdtemp(prefix="dynasem-load-"))
    try:
        with contextlib.ExitStack() as stack:
            database_url = stack.enter_context(postgresql(workdir))
            endpoint = stack.enter_context(lock_store(args.engine, workdir))
            env = example_env(
                database_url,
                endpoint,
                "dynasem-load",
                DEMO_REBUILD_SECONDS=args.fetch,
                DEMO_ISSUES_PER_PROJECT=args.rows,
                DEMO_REBUILD_WAIT=args.wait,
                DEMO_LOAD_VARIANTS="true",
            )
            os.environ.update(env)  # this process reads the same database to check it
            port = stack.enter_context(example_project(env, workers=args.workers)).port

            import django

            django.setup()
            clients = [Client(port) for _ in range(args.concurrency * len(PROJECTS))]
            for client in clients:
                client.login()
            all_figures = []
            for variant in variants:
                print(f"load_rebuild: {variant} ...", flush=True)
                all_figures.append(run_variant(variant, port, args, clients))
            print()
            print(report(all_figures, args))
            locked = [f for f in all_figures if f.variant == "locked"]
            return 1 if any(f.whole != f.states for f in locked) else 0
    except ServerUnavailable as exc:
        raise SystemExit(f"load_rebuild: {exc}") from None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
