"""What dynasem's admin pages share (:mod:`dynasem.admin` registers them): the base class
of the admins of its table-less models, and the small helpers their pages use."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import django
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.db import models
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, path, reverse
from django.views.decorators.http import require_http_methods

from .. import _clock as clock
from .._storage import dynamodb
from . import audit, usernames

if TYPE_CHECKING:  # django-stubs makes ModelAdmin generic; Django's own class is not subscriptable
    ModelAdmin = admin.ModelAdmin[models.Model]
else:
    ModelAdmin = admin.ModelAdmin


def _quick(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """``view`` with its DynamoDB requests on the quick client (``dynamodb.quick``): an operator
    is told within ~2 s that DynamoDB is unavailable, not kept waiting on a hung endpoint."""

    @functools.wraps(view)
    def inner(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        with dynamodb.quick():
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
    # What a page link shows that this site did not write for its list and filters (edited,
    # cut short, of another filter, or signed with a SECRET_KEY since retired): a 400.
    bad_cursor_text = (
        "That page link was not written by this site for this list and these filters (it "
        "was changed or cut short, is of another filter, or was signed with a retired "
        "SECRET_KEY): start from the first page."
    )
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
