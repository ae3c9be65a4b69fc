"""Signals sent by dynasem; the sender is the semaphore's class.

Each is sent with ``resource``, ``user_id`` (ours), ``token`` and ``fence`` (where known).
"""

from __future__ import annotations

from django.dispatch import Signal

lock_acquired = Signal()
lock_released = Signal()
lock_busy = Signal()
lock_lost = Signal()
