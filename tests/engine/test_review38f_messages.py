"""Review 38f: what coalesce=True and fence_db=True say of a counting or shared semaphore
names its kind in words, not the one-letter value stored in the row ("not a s one")."""

from __future__ import annotations

import pytest

from dynasem import semaphore


@pytest.mark.parametrize(
    ("kind", "said"), [({"shared": True}, "a shared one"), ({"limit": 3}, "a counting one")]
)
@pytest.mark.parametrize("option", ["coalesce", "fence_db"])
def test_an_option_that_needs_an_exclusive_semaphore_names_the_kind_it_got(option, kind, said):
    with pytest.raises(ValueError, match=f"needs an exclusive semaphore .*, not {said}"):
        semaphore("tbl_issues:42", wait=5, **{option: True}, **kind)
