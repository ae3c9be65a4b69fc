"""Views the decorator tests call; each records what it saw in ``CALLS``."""

from __future__ import annotations

import asyncio
import threading

from django.http import HttpResponse, JsonResponse
from django.utils.decorators import method_decorator
from django.views import View

from dynasem import semaphore

CALLS: list[str] = []
# Tests set GATE to hold a view inside its lock until they release it.
GATE = threading.Event()
GATE.set()


@semaphore("tbl_issues:{project_id}", wait=0)
def rebuild(request, project_id):
    CALLS.append(f"rebuild:{project_id}")
    GATE.wait(10)
    return HttpResponse(f"rebuilt {project_id}")


@semaphore("tbl_issues:{project_id}", wait=0)
async def arebuild(request, project_id):
    CALLS.append(f"arebuild:{project_id}")
    for _ in range(200):
        if GATE.is_set():
            break
        await asyncio.sleep(0.05)
    return HttpResponse(f"async rebuilt {project_id}")


@method_decorator(semaphore("tbl_issues:{project_id}", wait=0), name="post")
class RebuildView(View):
    def post(self, request, project_id):
        CALLS.append(f"cbv:{project_id}")
        GATE.wait(10)
        return HttpResponse(f"cbv rebuilt {project_id}")


@semaphore(
    lambda request, name: f"custom:{name}",
    wait=0,
    on_busy=lambda request, exc: JsonResponse({"busy": exc.resource}, status=409),
)
def custom_busy(request, name):
    CALLS.append(f"custom:{name}")
    GATE.wait(10)
    return HttpResponse("ok")


# What a view under ATOMIC_REQUESTS saw after its transaction committed (test_transactions.py).
AFTER_COMMIT: list[dict[str, object]] = []


@semaphore("txview:{name}", wait=0)
def write_in_transaction(request, name):
    from django.contrib.auth.models import User
    from django.db import connection, transaction

    from dynasem._operators.locks import holds_on

    User.objects.create(username=f"txview-{name}")
    in_transaction = connection.in_atomic_block

    def after_commit() -> None:
        # Registered before the decorator gives the lock back, but dynasem's give-back runs
        # first after the commit (a hook that raises must not keep the lock).
        AFTER_COMMIT.append(
            {
                "holders": len(holds_on(f"txview:{name}")),
                "in_atomic_block": connection.in_atomic_block,
                "committed": User.objects.filter(username=f"txview-{name}").exists(),
            }
        )

    transaction.on_commit(after_commit)
    return HttpResponse(f"in transaction: {in_transaction}")
