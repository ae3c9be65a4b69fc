"""The example project served for real, for scripts/load_rebuild.py and
tests/system/test_example_http.py: migrated on a database (PostgreSQL there), its lock table made,
a user to log in with, under gunicorn on a free port of 127.0.0.1, ``ATOMIC_REQUESTS`` on;
and a logged-in HTTP client of it."""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from tests.support.servers import free_port, stop, wait_for_port

REPO = Path(__file__).resolve().parents[2]
USER, PASSWORD = "load", "load-password"


def example_env(database_url: str, endpoint: str, table_name: str, **demo: Any) -> dict[str, str]:
    """The environment of the example project's processes (and of a process reading its
    database); ``demo``: its ``DEMO_*`` settings, e.g. ``DEMO_REBUILD_SECONDS=1``."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "DATABASE_URL": database_url,
        "DJANGO_ATOMIC_REQUESTS": "true",
        "DJANGO_DEBUG": "false",
        "DYNASEM_ENDPOINT_URL": endpoint,
        "DYNASEM_TABLE_NAME": table_name,
        "DYNASEM_LOG_LEVEL": "WARNING",
        "DEMO_LOG_LEVEL": "WARNING",
        "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", "load"),
        "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", "load"),
        "AWS_DEFAULT_REGION": "us-east-1",
        **{key: str(value) for key, value in demo.items()},
    }


@dataclass(frozen=True)
class Served:
    port: int
    pid: int  # gunicorn's master process


@contextlib.contextmanager
def example_project(env: dict[str, str], *, workers: int = 4, threads: int = 1) -> Iterator[Served]:
    """Migrate, make the lock table and the user (each only if missing: a second server on
    the same database and table is one more host), serve under gunicorn; yields its port
    and its master's pid."""
    manage = [sys.executable, str(REPO / "manage.py")]
    subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], env=env, check=True, cwd=REPO)
    subprocess.run(
        [*manage, "dynasem_createtable", "--wait"],
        env=env,
        check=True,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
    )
    subprocess.run(
        [*manage, "shell", "-v", "0", "-c",
         "from django.contrib.auth.models import User; "
         f"User.objects.filter(username={USER!r}).exists() or "
         f"User.objects.create_user({USER!r}, password={PASSWORD!r})"],
        env=env, check=True, cwd=REPO,
    )  # fmt: skip
    port = free_port()
    server = [sys.executable, "-m", "gunicorn", "example_project.wsgi:application"]
    gunicorn = subprocess.Popen(
        [*server, "--workers", str(workers), "--threads", str(threads)]
        + ["--bind", f"127.0.0.1:{port}", "--timeout", "300", "--log-level", "warning"],
        cwd=REPO,
        env=env,
    )
    try:
        wait_for_port(port, gunicorn, "gunicorn", 60)
        yield Served(port, gunicorn.pid)
    finally:
        stop(gunicorn)


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
            raise RuntimeError(f"the login page answered {status}")
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
            raise RuntimeError(f"logging in answered {status}")

    def rebuild(self, url_name: str, project: int) -> int:
        return self.post_rebuild(url_name, project)[0]

    def post_rebuild(self, url_name: str, project: int) -> tuple[int, bytes]:
        """POST a rebuild of ``project`` to the URL ``url_name``, asking for JSON."""
        return self.request(
            "POST",
            f"/projects/{project}/{url_name}/",
            headers={
                "X-CSRFToken": self.cookies["csrftoken"],
                "Accept": "application/json",
                "Content-Length": "0",
            },
        )
