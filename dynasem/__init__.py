"""dynasem: distributed semaphores for Django on Amazon DynamoDB."""

from __future__ import annotations

__version__ = "0.2.0"

from .core import Semaphore, semaphore  # noqa: E402
from .decorators import resource_key  # noqa: E402
from .entered import current_hold  # noqa: E402
from .exceptions import (  # noqa: E402
    AlreadyDone,
    Coalesced,
    LimitExceeded,
    LockLost,
    SemaphoreBusy,
    SemaphoreError,
    SemaphoreUnavailable,
    TableMissing,
)
from .held import Held  # noqa: E402
from .leadership import Lead, leadership  # noqa: E402
from .run_once import Job, run_once  # noqa: E402
from .shutdown import release_all  # noqa: E402

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
    "current_hold",
    "leadership",
    "release_all",
    "resource_key",
    "run_once",
    "semaphore",
]
