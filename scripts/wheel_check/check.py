"""Use an installed (not editable) dynasem as a project would; run by scripts/wheel_check.sh.

    python scripts/wheel_check/check.py REPO

REPO is the checkout: it provides the list of templates the source has. The DynamoDB engine is
the installed package's own embedded one (``dynasem.testing.embedded``, with the ``testing``
extra), so the check also shows that ``dynasem.testing`` ships in the wheel. The project
itself is wheel_settings.py and wheel_urls.py beside this file, outside the package. Steps:
migrate, a superuser, the DynamoDB table; a live hold and a run_once job; every admin page
through Django's test Client (lock list, break confirmation, jobs, reset confirmation); every
template of the source loaded from the installed package, with what it extends and includes;
a lock taken and released. Exits non-zero on the first failure.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import sysconfig
from html import unescape
from pathlib import Path
from typing import Any

REPO = Path(sys.argv[1]).resolve()


def check(condition: object, what: str) -> None:
    if not condition:
        raise SystemExit(f"wheel check FAILED: {what}")
    print(f"  ok  {what}")


def embedded_engine() -> Any:
    from dynasem.testing.embedded import EmbeddedDynamoDB

    return EmbeddedDynamoDB().start()


def referenced_templates(template: Any) -> set[str]:
    """The constant names a template extends or includes."""
    from django.template import Context
    from django.template.loader_tags import ExtendsNode, IncludeNode

    nodelist = template.template.nodelist
    names = set()
    for node in nodelist.get_nodes_by_type(ExtendsNode):
        names.add(node.parent_name.resolve(Context()))
    for node in nodelist.get_nodes_by_type(IncludeNode):
        names.add(node.template.resolve(Context()))
    return {n for n in names if isinstance(n, str) and n}


def load_with_parents(name: str, seen: dict[str, str]) -> None:
    from django.template.loader import get_template

    if name in seen:
        return
    template = get_template(name)
    seen[name] = template.origin.name
    for other in referenced_templates(template):
        load_with_parents(other, seen)


def main() -> int:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "wheel-check",
        "AWS_SECRET_ACCESS_KEY": "wheel-check",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        os.environ.setdefault(key, value)
    engine = embedded_engine()
    os.environ["DYNASEM_ENDPOINT_URL"] = engine.endpoint_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "wheel_settings"

    import django

    django.setup()

    import dynasem

    package = Path(dynasem.__file__).resolve().parent
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    print(
        f"wheel check: dynasem {dynasem.__version__} from {package}, Django "
        f"{django.get_version()}, Python {sys.version.split()[0]}"
    )
    check(package.is_relative_to(site), f"dynasem is the installed package, in {site}")
    check(not package.is_relative_to(REPO), "dynasem is not imported from the checkout")
    check((package / "py.typed").is_file(), "py.typed is installed")

    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client
    from django.urls import reverse

    from dynasem import run_once, semaphore
    from dynasem._operators.locks import holds_on

    call_command("migrate", verbosity=0)
    check(True, "migrate (dynasem's migrations applied from the wheel)")
    admin_user = get_user_model().objects.create_superuser("wheel", "wheel@example.com", "pw")
    call_command("dynasem_createtable", "--wait", verbosity=0)
    check(True, f"dynasem_createtable at {engine.endpoint_url}")

    held = semaphore("wheel:held", user=admin_user, lease=30).acquire()
    with run_once("wheel:job"):
        pass
    client = Client()
    client.force_login(admin_user)

    def page(url: str, *texts: str) -> str:
        response = client.get(url)
        body = response.content.decode()
        check(response.status_code == 200, f"GET {url} -> {response.status_code}")
        for text in texts:
            check(text in body, f"   it shows {text!r}")
        return body

    lock_list = page(reverse("admin:dynasem_lock_changelist"), "wheel:held", "Break…")
    release = re.search(r'href="([^"]*/release/\?[^"]*)"', lock_list)
    check(release is not None, "the lock list links a hold to its break confirmation")
    assert release is not None
    page(unescape(release.group(1)), "Break a hold", "wheel:held", "Yes, break this hold")

    jobs = page(reverse("admin:dynasem_job_changelist"), "wheel:job", "DONE", "Reset…")
    reset = re.search(r'href="([^"]*/reset/\?[^"]*)"', jobs)
    check(reset is not None, "the jobs page links a DONE job to its reset confirmation")
    assert reset is not None
    page(unescape(reset.group(1)), "Reset a job", "wheel:job", "Yes, reset this job")

    source = REPO / "dynasem" / "templates"
    names = sorted(p.relative_to(source).as_posix() for p in source.rglob("*.html"))
    installed = sorted(
        p.relative_to(package / "templates").as_posix()
        for p in (package / "templates").rglob("*.html")
    )
    check(names == installed, f"the wheel has the source's {len(names)} templates")
    loaded: dict[str, str] = {}
    for name in names:
        load_with_parents(name, loaded)
        check(
            Path(loaded[name]).resolve().is_relative_to(package),
            f"template {name} loads from the installed package",
        )
    others = sorted(set(loaded) - set(names))
    check(others, f"and what they extend or include: {', '.join(others)}")

    held.release()
    check(holds_on("wheel:held") == [], "the admin's hold released")
    with semaphore("wheel:lock", wait=5) as lock:
        check(lock.fence > 0 and holds_on("wheel:lock") != [], f"lock taken (fence {lock.fence})")
    check(holds_on("wheel:lock") == [], "lock released")

    # With the otel extra (opentelemetry-api, no SDK): the hooks run against the API's no-op
    # providers; without it, telemetry is off and the package never imports opentelemetry.
    from dynasem._observability import telemetry

    installed = importlib.util.find_spec("opentelemetry") is not None
    check(telemetry.ON == installed, f"telemetry {'on' if installed else 'off'}")
    check(installed or "opentelemetry" not in sys.modules, "opentelemetry not imported")

    engine.stop()
    print("wheel check: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
