"""The rebuild as a background task: a unique ``django.tasks`` task (Django >= 6.0).

Pressing "Rebuild in the background" twenty times enqueues one rebuild of the project: while
it is queued or running, every other enqueue of it is refused (``enqueue()`` returns None)
and answered 202 "already queued or running". Its key, ``rebuild-queued:<project>``, is
held from the enqueue (for ``queue_lease``) through the run (renewed by the worker's
heartbeat) and given back when the task ends; a worker killed mid-task frees it when the
run lease (the LEASE setting) ends.

The key says "one rebuild of this project queued or running"; the data is guarded, as in the
views, by ``tbl_issues:<project>``, fenced in the database: a view's rebuild and the task's
exclude each other, and a task stalled past its lease cannot commit over the next rebuild.
With django-tasks-db installed the tasks go to the database and ``manage.py db_worker``
runs them (``make demo`` starts one); otherwise Django's ImmediateBackend runs them in the
request that enqueues them.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from dynasem import resource_key, semaphore
from dynasem.django_tasks import unique_task

from .models import purge_and_insert

# The views' resource: the lock is on the data, whoever rebuilds it.
DATA = "tbl_issues:{project_id}"


@unique_task(unique_key="rebuild-queued:{project_id}", queue_lease=600)
def rebuild_in_background(project_id: int) -> dict[str, Any]:
    """Purge and rebuild one project's issues, one such task per project at a time."""
    resource = resource_key(DATA, project_id=project_id)
    # fence_db: the block is a transaction whose first write is the hold's fence.
    with semaphore(
        resource, wait=settings.DEMO_COALESCED_WAIT, fence_db=True, user="background task"
    ) as held:
        deleted, rebuild = purge_and_insert(project_id)
    return {"project": project_id, "deleted": deleted, "rebuild": rebuild, "fence": held.fence}
