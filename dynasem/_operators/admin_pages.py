"""What dynasem's admin pages share (:mod:`dynasem.admin` registers them): the base class
of the admins of its table-less models, and the small helpers their pages use."""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar
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

from .. import _clock as clock
from .._storage import dynamodb
from ..exceptions import SemaphoreUnavailable
from . import cursors, jobs, locks, usernames

if TYPE_CHECKING:  # django-stubs makes ModelAdmin generic; Django's own class is not subscriptable
    ModelAdmin = admin.ModelAdmin[models.Model]
else:
    ModelAdmin = admin.ModelAdmin

_T = TypeVar("_T")
# A page of a list (the locks', the run-once jobs').
Page = locks.LockPage | jobs.JobPage


def quick(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """``view`` with its DynamoDB requests on the quick client (``dynamodb.quick``): an operator
    is told within ~2 s that DynamoDB is unavailable, not kept waiting on a hung endpoint."""

    @functools.wraps(view)
    def inner(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        with dynamodb.quick():
            return view(request, *args, **kwargs)

    return inner


def natural(key: str) -> list[tuple[int, int | str]]:
    """A sort key that puts ``upload:2`` before ``upload:10`` (numbers by value)."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", key)]


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


def ago(now_ms: int, ms: int) -> str:
    """How long before ``now_ms`` the moment ``ms`` was: ``3 min 05 s ago``."""
    return human_span(max(0, (now_ms - ms) // 1000)) + " ago"


def link(filters: dict[str, str], **changes: str) -> str:
    """A link to this list under ``filters`` with ``changes`` (empty values left out)."""
    params = {k: v for k, v in {**filters, **changes}.items() if v}
    return "?" + urlencode(params) if params else "?"


class DynamoDBAdmin(ModelAdmin):
    """What the admins of dynasem's table-less models share: no add/change/delete, pages of
    DynamoDB rows, holders shown by username where they are Django users."""

    list_per_page = 100
    # What a page link shows that this site did not write for its list and filters (edited,
    # cut short, of another filter, or signed with a SECRET_KEY since retired): a 400.
    bad_cursor_text = (
        "That page link was not written by this site for this list and these filters (it "
        "was changed or cut short, is of another filter, or was signed with a retired "
        "SECRET_KEY): start from the first page."
    )
    # The one action page: its URL (``<action>/``, named ``..._<action>``) serves
    # ``action_view``, its confirmation on GET and the change itself on POST. It needs
    # ``action_permission``; ``unread_text`` says DynamoDB could not read what it acts on,
    # ``unanswered_text`` that DynamoDB did not answer the change.
    action = action_permission = unread_text = unanswered_text = ""

    def get_urls(self) -> list[Any]:
        confirm_then_post = require_http_methods(["GET", "POST"])(self.action_view)
        return [
            self._path("", self.changelist_view, "changelist"),
            self._path(f"{self.action}/", confirm_then_post, self.action),
        ]

    def _path(self, route: str, view: Callable[..., HttpResponse], name: str) -> Any:
        """``view`` (for logged-in staff, on the quick client) at ``route``, named
        ``<app>_<model>_<name>`` as :meth:`_url` reverses it."""
        page = self.admin_site.admin_view(quick(view))
        return path(route, page, name=f"{self.opts.app_label}_{self.opts.model_name}_{name}")

    def has_action_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.{self.action_permission}")

    def action_target(self, request: HttpRequest, source: Any) -> Any:
        """What the action is asked to change, read from DynamoDB; a str says why there is
        nothing to change."""
        raise NotImplementedError

    def act(self, request: HttpRequest, target: Any, source: Any) -> tuple[int, str]:
        """The change itself (POST): its message's level and text."""
        raise NotImplementedError

    def confirm(self, request: HttpRequest, target: Any) -> HttpResponse:
        """The confirmation page (GET)."""
        raise NotImplementedError

    def action_view(self, request: HttpRequest) -> HttpResponse:
        """The action: its confirmation page (GET), then the change itself (POST); every way
        back to the list says in a message what happened."""
        if not self.has_action_permission(request):
            raise PermissionDenied
        source = request.POST if request.method == "POST" else request.GET
        try:
            target = self.action_target(request, source)
        except SemaphoreUnavailable:
            # The list says why (and where), once: here only what did not happen.
            level, text = messages.ERROR, self.unread_text
        except (TypeError, ValueError) as exc:
            level, text = messages.ERROR, str(exc)
        else:
            if isinstance(target, str):
                level, text = messages.WARNING, target
            elif request.method != "POST":
                return self.confirm(request, target)
            else:
                try:
                    level, text = self.act(request, target, source)
                except SemaphoreUnavailable:
                    # It may have been applied (no answer is not a no): the list tells.
                    level, text = messages.ERROR, self.unanswered_text
        messages.add_message(request, level, text)
        return HttpResponseRedirect(self._url("changelist"))

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Never (nor add, nor delete): the rows are DynamoDB's, changed by the actions."""
        return False

    has_add_permission = has_delete_permission = has_change_permission

    def _url(self, name: str, **query: Any) -> str:
        url = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_{name}")
        return f"{url}?{urlencode(query)}" if query else url

    def _read(
        self, read: Callable[[], _T], empty: _T, bad_text: str = ""
    ) -> tuple[_T, dict[str, str]]:
        """``read()``, or ``empty`` and what the page says instead (``bad_cursor``: a page
        link this site did not write, ``bad_text`` or :attr:`bad_cursor_text`; ``error``:
        DynamoDB's)."""
        try:
            return read(), {}
        except cursors.BadCursor:
            return empty, {"bad_cursor": bad_text or self.bad_cursor_text}
        except SemaphoreUnavailable as exc:
            return empty, {"error": str(exc)}

    @staticmethod
    def _page(request: HttpRequest, template: str, context: dict[str, Any]) -> HttpResponse:
        """The page; a 400 when it shows a page link this site did not write."""
        status = 400 if context.get("bad_cursor") else 200
        return TemplateResponse(request, template, context, status=status)

    def _list_context(
        self, request: HttpRequest, title: str, filters: dict[str, str], page: Page, **extra: Any
    ) -> dict[str, Any]:
        """A list page's context: its ``page`` of rows, its search (``filters["q"]``), its
        other filters, the links to the first page (unless shown) and the next."""
        next_cursor = page.next_cursor
        return {
            **self._context(request, title),
            "page": page,
            "query": filters["q"],
            "filters": {k: v for k, v in filters.items() if v and k != "q"},
            "next_url": link(filters, cursor=next_cursor) if next_cursor else None,
            "first_url": link(filters) if request.GET.get("cursor") else None,
            **extra,
        }

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
        opts = get_user_model()._meta
        may_open = self.admin_site.is_registered(get_user_model()) and (
            request.user.has_perm(f"{opts.app_label}.view_{opts.model_name}")
            or request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}")
        )
        shown: dict[str, dict[str, Any]] = {}
        for user_id, user in usernames.users(user_ids).items():
            url = None
            if may_open:
                with contextlib.suppress(NoReverseMatch):
                    change = f"admin:{opts.app_label}_{opts.model_name}_change"
                    url = reverse(change, args=[quote(user.pk)])
            shown[user_id] = {"name": user.get_username(), "url": url}
        return shown

    def _holder(self, user_id: str, users: dict[str, dict[str, Any]]) -> dict[str, Any]:
        user = users.get(user_id)
        if user is None:
            return {"name": user_id, "url": None, "django": False, "filter": user_id}
        return {**user, "django": True, "filter": user["name"]}
