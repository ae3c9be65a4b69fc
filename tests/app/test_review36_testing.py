"""Review (thirty-sixth session): dynasem.testing's own examples, as a user copies them."""

from __future__ import annotations

import re
import time

import pytest

import dynasem.testing
from dynasem import run_once, semaphore
from dynasem.testing import abandon, fresh_table, held_elsewhere


def _example(doc: str | None) -> str:
    """The ```python block of a docstring, dedented."""
    found = re.search(r"```python\n(.*?)```", doc or "", re.DOTALL)
    assert found, "no example in the docstring"
    lines = found.group(1).splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return "\n".join(line[indent:] for line in lines)


@pytest.mark.reentry  # as in a user's project
def test_abandons_example_runs_under_the_default_settings():
    """``abandon``'s example (in the reference, docs/reference/integrations.md) took a hold
    with ``lease=2`` and slept 2.5 s: under the default ``CLOCK_SKEW`` of 5 s the acquire
    raises ValueError (a lease must be longer than the skew), and with a skew of 1 s the
    sleep is too short for the takeover (lease + skew), so ``wait=0`` raises SemaphoreBusy."""
    code = _example(abandon.__doc__)
    names = {"semaphore": semaphore, "abandon": abandon, "time": time, "fresh_table": fresh_table}
    with fresh_table(CLOCK_SKEW=5):  # dynasem's default, which a user's settings keep
        exec(compile(code, "abandon's example", "exec"), names)


@pytest.mark.parametrize("block", [semaphore, run_once], ids=["hold", "run_once"])
def test_a_give_back_left_for_a_testcases_rollback_goes_to_its_own_table(
    transactional_db, monkeypatch, block
):
    """A hold given back inside the test's own ``atomic`` waits for a commit a ``TestCase``
    never makes; Django rolls the test's transaction back after the test's clean-ups, and
    ``fresh_table()``'s is one: its table deleted and ``DYNASEM`` restored first, the
    give-back the rollback set off went to the project's own settings, maybe to AWS with
    the developer's credentials (the guide: "requests only ever go to the engine on
    127.0.0.1"), and was logged as failed."""
    from django.conf import settings as django_settings
    from django.db import transaction

    from dynasem._storage import dynamodb

    sent: list[tuple[str, str | None]] = []
    send = dynamodb.send_request

    def spy(operation: str, **request: object) -> object:
        sent.append((operation, django_settings.DYNASEM.get("ENDPOINT_URL")))
        return send(operation, **request)

    monkeypatch.setattr(dynamodb, "send_request", spy)
    testcase = transaction.atomic()
    testcase._from_testcase = True  # what Django's TestCase marks its own blocks with
    testcase.__enter__()
    try:
        with fresh_table() as table:
            endpoint = django_settings.DYNASEM["ENDPOINT_URL"]
            with transaction.atomic():  # the test's own (ATOMIC_REQUESTS, a service's)
                with block("rollback-later"):
                    pass
        # TestCase: the test and its clean-ups (fresh_table()'s) end, then the rollback
    finally:
        transaction.set_rollback(True)
        testcase.__exit__(None, None, None)
    elsewhere = [(operation, where) for operation, where in sent if where != endpoint]
    assert elsewhere == [], f"sent past {table}'s end, to the project's DYNASEM: {elsewhere}"


def test_a_hold_held_elsewhere_and_abandoned_ends_its_block_quietly(lock_table):
    """What a test of a dead holder's takeover writes: another process holds the lock and
    dies (``abandon``), the code under test takes the lock over once the lease has passed.
    The block's end then gave back a hold no longer ours and raised ``LockLost``: the test
    failed, though the code did what production must (the dead process raises nothing)."""
    with held_elsewhere("review36-dead", lease=1) as other:
        abandon(other)  # the other process dies
        time.sleep(1 + 0.5 + 0.3)  # its lease, CLOCK_SKEW (the suite's 0.5 s), a margin
        with semaphore("review36-dead", wait=0) as taken:  # the code under test
            assert taken.fence > other.fence


@pytest.mark.parametrize("page", ["docs/how-to/testing.md", "docs/tutorial.md"])
def test_the_guides_test_modules_import_what_they_use(page, pytestconfig):
    """The guides' pytest examples are a user's test module, not run by the docs' tests
    (they need the user's project): each must at least define its tests as written. The
    testing guide's used ``@pytest.mark.dynasem`` without importing pytest (NameError)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / page).read_text()
    marker = '<!-- skip: next "a test module of your own suite'
    block = re.search(r"```python\n(.*?)```", text[text.index(marker) :], re.DOTALL)
    assert block, f"no test module example in {page}"
    module = block.group(1).split("# test_rebuild.py", 1)[1]
    dynasem.testing.pytest_configure(pytestconfig)  # what the user's conftest.py loads
    exec(compile(module, f"{page}'s test_rebuild.py", "exec"), {"__name__": "test_rebuild"})


@pytest.mark.reentry  # as in a user's project
def test_an_abandoned_hold_is_not_re_entered_by_the_thread_that_took_it(lock_table):
    """``abandon`` leaves a hold as its process dying would: that process's lock, busy for
    everyone until its lease runs out. The thread that took it re-entered it instead (a
    nested acquire of its own hold), so the test's next acquire ran at once where every
    other process, and production's code after a crash, finds the lock busy."""
    from dynasem import SemaphoreBusy

    held = semaphore("review36-abandoned", lease=30).acquire()
    abandon(held)  # its process "dies" holding the lock
    try:
        with pytest.raises(SemaphoreBusy):
            with semaphore("review36-abandoned", wait=0):
                pass
    finally:
        held.release()
