"""Review 38f: ``dynasem.testing.abandon`` given something that is no hold says so, naming
what it takes, instead of an ``AttributeError`` about ``_stop_heartbeat``."""

from __future__ import annotations

from typing import Any

import pytest

from dynasem import semaphore
from dynasem.testing import abandon


@pytest.mark.parametrize("not_a_hold", [None, "tbl_issues:42"], ids=["None", "str"])
def test_abandon_of_something_that_is_no_hold_is_a_type_error_naming_it(not_a_hold: Any):
    with pytest.raises(TypeError, match=r"abandon\(\) takes a hold .*, not "):
        abandon(not_a_hold)


def test_abandon_of_the_semaphore_instead_of_its_hold_says_what_to_pass():
    with pytest.raises(TypeError, match=r"acquire\(\)"):
        abandon(semaphore("tbl_issues:42"))
