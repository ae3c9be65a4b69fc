"""When a task refused by a busy lock should run again: the busy estimate plus jitter.

Shared by the task-queue integrations (``dynasem.celery``, ``dynasem.django_tasks``); it
knows nothing of either framework.
"""

from __future__ import annotations

import random

# The jitter window never grows past this many seconds, however many refusals came before:
# a retry is at most ``retry_after`` plus five minutes away (and ``retry_after`` is never
# more than LEASE + CLOCK_SKEW). Well below the visibility timeout of Celery's Redis and SQS
# transports (1 h and 30 min by default), past which the broker would deliver a retry that
# a worker keeps waiting for its countdown a second time.
MAX_JITTER = 300.0


def retry_delay(
    retry_after: float,
    refusals: int,
    *,
    max_jitter: float = MAX_JITTER,
    rng: random.Random | None = None,
) -> float:
    """Seconds until a task refused ``refusals`` times before (0 for the first refusal) should
    try again: ``retry_after`` (nothing can be gained sooner) plus a random delay drawn
    uniformly from a window of ``retry_after * 2**refusals`` seconds, at most ``max_jitter``.

    The tasks a lock refuses at once all hear the same estimate; the jitter spreads their
    retries so they do not come back together, and the window doubles each time a task is
    refused again, because every refusal says that more tasks want the lock than one estimate
    serves. ("Full jitter" above a floor: AWS Architecture Blog, *Exponential Backoff And
    Jitter*, 2015.)
    """
    window = min(max_jitter, retry_after * 2.0 ** min(refusals, 64))
    # The module's generator by default: Python reseeds it in a forked child (a prefork
    # worker's processes), so two children never draw the same delays.
    draw = (rng or random).uniform(0.0, window) if window > 0 else 0.0
    return retry_after + draw
