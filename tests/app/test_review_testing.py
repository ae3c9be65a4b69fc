"""Review (helper 6): dynasem.testing's helpers inside a test's transaction."""

from __future__ import annotations

from django.db import transaction

from dynasem import semaphore
from dynasem._operators.locks import holds_on
from dynasem.testing import held_elsewhere


def test_held_elsewhere_gives_the_lock_back_at_its_blocks_end_inside_a_transaction(
    lock_table, transactional_db
):
    """A Django TestCase (and pytest-django's ``db``) runs every test inside
    ``transaction.atomic``. ``held_elsewhere`` stands for another process's hold, but its
    release runs in the test's thread, inside that transaction: it is deferred to a commit
    that never comes, so the lock stays taken after the ``with`` block, until the test's
    transaction rolls back at its end. The usual test — busy inside the block, free after
    it — cannot be written."""
    with transaction.atomic():  # what TestCase / the db fixture wrap each test in
        with held_elsewhere("review6-elsewhere", user="alice"):
            assert len(holds_on("review6-elsewhere")) == 1
        assert holds_on("review6-elsewhere") == [], "still held after held_elsewhere's block"
        with semaphore("review6-elsewhere", wait=0) as held:
            assert held.user_id != "alice"
