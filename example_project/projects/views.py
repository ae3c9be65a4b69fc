"""The dynasem demo: "Purge and rebuild" a project's issue table, one rebuild at a time.

A rebuild drops and refills the (imaginary) table ``tbl_issues`` of one project. Two rebuilds
of the same project at once would interleave their deletes and inserts, so every rebuild holds
the distributed semaphore ``tbl_issues:<project_id>``, kept in DynamoDB: across threads,
processes and hosts at most one rebuild of a project runs at a time, while rebuilds of
different projects run side by side.

Three ways to take that lock; all name the same resource, so they also exclude each other:

1. ``purge_and_rebuild``: the view decorator. When the lock is busy the view is not called
   and the client gets HTTP 423 Locked with a ``Retry-After`` header.
2. ``PurgeAndRebuildView``: the same decorator on a class-based view, via ``method_decorator``.
3. ``purge_and_rebuild_with_fence``: ``with semaphore(...) as held`` inside the view, for when
   the view needs the hold itself. ``held.fence`` grows with every holder; hand it to the
   storage you write to so that it can refuse a writer whose lease has already run out.

Run ``make demo``, log in as demo/demo and press "Rebuild twice at once": two POSTs hit the
same project together, one answers 200 after the rebuild, the other 423 at once.
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.contrib.auth.mixins import LoginRequiredMixin
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.http import require_POST

from dynasem import SemaphoreBusy, resource_key, semaphore

PROJECTS = range(1, 6)

# One resource per project: the lock is on the data, not on the view that touches it.
RESOURCE = "tbl_issues:{project_id}"


@login_required
def index(request: HttpRequest) -> HttpResponse:
    """The project list, with a form per project and the "Rebuild twice at once" button."""
    return render(
        request,
        "projects/index.html",
        {"projects": PROJECTS, "rebuild_seconds": settings.DEMO_REBUILD_SECONDS},
    )


# 1. The view decorator. Order matters: require_POST and login_required come first (outside),
#    so a GET gets 405 and an anonymous user is sent to the login page without the lock ever
#    being taken. The semaphore wraps only the real work and records request.user as holder.
@require_POST
@login_required
@semaphore(RESOURCE, wait=0)  # wait=0: one attempt; busy -> 423 + Retry-After at once
def purge_and_rebuild(request: HttpRequest, project_id: int) -> HttpResponse:
    """Rebuild one project's issues; the decorator lets one request per project in."""
    return _rebuild(request, project_id, variant="decorator")


# 2. A class-based view: decorate the method that does the work. LoginRequiredMixin runs in
#    dispatch(), before post(), so here too anonymous users are redirected, not locked.
@method_decorator(semaphore(RESOURCE, wait=0), name="post")
class PurgeAndRebuildView(LoginRequiredMixin, View):
    """The same rebuild as a class-based view."""

    http_method_names = ["post"]  # like @require_POST: anything else is 405

    def post(self, request: HttpRequest, project_id: int) -> HttpResponse:
        return _rebuild(request, project_id, variant="class-based view")


# 3. The context manager, when the view wants the hold itself (here: to show its fence).
#    Busy is then ours to answer; we answer like the decorator does.
@require_POST
@login_required
def purge_and_rebuild_with_fence(request: HttpRequest, project_id: int) -> HttpResponse:
    """The same rebuild, holding the lock with ``with semaphore(...) as held``."""
    # The same key the decorator builds (resource_key formats values of letters, digits,
    # "-", "_" and "." as written), so all three variants really contend for one lock.
    resource = resource_key(RESOURCE, project_id=project_id)
    try:
        with semaphore(resource, user=request.user, wait=0) as held:
            # held.fence would go along with every write of the rebuild, and the storage
            # would refuse a write whose fence is smaller than one it has already seen.
            return _rebuild(request, project_id, variant="with semaphore() as held", held=held)
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


def _rebuild(
    request: HttpRequest, project_id: int, *, variant: str, held: Any = None
) -> HttpResponse:
    """The pretend work: sleep DEMO_REBUILD_SECONDS, then report who rebuilt what, and when."""
    if project_id not in PROJECTS:
        raise Http404(f"No project {project_id}")
    started = timezone.now()
    # Stands in for "DELETE FROM tbl_issues WHERE project = %s" and the slow refill after it.
    time.sleep(settings.DEMO_REBUILD_SECONDS)
    finished = timezone.now()
    data: dict[str, Any] = {
        "project": project_id,
        "user": request.user.get_username(),
        "variant": variant,
        "started": started.isoformat(),
        "finished": finished.isoformat(),
        "seconds": round((finished - started).total_seconds(), 2),
        # The decorator does not hand its hold to the view, so only variant 3 knows these.
        "resource": held.resource if held is not None else RESOURCE.format(project_id=project_id),
        "fence": held.fence if held is not None else None,
        "token": held.token if held is not None else None,
    }
    return _respond(request, data)


def _respond(request: HttpRequest, data: dict[str, Any], status: int = 200) -> HttpResponse:
    # The page's script asks for JSON; a plain form submission gets a page.
    if "application/json" in request.headers.get("Accept", ""):
        return JsonResponse(data, status=status)
    return render(request, "projects/result.html", {"result": data}, status=status)
