"""Review 36e (the round's own mends of re-entry records and held responses, read again):
holes shown through public behaviour or the stored rows."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from typing import Any

import pytest

from dynasem import release_all, semaphore
from dynasem._engine import reentry
from dynasem._operators.locks import holds_on

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.reentry]


def tokens(resource: str) -> set[str]:
    return {h.token for h in holds_on(resource) if h.expires.timestamp() > time.time()}


def test_an_exit_stacks_block_in_a_generator_left_inside_another_block_of_its_semaphore(
    lock_table: str,
) -> None:
    """A generator enters a counting semaphore (limit=2) through an ``ExitStack`` in one
    context and is finished inside another context's own block of the same object. Its
    exit's frame (``ExitStack.__exit__``) is not its enter's (``enter_context``): no record
    by frame, so the exit took this context's innermost block: this block's hold given back
    while it works, the generator's kept, renewed for nobody. Mended: a block entered and
    left through helpers called by one frame (the generator's) is found by that frame."""
    lock = semaphore("r36e-stack-gen", limit=2, wait=0)

    def work() -> Any:
        with contextlib.ExitStack() as stack:
            stack.enter_context(lock)
            yield "inside"
        yield "after"

    it = work()
    assert contextvars.copy_context().run(next, it) == "inside"
    seen: dict[str, Any] = {}
    try:
        with contextlib.suppress(RuntimeError), lock as mine:
            assert next(it) == "after"  # the generator's block is left here
            seen["mine released"] = mine.released
            seen["tokens"] = tokens("r36e-stack-gen")
            seen["mine"] = mine.token
        assert seen["mine released"] is False, "the generator's exit gave back this block's hold"
        assert seen["tokens"] == {seen["mine"]}, "the generator's hold is kept, for nobody"
        assert tokens("r36e-stack-gen") == set()
        assert [k for k in reentry._open_blocks if k[0] == id(lock)] == []
    finally:
        release_all()


def test_an_async_exit_stacks_block_in_an_async_generator_closed_by_another_task(
    lock_table: str,
) -> None:
    """The same with ``async with``: an async generator entered the semaphore through an
    ``AsyncExitStack`` in one task, and another task, inside its own block of the same
    object, reads it to its end."""
    lock = semaphore("r36e-astack-gen", limit=2, wait=0)

    async def work() -> Any:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(lock)
            yield "inside"
        yield "after"

    async def main() -> dict[str, Any]:
        it = work()
        assert await asyncio.create_task(it.__anext__()) == "inside"  # entered in a task
        seen: dict[str, Any] = {}
        with contextlib.suppress(RuntimeError):
            async with lock as mine:
                assert await it.__anext__() == "after"  # left in this one
                seen["mine released"] = mine.released
                seen["tokens"] = tokens("r36e-astack-gen")
                seen["mine"] = mine.token
        return seen

    try:
        seen = asyncio.run(main())
        assert seen["mine released"] is False, "the generator's exit gave back this block's hold"
        assert seen["tokens"] == {seen["mine"]}, "the generator's hold is kept, for nobody"
        assert tokens("r36e-astack-gen") == set()
    finally:
        release_all()


@pytest.mark.parametrize("nested", [False, True])
def test_a_block_exit_interrupted_before_its_release_began_is_not_kept_for_nobody(
    lock_table: str, monkeypatch: pytest.MonkeyPatch, nested: bool
) -> None:
    """Ctrl-C (or a Celery task's soft time limit: a signal handler's exception) lands in a
    ``with`` block's exit after its block was left (``reentry.left``) and before the release
    began: at ``leave``'s first line, or ``release``'s, ahead of its guard (the interrupt
    stands in here for the signal at that call). The exit does not run again. The hold was
    renewed on, for nobody, while the process lived (a worker goes on to its next task); a
    nested block's depth stayed counted, so the outer block's exit gave back nothing and
    the lock was kept for good. Mended: an exit whose release never began leaves the hold
    as an interrupted release does (left to its lease, renewed and re-entered no more; given
    back at exit), or, nested, gives back its depth."""
    from dynasem._engine import core
    from tests.engine.test_heartbeat import LEASE, heartbeats_of, wait_for_renewal

    resource = f"r36e-exit-cut-{nested}"
    sem = semaphore(resource, lease=LEASE)
    real = core.leave

    def leave(held: Any, raised: bool) -> None:
        monkeypatch.setattr(core, "leave", real)
        raise KeyboardInterrupt  # the signal, before the release's first step

    try:
        with contextlib.ExitStack() as outer:
            if nested:
                held = outer.enter_context(sem)
            with pytest.raises(KeyboardInterrupt), sem as inner:
                if not nested:
                    held = inner
                wait_for_renewal(held)
                monkeypatch.setattr(core, "leave", leave)
        time.sleep(2 * (LEASE - 0.5) / 3 + 0.15)  # two renewals would have been due
        assert heartbeats_of(resource) == [], "the hold is renewed on, for nobody"
        with semaphore(resource, lease=LEASE, wait=3 * LEASE) as again:
            assert again.token != held.token
    finally:
        release_all()


def test_a_leadership_exit_interrupted_before_its_give_back_began_is_not_kept_for_nobody(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a leadership block: interrupted at ``_give_back``'s first line, its lead
    was renewed on for nobody, and no other process could lead while this one lived."""
    from dynasem import leadership
    from dynasem._background.leadership import Leadership
    from tests.engine.test_heartbeat import LEASE, heartbeats_of, wait_for_renewal

    real = Leadership._give_back

    def give_back(lead: Any) -> None:
        monkeypatch.setattr(Leadership, "_give_back", real)
        raise KeyboardInterrupt  # the signal, before the give-back's first step

    try:
        with pytest.raises(KeyboardInterrupt), leadership("r36e-lead", lease=LEASE) as lead:
            wait_for_renewal(lead.held)
            monkeypatch.setattr(Leadership, "_give_back", staticmethod(give_back))
        time.sleep(2 * (LEASE - 0.5) / 3 + 0.15)  # two renewals would have been due
        assert heartbeats_of(lead.held.resource) == [], "the lead is renewed on, for nobody"
    finally:
        release_all()


def test_a_run_once_exit_interrupted_before_its_end_began_is_not_kept_for_nobody(
    lock_table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a ``run_once`` block: interrupted at ``_leave``'s first line (ahead of
    its own guard), the job sat RUNNING, renewed on for nobody while the process lived:
    never finished, never run again."""
    from dynasem import run_once
    from dynasem._background.run_once import RunOnce
    from tests.engine.test_heartbeat import LEASE, heartbeats_of

    real = RunOnce._leave

    def leave(self: Any, job: Any, exc: Any) -> None:
        monkeypatch.setattr(RunOnce, "_leave", real)
        raise KeyboardInterrupt  # the signal, before the end's first step

    try:
        with pytest.raises(KeyboardInterrupt), run_once("r36e-job", lease=LEASE) as job:
            monkeypatch.setattr(RunOnce, "_leave", leave)
        time.sleep(2 * (LEASE - 0.5) / 3 + 0.15)  # two renewals would have been due
        assert heartbeats_of(job.resource) == [], "the job is renewed on, for nobody"
    finally:
        release_all()


@pytest.mark.parametrize("kind", ["sync", "async", "stacked"])
def test_a_template_response_rendered_under_asgi_reenters_its_views_hold(
    lock_table: str, kind: str
) -> None:
    """Under ASGI Django runs a sync view in one ``sync_to_async`` call and renders its
    ``TemplateResponse`` in another (an async view's, too): another holder than the view for
    re-entry. Since the hold goes with the response until it is rendered (5e73a58), code the
    template runs that takes the view's lock again (a model method guarded by the same
    ``semaphore``) waited on the view's own hold until its ``wait`` ran out (SemaphoreBusy,
    a 500), where under WSGI (one thread) it re-enters it, and before 5e73a58 found it
    free. (``stacked``: the lock the template takes is the inner of two decorators'.)"""
    from asgiref.sync import sync_to_async
    from django.template import engines
    from django.template.response import SimpleTemplateResponse
    from django.test import RequestFactory

    from dynasem import SemaphoreBusy

    resource = f"r36e-render-{kind}:1"
    seen: list[str] = []

    class Rows:  # what the template shows: guarded by the view's lock too
        def __str__(self) -> str:
            try:
                with semaphore(resource, wait=0.5):
                    seen.append("taken")
            except SemaphoreBusy:
                seen.append("busy")
            return "rows"

    def answer() -> SimpleTemplateResponse:
        return SimpleTemplateResponse(engines["django"].from_string("{{ rows }}"), {"rows": Rows()})

    if kind == "sync":

        @semaphore("r36e-render-sync:{n}")
        def view(request: Any, n: int) -> Any:
            return answer()

        asgi_view: Any = sync_to_async(view)
    elif kind == "stacked":

        @semaphore("r36e-render-outer:{n}")
        @semaphore("r36e-render-stacked:{n}")
        def stacked(request: Any, n: int) -> Any:
            return answer()

        asgi_view = sync_to_async(stacked)
    else:

        @semaphore("r36e-render-async:{n}")
        async def asgi_view(request: Any, n: int) -> Any:
            return answer()

    async def handler() -> Any:  # what Django's ASGI handler does with a view's answer
        response = await asgi_view(RequestFactory().get("/"), n=1)
        return await sync_to_async(response.render)()

    try:
        response = asyncio.run(handler())
        assert response.content == b"rows"
        assert seen == ["taken"], "the template's acquire waited on the view's own hold"
        assert tokens(resource) == set()
    finally:
        release_all()


@pytest.mark.parametrize("how", ["body", "close", "render"])
def test_a_responses_give_back_interrupted_before_its_release_began_is_not_kept_for_nobody(
    lock_table: str, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A view's response carries its hold past the view (a streaming body, a template
    response rendered by Django's handler): its give-back (the body's ``finally``,
    ``close()``, the post-render callback) took the hold off its once-only list, then left
    it. Ctrl-C (or a signal handler's exception) landing at ``leave``'s first line (the
    interrupt stands in here for the signal at that call) left the hold renewed by its
    heartbeat for nobody while the process lived, the drop-finalizer finding the list empty.
    Mended as a block's exit is: a give-back whose release never began leaves the hold to
    its lease, renewed and re-entered no more."""
    from django.http import StreamingHttpResponse
    from django.template import engines
    from django.template.response import SimpleTemplateResponse
    from django.test import RequestFactory

    from dynasem import current_hold
    from dynasem._engine import decorators
    from tests.engine.test_heartbeat import LEASE, heartbeats_of, wait_for_renewal

    resource = f"r36e-give-back-cut-{how}"
    seen: list[Any] = []

    @semaphore(resource, lease=LEASE)
    def view(request: Any) -> Any:
        seen.append(current_hold())
        if how == "render":
            template = engines["django"].from_string("rows")
            return SimpleTemplateResponse(template, {})
        return StreamingHttpResponse(iter([b"rows"]))

    real = decorators.leave

    def leave(held: Any, raised: bool) -> None:
        monkeypatch.setattr(decorators, "leave", real)
        raise KeyboardInterrupt  # the signal, before the release's first step

    try:
        response = view(RequestFactory().get("/"))
        (held,) = seen
        wait_for_renewal(held)
        monkeypatch.setattr(decorators, "leave", leave)
        with pytest.raises(KeyboardInterrupt):
            if how == "body":
                assert b"".join(response.streaming_content) == b"rows"
            elif how == "close":
                response.close()
            else:
                response.render()
        time.sleep(2 * (LEASE - 0.5) / 3 + 0.15)  # two renewals would have been due
        assert heartbeats_of(resource) == [], "the hold is renewed on, for nobody"
        with semaphore(resource, lease=LEASE, wait=3 * LEASE) as again:
            assert again.token != held.token
        del response
    finally:
        release_all()
