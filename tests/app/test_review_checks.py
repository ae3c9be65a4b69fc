"""Review (helper 6): what the system checks let through."""

from __future__ import annotations

import pytest
from django.test import override_settings

from dynasem.checks import check_settings
from tests.app.test_checks import VALID


@pytest.mark.parametrize("name", ["my locks", "locks/prod", "locks:prod", "lócks"])
def test_a_table_name_dynamodb_refuses_is_a_check_error(name):
    """DynamoDB's table names are 3 to 255 of [a-zA-Z0-9_.-]. E003 checks only the length,
    so "my locks" passes `manage.py check` and every acquire then fails at its first request
    with DynamoDB's (or botocore's) own ValidationException, not naming DYNASEM."""
    with override_settings(DYNASEM={**VALID, "TABLE_NAME": name}):
        assert "dynasem.E003" in [m.id for m in check_settings()]


def test_an_acquire_on_a_table_name_dynamodb_refuses_says_which_setting(lock_table, settings):
    """What the user meets at run time with such a name."""
    from dynasem import semaphore

    settings.DYNASEM = {**settings.DYNASEM, "TABLE_NAME": "my locks"}
    with pytest.raises(Exception) as caught:
        with semaphore("review6-table", wait=0):
            pass
    assert "TABLE_NAME" in str(caught.value), f"{type(caught.value).__name__}: {caught.value}"
