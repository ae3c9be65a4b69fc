"""Review 38f: a unique task's ``unique_key`` that can make no key (not a str template, a
list of them or a callable; or an empty template) is refused when the task is declared,
naming ``unique_key``, as a template naming no parameter is. It was accepted, and every
enqueue then failed (``TypeError: template must be a str, not int``; for ``""``, a
``BadKey`` about "this request's arguments")."""

from __future__ import annotations

from typing import Any

import django
import pytest


def work(project_id: int) -> int:
    return project_id


@pytest.mark.skipif(django.VERSION < (6, 0), reason="django.tasks is Django's from 6.0")
@pytest.mark.parametrize(
    ("unique_key", "error"),
    [(5, TypeError), (b"r:{project_id}", TypeError), ("", ValueError), (["r:a", 5], TypeError)],
    ids=["int", "bytes", "empty", "list-with-int"],
)
def test_a_unique_key_that_makes_no_key_is_refused_when_declared(
    unique_key: Any, error: type[Exception]
) -> None:
    from dynasem.django_tasks import unique_task

    with pytest.raises(error, match="unique_key"):
        unique_task(unique_key=unique_key)(work)
