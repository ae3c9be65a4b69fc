"""The lock list in a real browser: Playwright driving Debian's Chromium against a live server.

An operator logs in, sees a lock that another OS process holds, breaks it through the
confirmation page and sees it gone. Playwright's own browser download is not used: the test
launches /usr/bin/chromium, installing it with apt-get first when it is missing, and is
skipped (saying why) only where that install fails.

The layout test looks at where things are on screen at 1280x900 (the table's right edge in
view, the filter panel beside it, the breadcrumbs styled), on the installed Django: the matrix
runs it on every supported pair. Its screenshots are saved in the test's tmp_path; with
DYNASEM_SCREENSHOT_DIR set they are also written there as ``admin-<page>-django-X.Y.png``
(``DYNASEM_SCREENSHOT_DIR=docs/admin make test PYTEST_ARGS="-k laptop"`` refreshes the 6.1
ones in docs/admin/; a nox session's ``-- tests/operators/test_browser.py -k laptop`` the others).
"""

from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from playwright.sync_api import expect, sync_playwright

from dynasem import LockLost, semaphore
from dynasem._operators.locks import holds_on, queue_depth
from dynasem._storage.records import Waiter
from tests.support.helpers import enqueue_entry

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
REPO = Path(__file__).resolve().parents[2]

# Another OS process: takes the lock as nobody in particular (its identity is host:pid), says
# so, and keeps it (renewed in the background) until the test kills it.
HOLDER = """
import sys, time
from tests.support.workers import setup_django
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
    expect(row.locator("td.user")).to_contain_text(holder)
    expect(row.locator("td.user .kind")).to_have_text("exclusive")
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

    row.get_by_role("link", name=f"Break the hold on tbl_issues:42 (fence {fence})").click()
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


# Where things are on screen, not only what the page says: the layout of Django's own admin,
# whatever its version, at a laptop's viewport.
VIEWPORT = {"width": 1280, "height": 900}
LONG_NAME = "tenant:acme-industries/projects/" + "quarterly-revenue-reconciliation-" * 8 + "42"


def _box(page: Any, selector: str) -> dict[str, float]:
    box = page.locator(selector).first.bounding_box()
    assert box is not None, f"{selector} is not on screen"
    return box


def _check_layout(page: Any, *, with_list: bool) -> None:
    width = page.evaluate("document.documentElement.clientWidth")
    assert width == VIEWPORT["width"] or width >= VIEWPORT["width"] - 20  # less a scroll bar
    # Breadcrumbs styled as the installed Django styles them (a bar with a background),
    # whatever markup that version uses.
    crumbs = page.locator(".breadcrumbs").first
    background = crumbs.evaluate("el => getComputedStyle(el).backgroundColor")
    assert background not in ("rgba(0, 0, 0, 0)", "transparent"), "breadcrumbs unstyled"
    content = _box(page, "#content-main")
    assert content["x"] + content["width"] <= width + 0.5, content
    assert page.evaluate("document.documentElement.scrollWidth") <= width, "page scrolls sideways"
    if not with_list:
        return
    results = _box(page, "#result_list")
    assert results["x"] + results["width"] <= width + 0.5, (results, width)
    container = _box(page, "#changelist .results")
    assert container["width"] >= results["width"] - 0.5, "the table scrolls inside its box"
    # The filter panel beside the table (to its right, at the same height), not below it;
    # the table has the room between (not a column of it beside the search bar).
    panel = _box(page, "#changelist-filter")
    assert results["width"] >= panel["x"] - results["x"] - 60, (results, panel)
    assert panel["x"] >= results["x"] + results["width"] - 0.5, (panel, results)
    assert panel["y"] < results["y"] + results["height"], (panel, results)
    assert panel["x"] + panel["width"] <= width + 0.5, panel
    # The last column (the action) is in view.
    last = _box(page, "#result_list thead th:last-child")
    assert last["x"] + last["width"] <= width + 0.5, last


def _luminance(css: str) -> float:
    """0 (black) to 1 (white), roughly, of a CSS rgb()/rgba() colour."""
    r, g, b = (int(float(x)) for x in re.findall(r"[\d.]+", css)[:3])
    return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255


def _shoot(page: Any, tmp_path: Path, name: str) -> None:
    import django

    shot = tmp_path / f"{name}.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get("DYNASEM_SCREENSHOT_DIR"):
        target = Path(os.environ["DYNASEM_SCREENSHOT_DIR"])
        target.mkdir(parents=True, exist_ok=True)
        version = "{}.{}".format(*django.VERSION[:2])
        shutil.copyfile(shot, target / f"{name}-django-{version}.png")


@pytest.mark.django_db(transaction=True)
def test_the_admin_pages_fit_a_laptop_screen_on_this_django(
    live_server: Any,
    browser_page: Any,
    lock_table: str,
    django_user_model: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dynasem import run_once
    from dynasem.admin import LockAdmin

    django_user_model.objects.create_superuser("ops", "ops@example.com", "ops-password")
    names = [LONG_NAME] + [
        f"tbl_issues:{1000 + i}" if i % 3 else f"exports/customer-{i:04d}/invoices-2026-11.csv"
        for i in range(19)
    ]
    taken = [
        semaphore(name, user=f"worker-{i % 8}", lease=600).acquire() for i, name in enumerate(names)
    ]
    # A crowd of readers, more than the list shows of one resource (two kept in the row,
    # then reader items; the list reads two of those): a line leads to the rest.
    monkeypatch.setattr(LockAdmin, "holds_per_resource", 2)
    crowd = "file:catalog/export-2026-11.csv"
    taken += [
        semaphore(crowd, shared=True, user=f"reader-{i}", lease=600).acquire() for i in range(6)
    ]
    with run_once("reindex:catalog"):
        pass
    with pytest.raises(ValueError), run_once(LONG_NAME, user="worker-3"):
        raise ValueError("bad header in line 2: " + "expected 'sku', found 'SKU '; " * 20)
    page = browser_page
    page.set_viewport_size(VIEWPORT)
    try:
        page.goto(f"{live_server.url}/admin/dynasem/lock/")
        page.fill("#id_username", "ops")
        page.fill("#id_password", "ops-password")
        page.click("input[type=submit]")
        expect(page.locator("#result_list tr.hold")).to_have_count(20 + 4)
        expect(page.locator("#result_list tr.more")).to_have_count(1)
        more = _box(page, "#result_list tr.more td a")
        table = _box(page, "#result_list")
        assert table["x"] <= more["x"] and more["x"] + more["width"] <= table["x"] + table["width"]
        _check_layout(page, with_list=True)
        # The long name is cut, whole on hover.
        cut = page.locator("#result_list code", has_text="quarterly").first
        assert cut.get_attribute("title") == LONG_NAME
        assert _box(page, "#result_list th.resource code")["width"] < 500
        _shoot(page, tmp_path, "admin-locks")
        # Dark: the same layout, and the rows in Django's dark colours (light text on a dark
        # background), not ours.
        page.emulate_media(color_scheme="dark")
        _check_layout(page, with_list=True)
        _shoot(page, tmp_path, "admin-locks-dark")
        colours = page.locator("#result_list tbody td.expires").first.evaluate(
            "el => [getComputedStyle(el).color, getComputedStyle(document.body).backgroundColor]"
        )
        text, background = (_luminance(c) for c in colours)
        assert text > background + 0.4, colours
        page.emulate_media(color_scheme="light")

        # Two waiting in line for it, as the resource page shows them.
        now = int(time.time() * 1000)
        for i, user in enumerate(("ci-pipeline-813", "ci-pipeline-814")):
            waiter = Waiter(0, now + 60_000, user_id=user, since_ms=now - 30_000 * (2 - i))
            enqueue_entry(names[1], f"tok-{i}", waiter)
        page.locator("#result_list a", has_text=names[1]).first.click()
        expect(page.locator("#content h1")).to_contain_text(names[1])
        expect(page.locator(".dynasem-resource tr.hold")).to_have_count(1)
        expect(page.locator(".dynasem-resource tr.waiter")).to_have_count(2)
        expect(page.locator(".dynasem-resource tr.waiter").first).to_contain_text("ci-pipeline-813")
        _check_layout(page, with_list=False)
        _shoot(page, tmp_path, "admin-resource")
        page.go_back()

        # Focusing a Break link (keyboard users) keeps its resource in view: nothing
        # scrolls sideways inside the table.
        link = page.get_by_role(
            "link", name=f"Break the hold on {names[1]} (fence {taken[1].fence})"
        )
        link.focus()
        name = _box(page, f'#result_list th.resource code[title="{names[1]}"]')
        assert 0 <= name["x"] and name["x"] + name["width"] <= VIEWPORT["width"], name
        link.click()
        expect(page).to_have_title("Break this hold? | Django site admin")
        _check_layout(page, with_list=False)
        _shoot(page, tmp_path, "admin-break")
        # A break link cut short (no resource, no hold named): back at the list, which says
        # so in Django's message bar, light and dark, and nothing broken.
        page.goto(page.url.split("?")[0])
        expect(page.locator(".messagelist")).to_contain_text("This link names no hold")
        _check_layout(page, with_list=True)
        _shoot(page, tmp_path, "admin-break-no-hold")
        page.emulate_media(color_scheme="dark")
        _check_layout(page, with_list=True)
        _shoot(page, tmp_path, "admin-break-no-hold-dark")
        page.emulate_media(color_scheme="light")
        assert [h.token for h in holds_on(names[1])] == [taken[1].token]

        page.goto(f"{live_server.url}/admin/dynasem/job/")
        expect(page.locator("#result_list tbody tr")).to_have_count(2)
        _check_layout(page, with_list=True)
        _shoot(page, tmp_path, "admin-jobs")

        page.get_by_role("link", name="Reset the job reindex:catalog").click()
        expect(page).to_have_title("Reset this job? | Django site admin")
        _check_layout(page, with_list=False)
        _shoot(page, tmp_path, "admin-reset")
        # The crowd's page, two holders at a time, and a queue longer than it shows.
        monkeypatch.setattr(LockAdmin, "holds_per_page", 2)
        for i in range(6):
            waiter = Waiter(0, now + 60_000, user_id=f"ci-pipeline-9{i:02d}", since_ms=now)
            enqueue_entry(crowd, f"tok-crowd-{i}", waiter)
        page.goto(f"{live_server.url}/admin/dynasem/lock/")
        page.locator("#result_list tr.more td a").click()
        expect(page.locator("#content h1")).to_contain_text(crowd)
        expect(page.locator(".dynasem-resource tr.hold")).to_have_count(4)  # 2 in the row
        expect(page.locator(".dynasem-resource tr.waiter")).to_have_count(2)
        expect(page.locator(".dynasem-beyond")).to_contain_text("4 more are out behind them")
        module = _box(page, ".dynasem-resource .module")
        for part in (".dynasem-pages", ".dynasem-beyond"):  # inside their boxes, not past them
            box = _box(page, part)
            assert box["x"] + box["width"] <= module["x"] + module["width"] + 0.5, (part, box)
        _check_layout(page, with_list=False)
        _shoot(page, tmp_path, "admin-resource-crowd")
        page.get_by_role("link", name="Next 2 holders").click()
        expect(page.locator(".dynasem-resource tr.hold")).to_have_count(2)
        expect(page.get_by_role("link", name="First holders")).to_be_visible()
        _check_layout(page, with_list=False)

        # A page link this site did not write (edited, of another filter): a 400 in the
        # page's own layout that says so, and the way back to the first page.
        forged = {"resource": crowd, "after": "r#forged"}
        for path, name, back in (
            ("/admin/dynasem/lock/?cursor=forged", "admin-locks-bad-link", "« First page"),
            (f"/admin/dynasem/lock/resource/?{urlencode(forged)}", "admin-resource-bad-link",
             "First holders"),
        ):  # fmt: skip
            assert page.goto(live_server.url + path).status == 400
            note = page.locator("#content-main .errornote")
            expect(note).to_contain_text("start from the first page")
            box, content = _box(page, "#content-main .errornote"), _box(page, "#content-main")
            assert box["x"] + box["width"] <= content["x"] + content["width"] + 0.5, box
            _check_layout(page, with_list=False)
            _shoot(page, tmp_path, name)
            note.get_by_role("link", name=back).click()
            expect(page.locator("#content-main .errornote")).to_have_count(0)
        expect(page.locator(".dynasem-resource tr.hold")).to_have_count(4)
    finally:
        for held in taken:
            held.release()


@pytest.mark.django_db(transaction=True)
def test_a_lease_end_the_page_reaches_is_never_shown_as_expired(
    live_server: Any, browser_page: Any, lock_table: str, django_user_model: Any
) -> None:
    # The page shows the holds as they were when it was made; the heartbeat renews this one
    # (lease 3 s) while the page stays open. Counting past the lease end it showed, the page
    # cannot tell renewed from dead: it says so, never "expired". Whether the renewals land
    # is not what is shown here: on a machine loaded with the browser, the live server and
    # another test session, one may come too late (CI on 2ef81b8 lost it once, lease 2 s), and
    # the page must read the same then.
    django_user_model.objects.create_superuser("ops", "ops@example.com", "ops-password")
    held = semaphore("tbl_issues:renewed", user="worker-1", lease=3).acquire()
    try:
        page = browser_page
        page.goto(f"{live_server.url}/admin/dynasem/lock/")
        page.fill("#id_username", "ops")
        page.fill("#id_password", "ops-password")
        page.click("input[type=submit]")
        cell = page.locator("#result_list tr.hold", has_text="tbl_issues:renewed").locator(
            "td.expires time.dynasem-in"
        )
        expect(cell).to_have_text(re.compile(r"^in \d s$"))
        expect(cell).to_contain_text("renewed? reload", timeout=5_000)
        assert "expired" not in cell.inner_text()
        expect(page.locator(".dynasem-as-of")).to_contain_text("As of ")
    finally:
        try:
            held.release()
        except LockLost:
            pass  # a renewal that came too late (above)
