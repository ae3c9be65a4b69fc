"""Admin pages over what dynasem keeps in DynamoDB: the holds (list, break one) and the
run_once keys (list, reset one).

As django-rq does for its queues: ``Lock`` and ``Job`` have no database table and only carry
the permissions (``dynasem.view_lock``, ``dynasem.release_lock``, ``dynasem.view_job``,
``dynasem.reset_job``); every view is wrapped by ``admin_site.admin_view`` and checks its own
permission; a destructive action is a POST (CSRF-protected) after a confirmation page, is
conditional on what that page showed, and is logged as a ``LogEntry``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import django
from django.contrib import admin, messages
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db import models
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse
from django.views.decorators.http import require_http_methods

from . import audit, clock, job_operations, operations, table, usernames, validation
from .exceptions import SemaphoreUnavailable
from .models import Job, Lock

if TYPE_CHECKING:  # django-stubs makes ModelAdmin generic; Django's own class is not subscriptable
    ModelAdmin = admin.ModelAdmin[models.Model]
else:
    ModelAdmin = admin.ModelAdmin


def _quick(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """``view`` with its DynamoDB requests on the quick client (``table.quick``): an operator
    is told within ~2 s that DynamoDB is unavailable, not kept waiting on a hung endpoint."""

    @functools.wraps(view)
    def inner(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        with table.quick():
            return view(request, *args, **kwargs)

    return inner


def _natural(key: str) -> list[tuple[int, int | str]]:
    """A sort key that puts ``upload:2`` before ``upload:10`` (numbers by value)."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", key)]


