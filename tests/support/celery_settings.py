"""tests.support.settings for the Celery workers of test_celery_broker.py, with a shorter lease.

Until ``retry_after`` estimates when the live holder will be done (issue 21, point 1), it is
the time until a dead holder could be taken over, LEASE + CLOCK_SKEW: a lease of 3 s keeps the
60 tasks' retries within the test's time. ``DYNASEM_TEST_CELERY_LEASE`` sets another, to
measure the recipe with the lease users have (``LEASE`` 10: the other tests'; 60: the default).
"""

from __future__ import annotations

import os

from tests.support.settings import *  # noqa: F403
from tests.support.settings import DYNASEM

DYNASEM = {**DYNASEM, "LEASE": float(os.environ.get("DYNASEM_TEST_CELERY_LEASE", "3"))}
