"""``manage.py run_scheduler``: the demo's stand-in for celery beat or an APScheduler, the kind
of process exactly one host may run. Run it under ``dynasem_lead`` on every host::

    python manage.py dynasem_lead scheduler -- python manage.py run_scheduler

It ticks every second, saying which leader (fence) it runs under, and stops cleanly on
SIGTERM, which ``dynasem_lead`` sends before its lead can be taken over."""

from __future__ import annotations

import os
import signal
import socket
import threading
from typing import Any

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "A toy scheduler that ticks every second: run it under dynasem_lead."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--every", type=float, default=1.0, help="seconds between ticks")

    def handle(self, *args: Any, every: float, **options: Any) -> None:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        fence = os.environ.get("DYNASEM_LEAD_FENCE", "none")
        who = f"{socket.gethostname()}:{os.getpid()}"
        tick = 0
        self.stdout.write(f"scheduler {who}: started (lead fence {fence})")
        while not stop.wait(every):
            tick += 1
            self.stdout.write(f"scheduler {who}: tick {tick} (lead fence {fence})")
        self.stdout.write(f"scheduler {who}: SIGTERM, stopped after {tick} ticks")
