"""Review 38 (helper j): what the decorator locks as a sync call."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

import pytest

from dynasem import semaphore
from dynasem._operators.locks import holds_on


def _logged(func: Callable[..., Any]) -> Callable[..., Any]:
    """A plain sync decorator, as many are: it hides what kind of function ``func`` is."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    return wrapper


def _listed(func: Callable[..., Any]) -> Callable[..., Any]:
    """A sync decorator that runs a generator function to its end: a plain list comes back."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return list(func(*args, **kwargs))

    return wrapper


def test_a_generator_function_under_a_sync_decorator_is_refused_not_run_unlocked(lock_table):
    """``@semaphore`` over a plain sync decorator that wraps a generator function (or an
    async one): the call returns the generator unstarted, so the lock was given back before
    its body ran, which then ran with no lock held, beside another caller's. A generator
    function is refused, and an ``async def`` hidden so (6ede99d): so is this, before its
    body begins."""
    inside: list[int] = []

    @semaphore("r38j-gen:{n}")
    @_logged
    def rows(n):
        inside.append(len(holds_on(f"r38j-gen:{n}")))
        yield n

    @semaphore("r38j-gen:{n}")
    @_logged
    async def arows(n):
        inside.append(len(holds_on(f"r38j-gen:{n}")))
        yield n

    async def drain() -> list[int]:
        return [n async for n in arows(2)]

    for call in (lambda: list(rows(1)), lambda: asyncio.run(drain())):
        with pytest.raises(TypeError, match="generator"):
            call()
    assert inside == [], f"the bodies ran, holders of their locks then: {inside}"
    assert holds_on("r38j-gen:1") == [] and holds_on("r38j-gen:2") == []


def test_a_sync_decorator_that_runs_a_generator_function_to_its_end_is_locked(lock_table):
    """What such a decorator returns (a list) is no generator: locked and run as a sync
    call."""
    inside: list[int] = []

    @semaphore("r38j-listed")
    @_listed
    def rows():
        inside.append(len(holds_on("r38j-listed")))
        yield 1

    assert rows() == [1]
    assert inside == [1]
