"""Review 38l: the errors of bad input name what was wrong, as their neighbours' do."""

from __future__ import annotations

import pytest

from dynasem import current_hold, resource_key, semaphore


@pytest.mark.parametrize(
    ("template", "args", "kwargs"),
    [("deploy:{slug}", (), {}), ("row:{0}:{1}", (7,), {}), ("u:{user.pk}", (), {"user": 3})],
)
def test_resource_key_missing_a_field_is_a_value_error_naming_it(template, args, kwargs):
    """The decorator says a template names a value its call lacks as a ValueError; the same
    template given to resource_key() by the code outside it raised str.format's bare KeyError
    ("'slug'"), which an ``except ValueError`` meant for bad keys let through."""
    with pytest.raises(ValueError, match="resource template .* names") as raised:
        resource_key(template, *args, **kwargs)
    assert template in str(raised.value)


@pytest.mark.parametrize("resource", [5, b"deploy:web", ["deploy:web"]])
def test_current_hold_of_a_resource_that_is_no_str_is_a_type_error(lock_table, resource):
    """``current_hold(5)`` (a pk passed for its resource) raised LookupError, "no dynasem hold
    is entered here on 5": read as "not locked" by code that catches it, inside a block that
    holds the very lock."""
    with semaphore("deploy:web"), pytest.raises(TypeError, match="resource must be a str"):
        current_hold(resource)
