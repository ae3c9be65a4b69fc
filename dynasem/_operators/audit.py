"""The admin's history (``LogEntry``) of what operators did to holds and jobs, from the admin
pages and from the commands alike."""

from __future__ import annotations

from typing import Any

from django.db import models

from ..models import Lock
from . import locks, usernames


def record(user_pk: Any, model: type[models.Model], key: str, text: str) -> None:
    """One ``LogEntry`` (a change of ``model``'s object ``key``) by the user ``user_pk``."""
    # create() rather than log_action(): one call for Django 4.2 to 5.x.
    from django.contrib.admin.models import CHANGE, LogEntry
    from django.contrib.contenttypes.models import ContentType

    LogEntry.objects.create(
        user_id=user_pk,
        content_type_id=ContentType.objects.get_for_model(model).pk,
        object_id=key,
        object_repr=key[:200],
        action_flag=CHANGE,
        change_message=text,
    )


def broke(user_pk: Any, hold: locks.HoldInfo, holder: str, by: str = "") -> str:
    """The text of a break of ``hold`` (its holder shown as ``holder``; ``by``: how), recorded
    as the user ``user_pk``'s unless None."""
    text = f"Broke the hold of {holder} on {hold.resource} (fence {hold.fence}){by}."
    if user_pk is not None:
        record(user_pk, Lock, hold.resource, text)
    return text


def operator(username: str | None) -> tuple[Any, str]:
    """Who a command's change is recorded as: the Django user ``username`` (a LookupError if
    there is none, or it is empty), else the one named as this OS login if any. Returns (pk
    or None, why not)."""
    import getpass

    if username == "":  # --log-as "$OPERATOR" with the variable unset: not "no --log-as"
        raise LookupError("--log-as: empty: give a Django username, or leave --log-as out")
    if username:
        found = usernames.pk_named(username)
        if found is None:
            raise LookupError(f"--log-as: no Django user named {username!r}")
        return found, ""
    try:
        login = getpass.getuser()
    except (KeyError, OSError):
        return None, "no --log-as, and this process has no login name"
    found = usernames.pk_named(login)
    if found is None:
        return None, f"no --log-as, and no Django user is named {login!r} (this login)"
    return found, ""
