"""dynasem: distributed semaphores for Django on Amazon DynamoDB."""

from __future__ import annotations

__version__ = "0.2.0"

from ._background.leadership import Lead, leadership  # noqa: E402
from ._background.run_once import Job, run_once  # noqa: E402
from ._engine.core import Semaphore, semaphore  # noqa: E402
from ._engine.decorators import busy_response, coalesced_response, resource_key  # noqa: E402
from ._engine.hold import Held  # noqa: E402
from ._engine.reentry import current_hold  # noqa: E402
from ._engine.shutdown import release_all  # noqa: E402
from ._operators.locks import queue_depth, waiters_on  # noqa: E402
from .exceptions import (
    AlreadyDone,
    Coalesced,
    LimitExceeded,
    LockLost,
    SemaphoreBusy,
    SemaphoreError,
    SemaphoreUnavailable,
    TableMissing,
)

__all__ = [
    "AlreadyDone",
    "Coalesced",
    "Held",
    "Job",
    "Lead",
    "LimitExceeded",
    "LockLost",
    "Semaphore",
    "SemaphoreBusy",
    "SemaphoreError",
    "SemaphoreUnavailable",
    "TableMissing",
    "__version__",
    "busy_response",
    "coalesced_response",
    "current_hold",
    "leadership",
    "queue_depth",
    "release_all",
    "resource_key",
    "run_once",
    "semaphore",
    "waiters_on",
]