def _aware(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


class _ListPage:
    """What Django's admin/change_list.html reads of a ChangeList outside the blocks
    dynasem's templates fill (breadcrumbs, the filter panel's class, formset checks)."""

    has_filters = True
    has_active_filters = False
    is_facets_optional = False
    formset = None
    date_hierarchy = None

    def __init__(self, opts: Any):
        self.opts = opts


def human_span(seconds: int) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 07 min``, ``3 d 4 h``: as the pages' script counts."""
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h"


def expires_in(seconds: int) -> str:
    return f"in {human_span(seconds)}" if seconds >= 0 else f"expired {human_span(-seconds)} ago"


class DynamoDBAdmin(ModelAdmin):
    """What the admins of dynasem's table-less models share: no add/change/delete, pages of
    DynamoDB rows, holders shown by username where they are Django users."""

    list_per_page = 100
    # The one action page: its URL (``<action>/``, named ``..._<action>``) serves
    # ``action_view``, its confirmation on GET and the change itself on POST.
    action = ""

    def action_view(self, request: HttpRequest) -> HttpResponse:
        raise NotImplementedError

    def get_urls(self) -> list[Any]:
        info = self.opts.app_label, self.opts.model_name
        wrap = self.admin_site.admin_view
        confirm_then_post = require_http_methods(["GET", "POST"])(_quick(self.action_view))
        return [
            path("", wrap(_quick(self.changelist_view)), name="{}_{}_changelist".format(*info)),
            path(
                f"{self.action}/",
                wrap(confirm_then_post),
                name="{}_{}_{}".format(*info, self.action),
            ),
        ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def _url(self, name: str) -> str:
        return reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_{name}")

    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "title": title,
            "has_view_permission": True,
            "changelist_url": self._url("changelist"),
            "server_now_ms": clock.now_ms(),
            # Django's change_list.html reads these of its ChangeList outside the blocks the
            # templates fill: the page's model, and that it has a filter panel.
            "cl": _ListPage(self.opts),
            # Django 6.1 styles ol.breadcrumbs (a list), earlier versions div.breadcrumbs.
            "breadcrumbs_list": django.VERSION >= (6, 1),
            **extra,
        }

    def _users(self, request: HttpRequest, user_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """For each stored user id that is a Django user's primary key: its username and, if
        this admin may show it, its change page. Ids that are not (a process's "host:pid", a
        name passed as a str) are left out: the pages show them as they are."""
        user_model = get_user_model()
        pks = usernames.user_pks(user_ids)
        if not pks:
            return {}
        found = {str(u.pk): u for u in user_model._default_manager.filter(pk__in=pks.values())}
        opts = user_model._meta
        may_open = self.admin_site.is_registered(user_model) and (
            request.user.has_perm(f"{opts.app_label}.view_{opts.model_name}")
            or request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}")
        )
        shown: dict[str, dict[str, Any]] = {}
        for user_id, user in found.items():
            url = None
            if may_open:
                try:
                    url = reverse(
                        f"admin:{opts.app_label}_{opts.model_name}_change", args=[quote(user.pk)]
                    )
                except NoReverseMatch:
                    pass
            shown[user_id] = {"name": user.get_username(), "url": url}
        return shown

    @staticmethod
    def _user_filter(value: str) -> str:
        """The stored user id a "user" filter means (see :func:`usernames.user_id_for`)."""
        return usernames.user_id_for(value)

    def _holder(self, user_id: str, users: dict[str, dict[str, Any]]) -> dict[str, Any]:
        user = users.get(user_id)
        if user is None:
            return {"name": user_id, "url": None, "django": False, "filter": user_id}
        return {**user, "django": True, "filter": user["name"]}

    def _log(self, request: HttpRequest, model: type[models.Model], key: str, text: str) -> None:
        assert request.user.pk is not None  # admin_view lets only a logged-in staff user in
        audit.record(request.user.pk, model, key, text)

    def _bad_cursor(self, request: HttpRequest, exc: operations.BadCursor) -> HttpResponse:
        messages.warning(request, f"{exc}; showing the first page.")
        params = request.GET.copy()
        params.pop("cursor", None)
        return HttpResponseRedirect(self._url("changelist") + "?" + params.urlencode())


@admin.register(Lock)
class LockAdmin(DynamoDBAdmin):
    """The holds in DynamoDB, a page at a time, soonest lease end first; break one."""

    action = "release"
    # Holds listed per resource (its permits and reader items read no further); the rest
    # are on the resource's own page.
    holds_per_resource = operations.HOLDS_PER_RESOURCE

    def has_release_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.release_lock")

    def get_urls(self) -> list[Any]:
        info = self.opts.app_label, self.opts.model_name
        page = self.admin_site.admin_view(_quick(self.resource_view))
        return [path("resource/", page, name="{}_{}_resource".format(*info)), *super().get_urls()]

    def resource_url(self, resource: str) -> str:
        return self._url("resource") + "?" + urlencode({"resource": resource})

    # Holds of one resource whose other resources are looked up (each lookup reads the
    # userId index: a counting semaphore's hundreds of holders are not).
    WITH_LOOKUPS = 3

    def resource_view(self, request: HttpRequest) -> HttpResponse:
        """One resource: every holder, the queue in order, the run_once job of that key."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        resource = request.GET.get("resource", "")
        try:
            validation.check_resource(resource)
        except (TypeError, ValueError) as exc:
            messages.error(request, str(exc))
            return HttpResponseRedirect(self._url("changelist"))
        error = None
        state = operations.ResourceState(resource, [], [])
        job = None
        try:
            state = operations.resource_state(resource)
            job = job_operations.job_info(resource)
        except SemaphoreUnavailable as exc:
            error = str(exc)
        now = clock.now_ms()
        users = self._users(
            request, [h.user_id for h in state.holds] + [w.user_id for w in state.waiters]
        )
        can_release = self.has_release_permission(request)
        holds = []
        for hold in state.holds:
            others: list[str] | None = None
            if len(state.holds) <= self.WITH_LOOKUPS and hold.expires_ms >= now:
                try:
                    others = operations.held_with(hold)
                except SemaphoreUnavailable:
                    others = None
            holds.append(
                {
                    "hold": hold,
                    "holder": self._holder(hold.user_id, users),
                    "expires_in": expires_in((hold.expires_ms - now) // 1000),
                    "acquired_ago": human_span(max(0, (now - hold.acquired_ms) // 1000)) + " ago",
                    "expired": hold.expires_ms < now,
                    "with": [(r, self.resource_url(r)) for r in others or []],
                    "looked_up": others is not None,
                    "release_url": (
                        self._url("release")
                        + "?"
                        + urlencode({"resource": resource, "fence": hold.fence})
                        if can_release
                        else None
                    ),
                }
            )
        waiters = [
            {
                "position": place,
                "waiter": w,
                "holder": self._holder(w.user_id, users),
                "kind": "shared" if w.shared else "exclusive",
                "since": None if w.since_ms is None else _aware(w.since_ms),
                "since_ago": None
                if w.since_ms is None
                else human_span(max(0, (now - w.since_ms) // 1000)) + " ago",
            }
            for place, w in enumerate(state.waiters, 1)
        ]
        context = self._context(
            request,
            resource,
            action_title=resource,
            resource=resource,
            holds=holds,
            waiters=waiters,
            job=job,
            jobs_url=reverse(f"admin:{self.opts.app_label}_job_changelist")
            + "?"
            + urlencode({"q": resource}),
            error=error,
            fence=state.fence,
        )
        return TemplateResponse(request, "admin/dynasem/lock/resource.html", context)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        user_filter = request.GET.get("user", "").strip()
        prefix = request.GET.get("q", "")
        show_expired = request.GET.get("expired") == "1"
        cursor = request.GET.get("cursor") or None
        error = None
        page = operations.LockPage([], None)
        try:
            page = operations.lock_page(
                user_id=self._user_filter(user_filter) if user_filter else None,
                prefix=prefix or None,
                include_expired=show_expired,
                cursor=cursor,
                size=self.list_per_page,
                holds_per_resource=self.holds_per_resource,
            )
        except operations.BadCursor as exc:
            return self._bad_cursor(request, exc)
        except SemaphoreUnavailable as exc:
            error = str(exc)
        now = clock.now_ms()
        users = self._users(request, (h.user_id for h in page.holds))
        can_release = self.has_release_permission(request)
        lines: list[dict[str, Any]] = []
        for row in page.rows:
            for hold in row.holds or ([] if row.more_holds else [None]):
                expires_ms = row.expires_ms if hold is None else hold.expires_ms
                left = (expires_ms - now) // 1000
                lines.append(
                    {
                        "row": row,
                        "hold": hold,
                        "holder": None if hold is None else self._holder(hold.user_id, users),
                        "expires_ms": expires_ms,
                        "expires_in": expires_in(left),
                        "acquired_ago": (
                            None
                            if hold is None
                            else human_span(max(0, (now - hold.acquired_ms) // 1000)) + " ago"
                        ),
                        "expired": left < 0,
                        "release_url": (
                            self._url("release")
                            + "?"
                            + urlencode({"resource": row.resource, "fence": hold.fence})
                            if hold is not None and can_release
                            else None
                        ),
                        "resource_url": self.resource_url(row.resource),
                    }
                )
            if row.more_holds:  # the rest are on the resource's own page
                lines.append({"row": row, "more": True, "holder": None,
                              "resource_url": self.resource_url(row.resource)})  # fmt: skip
        filters = {"q": prefix, "user": user_filter, "expired": "1" if show_expired else ""}

        def link(**changes: str) -> str:
            params = {k: v for k, v in {**filters, **changes}.items() if v}
            return "?" + urlencode(params) if params else "?"

        holders_here = {
            line["holder"]["filter"]: line["holder"]["name"] for line in lines if line["holder"]
        }
        context = {
            **self._context(request, "Active locks" if not show_expired else "Lock rows"),
            "lines": lines,
            "page": page,
            "hold_count": len(page.holds),
            "row_count": len(page.rows),
            "cut_rows": sum(1 for row in page.rows if row.more_holds),
            "can_release": can_release,
            "query": prefix,
            "user_filter": user_filter,
            "show_expired": show_expired,
            "filters": {k: v for k, v in filters.items() if v and k != "q"},
            "active_url": link(expired=""),
            "expired_url": link(expired="1"),
            "all_users_url": link(user=""),
            "user_links": [
                {"name": name, "url": link(user=key), "selected": key == user_filter}
                for key, name in sorted(holders_here.items())[:20]
            ],
            "next_url": link(cursor=page.next_cursor) if page.next_cursor else None,
            "first_url": link() if cursor else None,
            "error": error,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/dynasem/lock/change_list.html", context)

    @staticmethod
    def _find(
        resource: str, token: str = "", fence: str = ""
    ) -> tuple[operations.HoldInfo | None, list[table.Waiter]]:
        """The hold named by ``token`` or ``fence``, and the resource's waiters."""
        state = operations.resource_state(resource)
        for hold in state.holds:
            if (token and hold.token == token) or (fence and str(hold.fence) == fence):
                return hold, state.waiters
        return None, state.waiters

    def action_view(self, request: HttpRequest) -> HttpResponse:
        """Break one hold: its confirmation page (GET), then the break (POST)."""
        if not self.has_release_permission(request):
            raise PermissionDenied
        # The list links to the confirmation by fence, so a hold's token stays out of URLs
        # (and access logs); the POST names the token, which is what the break is
        # conditional on.
        source = request.POST if request.method == "POST" else request.GET
        resource = source.get("resource", "")
        token = source.get("token", "")
        fence = "" if request.method == "POST" else source.get("fence", "")
        changelist = self._url("changelist")
        waiting: list[table.Waiter] = []
        try:
            hold, waiting = (
                self._find(resource, token, fence) if resource and (token or fence) else (None, [])
            )
        except SemaphoreUnavailable:
            # The list says why (and where), once: here only what did not happen.
            messages.error(request, "The hold could not be read: nothing was broken.")
            return HttpResponseRedirect(changelist)
        except (TypeError, ValueError) as exc:
            messages.error(request, str(exc))
            return HttpResponseRedirect(changelist)
        if hold is None:
            messages.warning(request, f"{resource!r} has no such hold any more: nothing broken.")
            return HttpResponseRedirect(changelist)
        users = self._users(request, [hold.user_id] + [w.user_id for w in waiting[:1]])
        holder = self._holder(hold.user_id, users)
        if request.method == "POST":
            try:
                broken = operations.break_hold(
                    resource, hold.token, user_id=hold.user_id, fence=hold.fence
                )
            except SemaphoreUnavailable:
                # It may have been applied (no answer is not a no): the list tells, once read.
                messages.error(
                    request,
                    "DynamoDB did not answer the break: see below whether the hold is gone.",
                )
                return HttpResponseRedirect(changelist)
            if broken:
                text = f"Broke the hold of {holder['name']} on {resource} (fence {hold.fence})."
                self._log(request, Lock, resource, text)
                messages.success(request, text)
            else:
                messages.warning(request, f"The hold on {resource!r} had already gone.")
            return HttpResponseRedirect(changelist)
        now = clock.now_ms()
        context = self._context(
            request,
            "Break this hold?",
            action_title="Break a hold",
            hold=hold,
            holder=holder,
            expires_in=expires_in((hold.expires_ms - now) // 1000),
            next_waiter=(
                {
                    "holder": self._holder(waiting[0].user_id, users),
                    "kind": "shared" if waiting[0].shared else "exclusive",
                }
                if waiting
                else None
            ),
            waiting=len(waiting),
            resource_url=self.resource_url(resource),
        )
        return TemplateResponse(request, "admin/dynasem/lock/release_confirm.html", context)


@admin.register(Job)
class JobAdmin(DynamoDBAdmin):
    """The run_once keys and how their last run went; reset a DONE or FAILED one."""

    action = "reset"
    statuses = (table.RUNNING, table.FAILED, table.DONE, job_operations.NEW)

    def has_reset_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.reset_job")

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        prefix = request.GET.get("q", "")
        status = request.GET.get("status", "")
        if status not in self.statuses:
            status = ""
        cursor = request.GET.get("cursor") or None
        error = None
        page = job_operations.JobPage([], None)
        try:
            page = job_operations.job_page(
                prefix=prefix or None,
                status=status or None,
                cursor=cursor,
                size=self.list_per_page,
            )
        except operations.BadCursor as exc:
            return self._bad_cursor(request, exc)
        except SemaphoreUnavailable as exc:
            error = str(exc)
        users = self._users(request, (j.user_id for j in page.jobs if j.user_id))
        can_reset = self.has_reset_permission(request)
        filters = {"q": prefix, "status": status}

        def link(**changes: str) -> str:
            params = {k: v for k, v in {**filters, **changes}.items() if v}
            return "?" + urlencode(params) if params else "?"

        # The whole error (and the lock of the same name) is on the resource page, for whoever
        # may see it.
        lock_admin = self.admin_site._registry.get(Lock)
        pages = lock_admin is not None and lock_admin.has_view_permission(request)
        rows = [
            {
                "job": job,
                "page_url": lock_admin.resource_url(job.key)
                if pages and isinstance(lock_admin, LockAdmin)
                else None,
                "holder": self._holder(job.user_id, users) if job.user_id else None,
                "reset_url": (
                    self._url("reset") + "?" + urlencode({"key": job.key})
                    if can_reset and job.resettable
                    else None
                ),
            }
            for job in sorted(page.jobs, key=lambda j: _natural(j.key))
        ]
        context = {
            **self._context(request, "Run-once jobs"),
            "rows": rows,
            "page": page,
            "query": prefix,
            "status": status,
            "can_reset": can_reset,
            "filters": {k: v for k, v in filters.items() if v and k != "q"},
            "status_links": [{"name": "All", "url": link(status=""), "selected": not status}]
            + [{"name": s, "url": link(status=s), "selected": s == status} for s in self.statuses],
            "next_url": link(cursor=page.next_cursor) if page.next_cursor else None,
            "first_url": link() if cursor else None,
            "error": error,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/dynasem/job/change_list.html", context)

    def action_view(self, request: HttpRequest) -> HttpResponse:
        """Reset one DONE or FAILED key: its confirmation page (GET), then the reset (POST)."""
        if not self.has_reset_permission(request):
            raise PermissionDenied
        source = request.POST if request.method == "POST" else request.GET
        key = source.get("key", "")
        changelist = self._url("changelist")
        try:
            job = job_operations.job_info(key)
        except SemaphoreUnavailable:
            messages.error(request, "The job could not be read: nothing was reset.")
            return HttpResponseRedirect(changelist)
        except (TypeError, ValueError) as exc:
            messages.error(request, str(exc))
            return HttpResponseRedirect(changelist)
        if job is None or not job.resettable:
            state = "was never run" if job is None else f"is {job.status}"
            messages.warning(request, f"{key!r} {state}: only a DONE or FAILED job is reset.")
            return HttpResponseRedirect(changelist)
        if request.method == "POST":
            # Reset only the outcome the confirmation page showed: a run that ended since
            # (another FAILED, or DONE) is not reset unseen.
            seen_status = source.get("status", "")
            seen_finished = source.get("finished", "")
            if seen_status != job.status or seen_finished != str(job.finished_ms or ""):
                messages.warning(request, f"{key!r} changed since the page was shown: not reset.")
                return HttpResponseRedirect(changelist)
            try:
                done = job_operations.reset_job(key, job.status, job.finished_ms)
            except SemaphoreUnavailable:
                messages.error(
                    request, "DynamoDB did not answer the reset: see below whether the job is new."
                )
                return HttpResponseRedirect(changelist)
            if done:
                text = f"Reset run-once job {key} (was {job.status}); it will run again."
                if job.error:
                    text = f"{text[:-1]}. Its last error: {job.error}"[:2000]
                self._log(request, Job, key, text)
                messages.success(request, f"Reset {key!r} (was {job.status}): it will run again.")
            else:
                messages.warning(request, f"{key!r} changed since the page was shown: not reset.")
            return HttpResponseRedirect(changelist)
        holder = None
        if job.user_id:
            holder = self._holder(job.user_id, self._users(request, [job.user_id]))
        context = self._context(
            request, "Reset this job?", action_title="Reset a job", job=job, holder=holder
        )
        return TemplateResponse(request, "admin/dynasem/job/reset_confirm.html", context)
