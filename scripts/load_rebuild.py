#!/usr/bin/env python3
"""Concurrent purge-and-rebuild requests through real HTTP: does every project end whole?

    .venv/bin/pip install -e ".[demo,load]"
    .venv/bin/python scripts/load_rebuild.py                  # 8 rounds x 5 projects x 4 POSTs
    .venv/bin/python scripts/load_rebuild.py --wait 0         # refused requests get 423

Starts everything it needs and stops it again: a PostgreSQL cluster of Debian's packages
(``initdb`` into a temporary folder, run as the ``postgres`` user when started as root; it
installs the ``postgresql`` package with apt-get first when started as root without it),
DynamoDB Local for the locks (``tests/dynamodb_local.py``; ``--engine embedded`` uses
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
import http.client
import os
import re
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
from typing import Any
from urllib.parse import urlencode

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.servers import (  # noqa: E402 - after the checkout is importable
    ServerUnavailable,
    free_port,
    postgresql,
    stop,
    wait_for_port,
)

PROJECTS = range(1, 6)  # example_project.projects.views.PROJECTS
USER, PASSWORD = "load", "load-password"
VARIANTS = {
    "locked": "rebuild",
    "released-before-commit": "rebuild-released-before-commit",
    "unlocked": "rebuild-unlocked",
}


# -- the lock store ------------------------------------------------------------------------------


@contextlib.contextmanager
def lock_store(engine: str, workdir: Path) -> Iterator[str]:
    if engine == "dynamodb-local":
        from tests.dynamodb_local import DynamoDBLocal

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


class Client:
    """A logged-in session of the example project (cookies and CSRF token by hand)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.cookies: dict[str, str] = {}

    def request(
        self, method: str, path: str, body: str = "", headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=180)
        try:
            all_headers = {
                "Cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items()),
                **(headers or {}),
            }
            conn.request(method, path, body=body, headers=all_headers)
            response = conn.getresponse()
            for header, value in response.getheaders():
                if header.lower() == "set-cookie":
                    name, _, rest = value.partition("=")
                    self.cookies[name.strip()] = rest.split(";", 1)[0]
            return response.status, response.read()
        finally:
            conn.close()

    def login(self) -> None:
        status, page = self.request("GET", "/accounts/login/")
        match = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        if status != 200 or match is None:
            raise SystemExit(f"load_rebuild: the login page answered {status}")
        form = urlencode(
            {"username": USER, "password": PASSWORD, "csrfmiddlewaretoken": match[1].decode()}
        )
        status, _ = self.request(
            "POST",
            "/accounts/login/",
            form,
            {"Content-Type": "application/x-www-form-urlencoded"},
        )
        if status != 302 or "sessionid" not in self.cookies:
            raise SystemExit(f"load_rebuild: logging in answered {status}")

    def rebuild(self, url_name: str, project: int) -> int:
        status, _ = self.request(
            "POST",
            f"/projects/{project}/{url_name}/",
            headers={
                "X-CSRFToken": self.cookies["csrftoken"],
                "Accept": "application/json",
                "Content-Length": "0",
            },
        )
        return status


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
    gunicorn: subprocess.Popen[Any] | None = None
    try:
        with postgresql(workdir) as database_url, lock_store(args.engine, workdir) as endpoint:
            env = {
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "example_project.settings",
                "DATABASE_URL": database_url,
                "DJANGO_ATOMIC_REQUESTS": "true",
                "DJANGO_DEBUG": "false",
                "DYNASEM_ENDPOINT_URL": endpoint,
                "DYNASEM_TABLE_NAME": "dynasem-load",
                "DYNASEM_LOG_LEVEL": "WARNING",
                "DEMO_LOG_LEVEL": "WARNING",
                "DEMO_REBUILD_SECONDS": str(args.fetch),
                "DEMO_ISSUES_PER_PROJECT": str(args.rows),
                "DEMO_REBUILD_WAIT": str(args.wait),
                "DEMO_LOAD_VARIANTS": "true",
                "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", "load"),
                "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", "load"),
                "AWS_DEFAULT_REGION": "us-east-1",
            }
            os.environ.update(env)  # this process reads the same database to check it
            manage = [sys.executable, str(REPO / "manage.py")]
            subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], env=env, check=True)
            subprocess.run([*manage, "dynasem_createtable", "--wait"], env=env, check=True)
            subprocess.run(
                [*manage, "shell", "-v", "0", "-c",
                 "from django.contrib.auth.models import User; "
                 f"User.objects.create_user({USER!r}, password={PASSWORD!r})"],
                env=env, check=True,
            )  # fmt: skip
            port = free_port()
            server = [sys.executable, "-m", "gunicorn", "example_project.wsgi:application"]
            gunicorn = subprocess.Popen(
                [*server, "--workers", str(args.workers), "--bind", f"127.0.0.1:{port}"]
                + ["--timeout", "300", "--log-level", "warning"],
                cwd=REPO,
                env=env,
            )
            wait_for_port(port, gunicorn, "gunicorn", 60)

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
        stop(gunicorn)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
