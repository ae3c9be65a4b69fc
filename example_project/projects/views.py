"""The dynasem demo: "Purge and rebuild" a project's issues, one rebuild at a time.

A rebuild deletes every row of one project from the ``Issue`` table and inserts a fresh set,
inside the request's transaction (``ATOMIC_REQUESTS = True``). Two rebuilds of the same
project at once would interleave their deletes and inserts and leave two rebuilds' rows (or
none), so every rebuild holds the distributed semaphore ``tbl_issues:<project_id>``, kept in
DynamoDB: across threads, processes and hosts at most one rebuild of a project runs at a
time, while rebuilds of different projects run side by side. The lock is given back after
the transaction commits, so the next rebuild starts from committed rows.

Three ways to take that lock; all name the same resource, so they also exclude each other:

1. ``purge_and_rebuild``: the view decorator. When the lock is busy the view is not called
   and the client gets HTTP 423 Locked with a ``Retry-After`` header.
2. ``PurgeAndRebuildView``: the same decorator on a class-based view, via ``method_decorator``.
3. ``purge_and_rebuild_with_fence``: ``with semaphore(...) as held`` inside the view, for when
   the view wants to answer "busy" itself.
4. ``purge_and_rebuild_coalesced``: a burst of requests gets one rebuild going and one after
   it (``coalesce=True``): the request that finds the lock busy first waits and runs next;
   every later one answers 202 Accepted at once, covered by that next rebuild, which starts
   after it arrived. Its transaction is fenced by the database (``fence_db=True``): a rebuild
   stalled past its lease cannot commit over the next one's.

Every variant reaches its hold (``current_hold()``): ``held.fence`` grows with every holder;
hand it to the storage you write to so that it can refuse a writer whose lease has run out.

Run ``make demo``, log in as demo/demo and press "Rebuild twice at once": two POSTs hit the
same project together, one answers 200 after the rebuild, the other 423 at once.
``scripts/load_rebuild.py`` fires many at once through gunicorn on PostgreSQL and counts
what every project ends with, against two variants served only for it (``DEMO_LOAD_VARIANTS``).
"""

from __future__ import annotations

from typing import Any

import django
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.contrib.auth.mixins import LoginRequiredMixin
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.http import require_POST

from dynasem import Held, SemaphoreBusy, current_hold, resource_key, semaphore

from .models import Issue, purge_and_insert

PROJECTS = range(1, 6)

HAS_TASKS = django.VERSION >= (6, 0)  # django.tasks, for the background rebuild

# One resource per project: the lock is on the data, not on the view that touches it.
RESOURCE = "tbl_issues:{project_id}"


@login_required
def index(request: HttpRequest) -> HttpResponse:
    """The project list, with a form per project and the "Rebuild twice at once" button."""
    rows = {p: Issue.objects.filter(project=p) for p in PROJECTS}
    projects = [
        {
            "id": p,
            "rows": rows[p].count(),
            "rebuilds": sorted(set(rows[p].values_list("rebuild", flat=True))),
        }
        for p in PROJECTS
    ]
    return render(
        request,
        "projects/index.html",
        {
            "projects": projects,
            "rebuild_seconds": settings.DEMO_REBUILD_SECONDS,
            "has_tasks": HAS_TASKS,
        },
    )


# 1. The view decorator. Order matters: require_POST and login_required come first (outside),
#    so a GET gets 405 and an anonymous user is sent to the login page without the lock ever
#    being taken. The semaphore wraps only the real work and records request.user as holder.
@require_POST
@login_required
# wait=0 by default: one attempt; busy -> 423 + Retry-After at once.
@semaphore(RESOURCE, wait=settings.DEMO_REBUILD_WAIT)
def purge_and_rebuild(request: HttpRequest, project_id: int) -> HttpResponse:
    """Rebuild one project's issues; the decorator lets one request per project in."""
    return _rebuild(request, project_id, variant="decorator")


# 2. A class-based view: decorate the method that does the work. LoginRequiredMixin runs in
#    dispatch(), before post(), so here too anonymous users are redirected, not locked.
@method_decorator(semaphore(RESOURCE, wait=settings.DEMO_REBUILD_WAIT), name="post")
class PurgeAndRebuildView(LoginRequiredMixin, View):
    """The same rebuild as a class-based view."""

    http_method_names = ["post"]  # like @require_POST: anything else is 405

    def post(self, request: HttpRequest, project_id: int) -> HttpResponse:
        return _rebuild(request, project_id, variant="class-based view")


