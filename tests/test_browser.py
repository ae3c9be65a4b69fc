"""The lock list in a real browser: Playwright driving Debian's Chromium against a live server.

An operator logs in, sees a lock that another OS process holds, breaks it through the
confirmation page and sees it gone. Playwright's own browser download is not used: the test
launches /usr/bin/chromium, installing it with apt-get first when it is missing, and is
skipped (saying why) only where that install fails.

The screenshot of the lock list is saved in the test's tmp_path; with DYNASEM_SCREENSHOT_DIR
set it is also written there (``DYNASEM_SCREENSHOT_DIR=docs make test PYTEST_ARGS=-kbrowser``
refreshes docs/admin-locks.png).
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect, sync_playwright

from dynasem import LockLost, semaphore
from dynasem.operations import holds_on, queue_depth

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
REPO = Path(__file__).resolve().parent.parent

# Another OS process: takes the lock as nobody in particular (its identity is host:pid), says
# so, and keeps it (renewed in the background) until the test kills it.
HOLDER = """
import sys, time
from tests.workers import setup_django
setup_django(sys.argv[1], sys.argv[2])
from dynasem import semaphore
held = semaphore(sys.argv[3], lease=30).acquire()
print(held.user_id, held.fence, flush=True)
time.sleep(600)
"""


def install_chromium() -> str | None:
    """``apt-get install -y chromium``; None when done, else why it could not be."""
    apt = shutil.which("apt-get")
    if apt is None:
        return f"Chromium is not at {CHROMIUM} and there is no apt-get to install it"
    prefix: list[str] = []
    if os.geteuid() != 0:
        if shutil.which("sudo") is None:
            return f"Chromium is not at {CHROMIUM}; installing it needs root or sudo"
        prefix = ["sudo", "-n"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in (
        [*prefix, apt, "update", "-qq"],
        [*prefix, apt, "install", "-y", "-qq", "chromium"],
    ):
        shown = " ".join(command)
        try:
            done = subprocess.run(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=900,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"Chromium is not at {CHROMIUM} and `{shown}` failed: {exc}"
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            return (
                f"Chromium is not at {CHROMIUM} and `{shown}` failed "
                f"(exit {done.returncode}): {' / '.join(tail)}"
            )
    if not os.access(CHROMIUM, os.X_OK):
        return f"`apt-get install chromium` succeeded but left no {CHROMIUM}"
    return None


@pytest.fixture(scope="session")
def chromium() -> str:
    if not os.access(CHROMIUM, os.X_OK):
        reason = install_chromium()
        if reason is not None:
            pytest.skip(reason)
    return CHROMIUM


@pytest.fixture
def browser_page(chromium: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    # Playwright's sync API runs an event loop in this thread; the test's own ORM calls are
    # still plain synchronous code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"),  # a new, empty user-data-dir
            executable_path=chromium,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1600, "height": 700},
        )
        try:
            page = context.new_page()
            page.set_default_timeout(20_000)
            yield page
        finally:
            context.close()


@pytest.fixture
def other_process(lock_table: str, dynamodb_local: str) -> Iterator[Any]:
    """``hold(resource) -> (user_id, fence)`` in another OS process, killed at the end."""
    started: list[subprocess.Popen[str]] = []

    def hold(resource: str) -> tuple[str, int]:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, dynamodb_local, lock_table, resource],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline() if ready else ""  # type: ignore[union-attr]
        if not line:
            raise AssertionError(f"the holder process did not take {resource!r}")
        user_id, fence = line.split()
        return user_id, int(fence)

    yield hold
    for proc in started:
        proc.kill()
        proc.wait(10)


@pytest.fixture
def local_holds(lock_table: str, django_user_model: Any) -> Iterator[None]:
    """A few holds of this process, for a lock list that shows every column at work."""
    alice = django_user_model.objects.create_user("alice")
    taken = [
        semaphore("tbl_issues:7", user=alice, lease=600).acquire(),
        semaphore("exports", limit=3, user="export-worker-1", lease=120).acquire(),
        semaphore("exports", limit=3, user="export-worker-2", lease=90).acquire(),
        semaphore("file:reports/q3.pdf", shared=True, user=alice, lease=45).acquire(),
        semaphore("deploy:production", user="ci-pipeline-812", lease=300).acquire(),
    ]
    # A pipeline waiting its turn: the queue column shows it.
    waiter = threading.Thread(
        target=lambda: (
            semaphore("deploy:production", fair=True, wait=60, user="ci-pipeline-813")
            .acquire()
            .release()
        ),
        daemon=True,
    )
    waiter.start()
    deadline = time.monotonic() + 10
    while queue_depth("deploy:production") == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    yield
    for held in taken:
        try:
            held.release()
        except LockLost:
            pass
    waiter.join(30)


@pytest.mark.django_db(transaction=True)
def test_operator_breaks_another_processs_lock_in_a_browser(
    live_server: Any,
    browser_page: Any,
    other_process: Any,
    local_holds: None,
    django_user_model: Any,
    tmp_path: Path,
) -> None:
    django_user_model.objects.create_superuser("ops", "ops@example.com", "ops-password")
    holder, fence = other_process("tbl_issues:42")
    assert holder.split(":")[-1] != str(os.getpid())  # held by that process, not by us
    page = browser_page

    page.goto(f"{live_server.url}/admin/dynasem/lock/")
    page.fill("#id_username", "ops")
    page.fill("#id_password", "ops-password")
    page.click("input[type=submit]")
    expect(page).to_have_title("Active locks | Django site admin")

    row = page.locator("#result_list tr.hold", has_text="tbl_issues:42")
    expect(row).to_have_count(1)
    expect(row.locator("td.user")).to_have_text(holder)
    expect(row.locator("td.fence")).to_have_text(str(fence))
    expect(page.locator("#result_list tr.hold")).to_have_count(6)
    expect(page.locator("#result_list tr.hold", has_text="exports")).to_have_count(2)
    # The "expires" column counts down in the page, without a reload.
    expires = row.locator("td.expires")
    before = expires.inner_text()
    assert before.startswith("in ")
    expect(expires).not_to_have_text(before, timeout=3_000)

    shot = tmp_path / "admin-locks.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get("DYNASEM_SCREENSHOT_DIR"):
        target = Path(os.environ["DYNASEM_SCREENSHOT_DIR"])
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target / "admin-locks.png")

    row.get_by_role("link", name="Break…").click()
    expect(page).to_have_title("Break this hold? | Django site admin")
    expect(page.locator("#content-main")).to_contain_text(f"Break the hold of {holder}")
    assert [h.user_id for h in holds_on("tbl_issues:42")] == [holder]  # the GET broke nothing
    page.get_by_role("button", name="Yes, break this hold").click()

    expect(page).to_have_title("Active locks | Django site admin")
    expect(page.locator("ul.messagelist")).to_contain_text(
        f"Broke the hold of {holder} on tbl_issues:42 (fence {fence})."
    )
    expect(page.locator("#result_list tr.hold", has_text="tbl_issues:42")).to_have_count(0)
    expect(page.locator("#result_list tr.hold")).to_have_count(5)
    assert holds_on("tbl_issues:42") == []
