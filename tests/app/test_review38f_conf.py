"""Review 38f: a ``DYNASEM`` setting that is not a dict (a table name given as the whole
setting, a list of pairs, None) is refused when read, as a key of a wrong type is: a
``TypeError`` naming ``DYNASEM`` before any request. It was read as no settings at all, so
an acquire went to AWS's default region and table ("dynasem-locks") wherever the system
checks do not run (gunicorn, a Celery worker) and only dynasem.E001 said so."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from dynasem import run_once, semaphore


@pytest.mark.parametrize(
    "bad",
    ["myproject-locks", [("TABLE_NAME", "myproject-locks")], None],
    ids=["str", "list", "None"],
)
def test_a_dynasem_setting_that_is_no_dict_is_refused_before_any_request(
    lock_table, requests_sent, bad: Any
):
    requests_sent.reset()
    with override_settings(DYNASEM=bad):
        with pytest.raises(TypeError, match=r"DYNASEM must be a dict"), semaphore("conf:1"):
            pass  # pragma: no cover - never entered
        with pytest.raises(TypeError, match=r"DYNASEM must be a dict"), run_once("conf:1"):
            pass  # pragma: no cover - never entered
    assert requests_sent.total == 0