# 3. The context manager, when the view wants to answer "busy" itself. Inside
#    ATOMIC_REQUESTS' transaction, leaving the block gives the lock back after the commit too.
@require_POST
@login_required
def purge_and_rebuild_with_fence(request: HttpRequest, project_id: int) -> HttpResponse:
    """The same rebuild, holding the lock with ``with semaphore(...) as held``."""
    # The same key the decorator builds (resource_key formats values of letters, digits,
    # "-", "_" and "." as written), so all three variants really contend for one lock.
    resource = resource_key(RESOURCE, project_id=project_id)
    try:
        with semaphore(resource, user=request.user, wait=settings.DEMO_REBUILD_WAIT):
            return _rebuild(request, project_id, variant="with semaphore() as held")
    except SemaphoreBusy as busy:
        response = _respond(
            request,
            {
                "project": project_id,
                "error": "busy",
                "detail": str(busy),
                "retry_after": busy.retry_after,
                "holder_user_id": busy.holder_user_id,
            },
            status=423,
        )
        response["Retry-After"] = str(busy.retry_after)
        return response


# 4. Coalesced and fenced: at most one rebuild going and one next; the database refuses a stale
#    holder's transaction (dynasem_fence, written first in the request's transaction).
@require_POST
@login_required
@semaphore(RESOURCE, wait=settings.DEMO_COALESCED_WAIT, coalesce=True, fence_db=True)
def purge_and_rebuild_coalesced(request: HttpRequest, project_id: int) -> HttpResponse:
    """Rebuild one project's issues; a burst of requests gets at most two rebuilds."""
    return _rebuild(request, project_id, variant="coalesced")


# 5. In the background: a unique django.tasks task (projects/tasks.py). One rebuild of the
#    project queued or running at a time; enqueueing another meanwhile enqueues nothing.
@require_POST
@login_required
def rebuild_in_background(request: HttpRequest, project_id: int) -> HttpResponse:
    """Enqueue the project's rebuild unless one is queued or running already: 202 either way,
    saying which."""
    if project_id not in PROJECTS:
        raise Http404(f"No project {project_id}")
    if not HAS_TASKS:
        raise Http404("Background rebuilds need django.tasks (Django >= 6.0)")
    from .tasks import rebuild_in_background as task

    result = task.enqueue(project_id)
    data: dict[str, Any] = {
        "project": project_id,
        "variant": "unique task",
        "enqueued": result is not None,
        "task_id": None if result is None else str(result.id),
        "backend": settings.TASKS["default"]["BACKEND"] if HAS_TASKS else None,
        "detail": (
            f"rebuild of project {project_id} enqueued"
            if result is not None
            else f"a rebuild of project {project_id} is already queued or running: not enqueued"
        ),
    }
    return _respond(request, data, status=202)


# What the load script compares against, served only with DEMO_LOAD_VARIANTS: the same
# rebuild without any lock, and with a lock given back when the view returns, before
# ATOMIC_REQUESTS commits (on_commit=False: what every lock did before dynasem followed the
# transaction).
@require_POST
@login_required
def purge_and_rebuild_unlocked(request: HttpRequest, project_id: int) -> HttpResponse:
    """The rebuild with no lock at all."""
    _load_variants_only()
    return _rebuild(request, project_id, variant="no lock")


@require_POST
@login_required
@semaphore(RESOURCE, wait=settings.DEMO_REBUILD_WAIT, on_commit=False)
def purge_and_rebuild_released_before_commit(request: HttpRequest, project_id: int) -> HttpResponse:
    """The rebuild whose lock goes back before its transaction commits."""
    _load_variants_only()
    return _rebuild(request, project_id, variant="lock given back before the commit")


def _load_variants_only() -> None:
    if not settings.DEMO_LOAD_VARIANTS:
        raise Http404("Only served with DEMO_LOAD_VARIANTS=true")


def _rebuild(request: HttpRequest, project_id: int, *, variant: str) -> HttpResponse:
    """Purge the project's issues and insert a fresh set, all in the request's transaction."""
    if project_id not in PROJECTS:
        raise Http404(f"No project {project_id}")
    started = timezone.now()
    deleted, rebuild = purge_and_insert(project_id)
    finished = timezone.now()
    held: Held | None
    try:
        held = current_hold()  # the decorator's or the with block's hold
    except LookupError:
        held = None  # the unlocked variant
    data: dict[str, Any] = {
        "project": project_id,
        "user": request.user.get_username(),
        "variant": variant,
        "started": started.isoformat(),
        "finished": finished.isoformat(),
        "seconds": round((finished - started).total_seconds(), 2),
        "deleted": deleted,
        "inserted": settings.DEMO_ISSUES_PER_PROJECT,
        "rebuild": rebuild,
        "resource": held.resource if held is not None else None,
        # held.fence would go along with every write of the rebuild, and the storage would
        # refuse a write whose fence is smaller than one it has already seen.
        "fence": held.fence if held is not None else None,
        "token": held.token if held is not None else None,
    }
    return _respond(request, data)


def _respond(request: HttpRequest, data: dict[str, Any], status: int = 200) -> HttpResponse:
    # The page's script asks for JSON; a plain form submission gets a page.
    if "application/json" in request.headers.get("Accept", ""):
        return JsonResponse(data, status=status)
    return render(request, "projects/result.html", {"result": data}, status=status)
