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


def test_a_limit_that_is_not_the_holders_names_each_side_as_it_was_asked(lock_table):
    """A shared hold stores limit 1: the error said "is held with limit=1" to a caller
    whose limit=4 met readers, and "not limit=1" to a reader that met a counting hold."""
    from dynasem.testing import held_elsewhere

    with held_elsewhere("file:a", shared=True):
        with pytest.raises(ValueError, match=r"'file:a' is held shared; .* not limit=4$"):
            semaphore("file:a", limit=4, wait=0).acquire()
    with held_elsewhere("exports", limit=3):
        with pytest.raises(ValueError, match=r"is held with limit=3; .* not shared=True$"):
            semaphore("exports", shared=True, wait=0).acquire()
        with pytest.raises(ValueError, match=r"is held with limit=3; .* not limit=12$"):
            semaphore("exports", limit=12, wait=0).acquire()
