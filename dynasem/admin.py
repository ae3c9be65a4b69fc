"""Admin pages over what dynasem keeps in DynamoDB: the holds (list, break one) and the
run_once keys (list, reset one).

As django-rq does for its queues: ``Lock`` and ``Job`` have no database table and only carry
the permissions (``dynasem.view_lock``, ``dynasem.release_lock``, ``dynasem.view_job``,
``dynasem.reset_job``); every view is wrapped by ``admin_site.admin_view`` and checks its own
permission; a destructive action is a POST (CSRF-protected) after a confirmation page, is
conditional on what that page showed, and is logged as a ``LogEntry``.
"""

from __future__ import annotations

import contextlib
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from . import _clock as clock
from ._engine import arguments
from ._observability.logs import shown_token
from ._operators import audit, cursors, jobs, locks, usernames
from ._operators.admin_pages import DynamoDBAdmin, ago, expires_in, link, natural
from .exceptions import SemaphoreUnavailable
from .models import Job, Lock


@admin.register(Lock)
class LockAdmin(DynamoDBAdmin):
    """The holds in DynamoDB, a page at a time, soonest lease end first; break one."""

    action = "release"
    action_permission = "release_lock"
    unread_text = "The hold could not be read: nothing was broken."
    unanswered_text = "DynamoDB did not answer the break: see below whether the hold is gone."
    # Holds listed per resource (its permits and reader items read no further); the rest
    # are on the resource's own page.
    holds_per_resource = locks.HOLDS_PER_RESOURCE
    # Holders the resource page shows at a time (its permits and reader items read so far).
    holds_per_page = locks.HOLDS_PER_PAGE

    def get_urls(self) -> list[Any]:
        return [self._path("resource/", self.resource_view, "resource"), *super().get_urls()]

    def resource_url(self, resource: str) -> str:
        return self._url("resource", resource=resource)

    # A link to a page of holders that this site did not write for this resource: a 400.
    bad_page_text = (
        "That page of holders was not written by this site for this resource (it was "
        "changed or cut short, is another resource's, or was signed with a retired "
        "SECRET_KEY): start from the first page."
    )

    # Holds of one resource whose other resources are looked up (each lookup reads the
    # userId index: a counting semaphore's hundreds of holders are not).
    WITH_LOOKUPS = 3

    def _hold_line(
        self, hold: locks.HoldInfo, users: dict[str, Any], now: int, can_release: bool
    ) -> dict[str, Any]:
        """A hold as a line of the list or of the resource page."""
        release_url = self._url("release", resource=hold.resource, fence=hold.fence)
        return {
            "hold": hold,
            "holder": self._holder(hold.user_id, users),
            "expires_in": expires_in((hold.expires_ms - now) // 1000),
            "acquired_ago": ago(now, hold.acquired_ms),
            "expired": hold.expires_ms < now,
            "release_url": release_url if can_release else None,
        }

    def resource_view(self, request: HttpRequest) -> HttpResponse:
        """One resource: every holder, the queue in order, the run_once job of that key."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        resource = request.GET.get("resource", "")
        try:
            arguments.check_resource(resource)
        except (TypeError, ValueError) as exc:
            messages.error(request, str(exc))
            return HttpResponseRedirect(self._url("changelist"))
        # The job's status and last error only for who may see the job list (view_job).
        may_see_job = self._may_see_jobs(request)
        signed_for = cursors.purpose("holders", resource)
        after = request.GET.get("after") or None  # a page of holders after the first

        def read() -> tuple[locks.ResourceState, jobs.JobInfo | None]:
            holds_after = after and cursors.decode_sort_key_cursor(after, signed_for)
            state = locks.resource_state(
                resource, holds_after=holds_after, most=self.holds_per_page
            )
            return state, jobs.job_info(resource) if may_see_job else None

        no_job: jobs.JobInfo | None = None
        empty = (locks.ResourceState(resource, [], []), no_job)
        (state, job), failed = self._read(read, empty, self.bad_page_text)
        holds_next = state.holds_next and cursors.encode_cursor(state.holds_next, signed_for)
        context = self._context(
            request,
            resource,
            **self._resource_lines(request, state),
            **failed,
            action_title=resource,
            resource=resource,
            job=job,
            may_see_job=may_see_job,
            jobs_url=reverse(f"admin:{self.opts.app_label}_job_changelist") + link({"q": resource}),
            fence=state.fence,
            first_url=self.resource_url(resource) if after else None,
            next_url=holds_next and self._url("resource", resource=resource, after=holds_next),
            holds_per_page=self.holds_per_page,
            waiters_beyond=state.waiters_beyond,
        )
        return self._page(request, "admin/dynasem/lock/resource.html", context)

    def _resource_lines(self, request: HttpRequest, state: locks.ResourceState) -> dict[str, Any]:
        """The resource page's holders (each with the resources taken with it, for a few) and
        waiters, first in line first."""
        now = clock.now_ms()
        users = self._users(
            request, [h.user_id for h in state.holds] + [w.user_id for w in state.waiters]
        )
        can_release = self.has_action_permission(request)
        holds = []
        for hold in state.holds:
            others: list[str] | None = None
            if len(state.holds) <= self.WITH_LOOKUPS and hold.expires_ms >= now:
                with contextlib.suppress(SemaphoreUnavailable):
                    others = locks.held_with(hold)
            line = self._hold_line(hold, users, now, can_release)
            line["with"] = [(r, self.resource_url(r)) for r in others or []]
            holds.append({**line, "looked_up": others is not None})
        waiters = [
            {
                "position": place,
                "waiter": w,
                "holder": self._holder(w.user_id, users),
                "kind": "shared" if w.shared else "exclusive",
                "since": None if w.since_ms is None else locks.aware(w.since_ms),
                "since_ago": None if w.since_ms is None else ago(now, w.since_ms),
            }
            for place, w in enumerate(state.waiters, 1)
        ]
        return {"holds": holds, "waiters": waiters}

    def _may_see_jobs(self, request: HttpRequest) -> bool:
        """What the run-once job list asks (``view_job``), so a job's error shows nowhere else."""
        if (job_admin := self.admin_site._registry.get(Job)) is not None:
            return bool(job_admin.has_view_permission(request))
        return bool(request.user.has_perm(f"{Job._meta.app_label}.view_job"))

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        user_filter = request.GET.get("user", "").strip()
        show_expired = request.GET.get("expired") == "1"
        filters = {
            "q": request.GET.get("q", ""),
            "user": user_filter,
            "expired": "1" if show_expired else "",
        }
        cursor = request.GET.get("cursor") or None
        page, failed = self._read(
            lambda: locks.lock_page(
                user_id=usernames.user_id_for(user_filter) if user_filter else None,
                prefix=filters["q"] or None,
                include_expired=show_expired,
                cursor=cursor,
                size=self.list_per_page,
                holds_per_resource=self.holds_per_resource,
            ),
            locks.LockPage([], None),
        )
        can_release = self.has_action_permission(request)
        lines = self._list_lines(request, page, can_release)
        holders_here = {
            line["holder"]["filter"]: line["holder"]["name"] for line in lines if line.get("holder")
        }
        context = self._list_context(
            request,
            "Active locks" if not show_expired else "Lock rows",
            filters,
            page,
            **failed,
            lines=lines,
            cut_rows=sum(1 for row in page.rows if row.more_holds),
            can_release=can_release,
            active_url=link(filters, expired=""),
            expired_url=link(filters, expired="1"),
            all_users_url=link(filters, user=""),
            user_links=[
                {"name": name, "url": link(filters, user=key), "selected": key == user_filter}
                for key, name in sorted(holders_here.items())[:20]
            ],
            index_note=locks.INDEX_NOTE,
            **(extra_context or {}),
        )
        return self._page(request, "admin/dynasem/lock/change_list.html", context)

    def _list_lines(
        self, request: HttpRequest, page: locks.LockPage, can_release: bool
    ) -> list[dict[str, Any]]:
        """The list's lines: a line per hold shown, one per idle row, and one after a row
        with more holders than shown (the rest are on the resource's own page)."""
        now = clock.now_ms()
        users = self._users(request, (h.user_id for h in page.holds))
        lines: list[dict[str, Any]] = []
        for row in page.rows:
            url = self.resource_url(row.resource)
            lines += [
                {**self._hold_line(hold, users, now, can_release), "row": row, "resource_url": url}
                for hold in row.holds
            ]
            if row.more_holds:
                lines.append({"row": row, "more": True, "resource_url": url})
            elif not row.holds:
                expires = expires_in((row.expires_ms - now) // 1000)
                lines.append({"row": row, "expires_in": expires, "resource_url": url})
        return lines

    @staticmethod
    def _changed_text(resource: str, fence: str) -> str:
        """What a break refused is: the hold the page showed (read from the index, or
        consistently a moment ago) no longer holds; a hold taken since is not touched."""
        which = f" (fence {fence})" if fence else ""
        return (
            f"The hold on {resource!r}{which} changed since listed: it was given back, or "
            "taken over, after it was read; nothing broken."
        )

    def action_target(self, request: HttpRequest, source: Any) -> Any:
        """The one hold named by ``fence`` and the first characters of its ``token`` (either
        may be left out), and the resource's waiters."""
        # The list links to the confirmation by fence; the form posts the fence and the
        # token's first characters (what dynasem shows of a token anywhere: logs.shown_token),
        # so a whole token, a hold's secret, is in no URL, access log or page. The break itself
        # is conditional on the whole token, read from the table.
        resource, token, fence = (source.get(name, "") for name in ("resource", "token", "fence"))
        if not (resource and (token or fence)):  # a link cut short: no hold was ever named
            return (
                "This link names no hold (it needs a resource and the hold's fence or token): "
                "nothing broken."
            )
        state = locks.resource_state(resource)
        named = locks.matching(state.holds, token, fence)
        if len(named) == 1:
            return named[0], state.waiters
        return self._changed_text(resource, fence)

    def act(self, request: HttpRequest, target: Any, source: Any) -> tuple[int, str]:
        hold, _waiting = target
        if not locks.break_hold(hold.resource, hold.token, user_id=hold.user_id, fence=hold.fence):
            return messages.WARNING, self._changed_text(hold.resource, str(hold.fence))
        holder = self._holder(hold.user_id, self._users(request, [hold.user_id]))
        assert request.user.pk is not None  # admin_view lets only a logged-in staff user in
        return messages.SUCCESS, audit.broke(request.user.pk, hold, holder["name"])

    def confirm(self, request: HttpRequest, target: Any) -> HttpResponse:
        hold, waiting = target
        users = self._users(request, [hold.user_id] + [w.user_id for w in waiting[:1]])
        next_waiter = None
        if waiting:
            kind = "shared" if waiting[0].shared else "exclusive"
            next_waiter = {"holder": self._holder(waiting[0].user_id, users), "kind": kind}
        context = self._context(
            request,
            "Break this hold?",
            action_title="Break a hold",
            hold=hold,
            shown_token=shown_token(hold.token),
            holder=self._holder(hold.user_id, users),
            expires_in=expires_in((hold.expires_ms - clock.now_ms()) // 1000),
            next_waiter=next_waiter,
            waiting=len(waiting),
            resource_url=self.resource_url(hold.resource),
        )
        return self._page(request, "admin/dynasem/lock/release_confirm.html", context)


@admin.register(Job)
class JobAdmin(DynamoDBAdmin):
    """The run_once keys and how their last run went; reset a DONE or FAILED one."""

    action = "reset"
    action_permission = "reset_job"
    unread_text = "The job could not be read: nothing was reset."
    unanswered_text = "DynamoDB did not answer the reset: see below whether the job is new."

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        status = request.GET.get("status", "")
        status = status if status in jobs.STATUSES else ""
        filters = {"q": request.GET.get("q", ""), "status": status}
        cursor = request.GET.get("cursor") or None
        page, failed = self._read(
            lambda: jobs.job_page(
                prefix=filters["q"] or None,
                status=status or None,
                cursor=cursor,
                size=self.list_per_page,
            ),
            jobs.JobPage([], None),
        )
        can_reset = self.has_action_permission(request)
        context = self._list_context(
            request,
            "Run-once jobs",
            filters,
            page,
            **failed,
            rows=self._rows(request, page, can_reset),
            status=status,
            can_reset=can_reset,
            status_links=[  # "" is All
                {"name": s or "All", "url": link(filters, status=s), "selected": s == status}
                for s in ("", *jobs.STATUSES)
            ],
            scan_note=jobs.SCAN_NOTE,
            **(extra_context or {}),
        )
        return self._page(request, "admin/dynasem/job/change_list.html", context)

    def _rows(
        self, request: HttpRequest, page: jobs.JobPage, can_reset: bool
    ) -> list[dict[str, Any]]:
        """The list's rows, by key (numbers in numeric order)."""
        users = self._users(request, (j.user_id for j in page.jobs if j.user_id))
        # The whole error (and the lock of the same name) is on the resource page, for whoever
        # may see it.
        lock_admin = self.admin_site._registry.get(Lock)
        if not (isinstance(lock_admin, LockAdmin) and lock_admin.has_view_permission(request)):
            lock_admin = None
        return [
            {
                "job": job,
                "page_url": lock_admin and lock_admin.resource_url(job.key),
                "holder": self._holder(job.user_id, users) if job.user_id else None,
                "reset_url": self._url("reset", key=job.key)
                if can_reset and job.resettable
                else None,
            }
            for job in sorted(page.jobs, key=lambda j: natural(j.key))
        ]

    def action_target(self, request: HttpRequest, source: Any) -> Any:
        """The DONE or FAILED job of ``key``."""
        key = source.get("key", "")
        job = jobs.job_info(key)
        if job is None or not job.resettable:
            state = "was never run" if job is None else f"is {job.status}"
            return f"{key!r} {state}: only a DONE or FAILED job is reset."
        return job

    def act(self, request: HttpRequest, target: Any, source: Any) -> tuple[int, str]:
        job: jobs.JobInfo = target
        # Reset only the outcome the confirmation page showed: a run that ended since
        # (another FAILED, or DONE) is not reset unseen.
        seen = (source.get("status", ""), source.get("finished", ""))
        if seen != (job.status, str(job.finished_ms or "")) or not jobs.reset_job(
            job.key, job.status, job.finished_ms
        ):
            return messages.WARNING, f"{job.key!r} changed since the page was shown: not reset."
        text = f"Reset run-once job {job.key} (was {job.status}); it will run again."
        if job.error:
            text = f"{text[:-1]}. Its last error: {job.error}"[:2000]
        assert request.user.pk is not None  # admin_view lets only a logged-in staff user in
        audit.record(request.user.pk, Job, job.key, text)
        return messages.SUCCESS, f"Reset {job.key!r} (was {job.status}): it will run again."

    def confirm(self, request: HttpRequest, target: Any) -> HttpResponse:
        job: jobs.JobInfo = target
        holder = None
        if job.user_id:
            holder = self._holder(job.user_id, self._users(request, [job.user_id]))
        context = self._context(
            request, "Reset this job?", action_title="Reset a job", job=job, holder=holder
        )
        return self._page(request, "admin/dynasem/job/reset_confirm.html", context)
