"""Admin pages over what dynasem keeps in DynamoDB: the holds (list, break one) and the
run_once keys (list, reset one).

As django-rq does for its queues: ``Lock`` and ``Job`` have no database table and only carry
the permissions (``dynasem.view_lock``, ``dynasem.release_lock``, ``dynasem.view_job``,
``dynasem.reset_job``); every view is wrapped by ``admin_site.admin_view`` and checks its own
permission; a destructive action is a POST (CSRF-protected) after a confirmation page, is
conditional on what that page showed, and is logged as a ``LogEntry``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from . import _clock as clock
from ._engine import arguments as validation
from ._observability.logs import shown_token
from ._operators import cursors
from ._operators import jobs as job_operations
from ._operators import locks as operations
from ._operators.admin_pages import (
    DynamoDBAdmin,
    _aware,
    _natural,
    _quick,
    expires_in,
    human_span,
)
from ._storage import records
from .exceptions import SemaphoreUnavailable
from .models import Job, Lock


@admin.register(Lock)
class LockAdmin(DynamoDBAdmin):
    """The holds in DynamoDB, a page at a time, soonest lease end first; break one."""

    action = "release"
    # Holds listed per resource (its permits and reader items read no further); the rest
    # are on the resource's own page.
    holds_per_resource = operations.HOLDS_PER_RESOURCE
    # Holders the resource page shows at a time (its permits and reader items read so far).
    holds_per_page = operations.HOLDS_PER_PAGE

    def has_release_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.release_lock")

    def get_urls(self) -> list[Any]:
        info = self.opts.app_label, self.opts.model_name
        page = self.admin_site.admin_view(_quick(self.resource_view))
        return [path("resource/", page, name="{}_{}_resource".format(*info)), *super().get_urls()]

    def resource_url(self, resource: str) -> str:
        return self._url("resource") + "?" + urlencode({"resource": resource})

    # A link to a page of holders that this site did not write for this resource: a 400.
    bad_page_text = (
        "That page of holders was not written by this site for this resource (it was "
        "changed or cut short, is another resource's, or was signed with a retired "
        "SECRET_KEY): start from the first page."
    )

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
        error = bad_page = None
        state = operations.ResourceState(resource, [], [])
        job = None
        # The job's status and last error only for who may see the job list (view_job).
        may_see_job = self._may_see_jobs(request)
        signed_for = cursors.purpose("holders", resource)
        after = request.GET.get("after") or None  # a page of holders after the first
        try:
            state = operations.resource_state(
                resource,
                holds_after=after and cursors.decode_sort_key_cursor(after, signed_for),
                most=self.holds_per_page,
            )
            job = job_operations.job_info(resource) if may_see_job else None
        except operations.BadCursor:
            bad_page = self.bad_page_text
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
            may_see_job=may_see_job,
            jobs_url=reverse(f"admin:{self.opts.app_label}_job_changelist")
            + "?"
            + urlencode({"q": resource}),
            error=error,
            bad_page=bad_page,
            fence=state.fence,
            first_url=self.resource_url(resource) if after else None,
            next_url=(
                self.resource_url(resource)
                + "&"
                + urlencode({"after": cursors.encode_cursor(state.holds_next, signed_for)})
                if state.holds_next
                else None
            ),
            holds_per_page=self.holds_per_page,
            waiters_beyond=state.waiters_beyond,
        )
        return TemplateResponse(
            request, "admin/dynasem/lock/resource.html", context, status=400 if bad_page else 200
        )

    def _may_see_jobs(self, request: HttpRequest) -> bool:
        """What the run-once job list asks (``view_job``), so a job's error shows nowhere else."""
        job_admin = self.admin_site._registry.get(Job)
        if job_admin is not None:
            return bool(job_admin.has_view_permission(request))
        return bool(request.user.has_perm(f"{Job._meta.app_label}.view_job"))

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        user_filter = request.GET.get("user", "").strip()
        prefix = request.GET.get("q", "")
        show_expired = request.GET.get("expired") == "1"
        cursor = request.GET.get("cursor") or None
        error = bad_cursor = None
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
        except operations.BadCursor:
            bad_cursor = self.bad_cursor_text
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
            "bad_cursor": bad_cursor,
            "index_note": operations.INDEX_NOTE,
            **(extra_context or {}),
        }
        return TemplateResponse(
            request,
            "admin/dynasem/lock/change_list.html",
            context,
            status=400 if bad_cursor else 200,
        )

    @staticmethod
    def _find(
        resource: str, token: str = "", fence: str = ""
    ) -> tuple[operations.HoldInfo | None, list[records.Waiter]]:
        """The one hold named by ``fence`` and the first characters of its ``token`` (either
        may be left out), and the resource's waiters."""
        state = operations.resource_state(resource)
        named = [
            hold
            for hold in state.holds
            if hold.token.startswith(token) and (not fence or str(hold.fence) == fence)
        ]
        return (named[0] if len(named) == 1 else None), state.waiters

    @staticmethod
    def _changed_text(resource: str, fence: str) -> str:
        """What a break refused is: the hold the page showed (read from the index, or
        consistently a moment ago) no longer holds; a hold taken since is not touched."""
        which = f" (fence {fence})" if fence else ""
        return (
            f"The hold on {resource!r}{which} changed since listed: it was given back, or "
            "taken over, after it was read; nothing broken."
        )

    def action_view(self, request: HttpRequest) -> HttpResponse:
        """Break one hold: its confirmation page (GET), then the break (POST)."""
        if not self.has_release_permission(request):
            raise PermissionDenied
        # The list links to the confirmation by fence; the form posts the fence and the
        # token's first characters (what dynasem shows of a token anywhere: logs.shown_token),
        # so a whole token, a hold's secret, is in no URL, access log or page. The break itself
        # is conditional on the whole token, read from the table.
        source = request.POST if request.method == "POST" else request.GET
        resource = source.get("resource", "")
        token = source.get("token", "")
        fence = source.get("fence", "")
        changelist = self._url("changelist")
        waiting: list[records.Waiter] = []
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
            messages.warning(request, self._changed_text(resource, fence))
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
                messages.warning(request, self._changed_text(resource, str(hold.fence)))
            return HttpResponseRedirect(changelist)
        now = clock.now_ms()
        context = self._context(
            request,
            "Break this hold?",
            action_title="Break a hold",
            hold=hold,
            shown_token=shown_token(hold.token),
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
    statuses = (records.RUNNING, records.FAILED, records.DONE, job_operations.NEW)

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
        error = bad_cursor = None
        page = job_operations.JobPage([], None)
        try:
            page = job_operations.job_page(
                prefix=prefix or None,
                status=status or None,
                cursor=cursor,
                size=self.list_per_page,
            )
        except operations.BadCursor:
            bad_cursor = self.bad_cursor_text
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
            "bad_cursor": bad_cursor,
            "scan_note": job_operations.SCAN_NOTE,
            **(extra_context or {}),
        }
        return TemplateResponse(
            request,
            "admin/dynasem/job/change_list.html",
            context,
            status=400 if bad_cursor else 200,
        )

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
