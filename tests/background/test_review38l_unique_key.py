"""Review 38l: a unique task's ``unique_key`` given as a list of templates makes several
keys, and a task has one: refused when the task is declared, naming ``unique_key``. Review
38f let it through (a list of str templates is a decorator's resource), and every enqueue
then failed: "unique_key must make one key, not [...]"."""

from __future__ import annotations

from typing import Any

import django
import pytest


def work(project_id: int) -> int:
    return project_id


@pytest.mark.skipif(django.VERSION < (6, 0), reason="django.tasks is Django's from 6.0")
@pytest.mark.parametrize("unique_key", [["r:{project_id}"], ("a:{project_id}", "b:{project_id}")])
def test_a_unique_key_of_several_templates_is_refused_when_declared(unique_key: Any) -> None:
    from dynasem.django_tasks import unique_task

    with pytest.raises(TypeError, match="unique_key must be one str template or a callable"):
        unique_task(unique_key=unique_key)(work)


@pytest.mark.parametrize("name", ["", "x" * 1100, "a\x1bb"], ids=["empty", "long", "control"])
def test_a_task_key_that_cannot_be_a_resource_names_the_tasks_arguments_not_a_request(
    name: str,
) -> None:
    """An enqueue has no request: its error named "this request's arguments", which sent a
    reader of a worker's log looking for a view."""
    from dynasem._background import unique
    from dynasem._engine.decorators import BadKey, KeyMaker

    def callable_key(name: str) -> str:
        return name  # a callable's key is used as returned: its control characters too

    template = callable_key if name == "a\x1bb" else "{name}"
    with pytest.raises(BadKey) as raised:
        unique.key_for("app.reindex", KeyMaker(template, callable_key), (), {"name": name})
    assert "request" not in str(raised.value)
    assert "app.reindex" in str(raised.value) and "unique_key" in str(raised.value)
