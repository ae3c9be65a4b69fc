"""Admin pages over the holds in DynamoDB: a list of the active holds and a guarded break.

``Lock`` has no database table: it only carries the permissions (``dynasem.view_lock``,
``dynasem.release_lock``). Every view is wrapped by ``admin_site.admin_view`` and checks its
own permission; breaking is a POST (CSRF-protected) after a confirmation page, conditional on
the hold's token, logged as a ``LogEntry``.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from . import operations
from .exceptions import SemaphoreUnavailable
from .models import Lock


@admin.register(Lock)
class LockAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_release_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("dynasem.release_lock")

    def get_urls(self) -> list[Any]:
        info = self.opts.app_label, self.opts.model_name
        wrap = self.admin_site.admin_view
        return [
            path("", wrap(self.changelist_view), name="{}_{}_changelist".format(*info)),
            path("release/", wrap(self.release_view), name="{}_{}_release".format(*info)),
        ]

    def _context(self, request: HttpRequest, title: str) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": title,
            "has_view_permission": True,
            "can_release": self.has_release_permission(request),
        }

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        user_id = request.GET.get("user") or None
        prefix = request.GET.get("q") or None
        show_expired = request.GET.get("expired") == "1"
        error = None
        holds: list[operations.HoldInfo] = []
        try:
            holds = operations.active_holds(
                user_id=user_id, prefix=prefix, include_expired=show_expired
            )
        except SemaphoreUnavailable as exc:
            error = str(exc)
        now = timezone.now()
        context = {
            **self._context(request, "Active locks"),
            "holds": [
                {
                    "hold": h,
                    "seconds_left": int((h.expires - now).total_seconds()),
                    "release_url": reverse("admin:dynasem_lock_release")
                    + "?"
                    + _query(resource=h.resource, token=h.token),
                }
                for h in holds
            ],
            "user_filter": user_id or "",
            "query": prefix or "",
            "show_expired": show_expired,
            "error": error,
        }
        return TemplateResponse(request, "admin/dynasem/lock/change_list.html", context)

    @staticmethod
    def _find(resource: str, token: str) -> operations.HoldInfo | None:
        return next((h for h in operations.holds_on(resource) if h.token == token), None)

    def release_view(self, request: HttpRequest) -> HttpResponse:
        return require_http_methods(["GET", "POST"])(self._release)(request)

    def _release(self, request: HttpRequest) -> HttpResponse:
        if not self.has_release_permission(request):
            raise PermissionDenied
        source = request.POST if request.method == "POST" else request.GET
        resource, token = source.get("resource", ""), source.get("token", "")
        changelist = reverse("admin:dynasem_lock_changelist")
        try:
            hold = self._find(resource, token) if resource and token else None
        except (SemaphoreUnavailable, TypeError, ValueError) as exc:
            messages.error(request, str(exc))
            return HttpResponseRedirect(changelist)
        if hold is None:
            messages.warning(request, f"No hold with that token on {resource!r} any more.")
            return HttpResponseRedirect(changelist)
        if request.method == "POST":
            if operations.break_hold(resource, token, sender=LockAdmin):
                # create() rather than log_action(): one call for Django 4.2 to 5.x.
                LogEntry.objects.create(
                    user_id=request.user.pk,
                    content_type_id=ContentType.objects.get_for_model(Lock).pk,
                    object_id=resource,
                    object_repr=f"{resource} (fence {hold.fence})"[:200],
                    action_flag=CHANGE,
                    change_message=f"Broke the hold of {hold.user_id} on {resource}",
                )
                messages.success(request, f"Broke the hold of {hold.user_id} on {resource!r}.")
            else:
                messages.warning(request, f"The hold on {resource!r} had already gone.")
            return HttpResponseRedirect(changelist)
        context = {**self._context(request, "Break this hold?"), "hold": hold}
        return TemplateResponse(request, "admin/dynasem/lock/release_confirm.html", context)


def _query(**params: str) -> str:
    from urllib.parse import urlencode

    return urlencode(params)
