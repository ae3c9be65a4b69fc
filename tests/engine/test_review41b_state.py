"""Review (forty-first session, b): module-level and shared state across settings changes,
forks and threads.

Each test failed before the mend its docstring names, for the reason it states."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.test import override_settings

from dynasem._engine import arguments, push
from dynasem.conf import Settings, settings


class _ReadMidChange:
    """``Settings``' ``_kept`` and ``_version`` as properties: after each of the two is set
    (by ``forget``, as ``DYNASEM`` changes), ``read()`` runs there, as another thread's
    acquire would at that very point of the change."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, read: Any) -> None:
        self.read, self.armed, self.seen = read, False, []
        for name in ("_kept", "_version"):
            monkeypatch.setattr(Settings, name, self._attribute(name), raising=False)
        # The read runs inside forget's lock, as on another thread it would run beside it.
        monkeypatch.setattr(settings, "_lock", threading.RLock())

    def _attribute(self, name: str) -> property:
        def get(instance: Settings) -> Any:
            return instance.__dict__[name]

        def put(instance: Settings, value: Any) -> None:
            instance.__dict__[name] = value
            if self.armed:
                self.seen.append(self.read())

        return property(get, put)


def test_timing_read_as_the_settings_change_is_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """An acquire on another thread derived its lease, wait and skew (``arguments._kept``,
    which reads the settings' version unlocked) just as an override of ``DYNASEM`` ended:
    ``forget`` had moved the version on but not yet dropped the keys it kept, so the acquire
    read the override's keys and kept them under the new version, and every acquire after
    used the override's lease (and wait, and skew) though the override was over. Mend:
    ``conf.Settings.forget`` drops what it kept before the version moves on."""
    outer = arguments.resolve_timing(None, None)
    changing = _ReadMidChange(monkeypatch, lambda: arguments.resolve_timing(None, None))
    override = {**django_settings.DYNASEM, "LEASE": outer[0] + 7, "WAIT": outer[1] + 3}
    with override_settings(DYNASEM=override):
        inner = arguments.resolve_timing(None, None)  # every key read, and kept
        assert inner[:2] == (outer[0] + 7, outer[1] + 3)
        changing.armed = True
    changing.armed = False
    assert len(changing.seen) == 2  # read after each step of the change: either answer,
    assert arguments.resolve_timing(None, None) == outer  # but the settings' own after it


def test_two_threads_of_a_child_forked_without_hooks_keep_the_listener_one_opened(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a child forked by C code that runs no at-fork hook (a uWSGI worker with threads),
    two threads found ``push._pid`` the parent's at once (``_here``): the first replaced the
    parent's state and opened the child's listener (its first wait, registered there), then
    the second did the same again and closed that listener: its thread ended, its address
    in the waiter's entry reached nobody, and the waiter's slot was in no listener any more
    (its pushes lost, it read). Mend: ``push._after_fork`` does nothing once done for this
    process, and closes only a listener of another process."""
    for name in ("_lock", "_words_lock", "_failed_bind", "_short_until"):
        monkeypatch.setattr(push, name, getattr(push, name))
    monkeypatch.setattr(push, "_listener", None)  # this worker's own, if any, is left be
    monkeypatch.setattr(push, "_pid", -1)  # as in such a child: its parent's
    second, checked, first_done = threading.current_thread(), threading.Event(), threading.Event()
    real = push._after_fork

    def after_fork() -> None:
        if threading.current_thread() is second:  # past _here's check: waits for the first
            checked.set()
            assert first_done.wait(10)
        real()

    monkeypatch.setattr(push, "_after_fork", after_fork)
    opened: list[Any] = []

    def first() -> None:
        assert checked.wait(10)
        opened.append(push._get_listener())  # its first wait: _here, then the listener
        first_done.set()

    thread = threading.Thread(target=first)
    thread.start()
    try:
        push._here()  # the second thread: past its check before the first began
    finally:
        thread.join(10)
    listener = opened[0]
    try:
        assert listener is not None and push._listener is listener
        assert listener.sock.fileno() != -1 and listener.thread.is_alive()
    finally:
        for made in {id(x): x for x in (listener, push._listener) if x is not None}.values():
            made.sock.close()
