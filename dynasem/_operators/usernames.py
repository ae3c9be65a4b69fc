"""Stored user ids and Django users: a holder recorded by a user's primary key is shown by its
username, and an operator may name a user by username (the admin and the commands alike)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError


def pk_named(username: str) -> Any:
    """The primary key of the Django user named ``username``, or None."""
    user_model = get_user_model()
    named = user_model._default_manager.filter(**{user_model.USERNAME_FIELD: username})
    return named.values_list("pk", flat=True).first()


def user_id_for(value: str) -> str:
    """The stored user id ``value`` means: a Django user's primary key when a user has that
    username, else the value itself (a pk, a process's host:pid, a name)."""
    try:
        pk = pk_named(value)
    except Exception:
        # No username looks like that (an integer USERNAME_FIELD, say: a ValidationError,
        # ValueError or TypeError), or no auth app, no database reachable: the locks' CLI
        # still works.
        return value
    return value if pk is None else str(pk)


def user_pks(user_ids: Iterable[str]) -> dict[str, Any]:
    """Each stored id that can be a Django user's primary key, as that key."""
    user_model = get_user_model()
    pks: dict[str, Any] = {}
    for user_id in set(user_ids):
        try:
            pk = user_model._meta.pk.to_python(user_id)
        except (ValidationError, ValueError, TypeError):
            continue
        # A holder named by a long number is no user, and no database column holds it.
        if not isinstance(pk, int) or -(2**63) <= pk < 2**63:
            pks[user_id] = pk
    return pks


def users(user_ids: Iterable[str]) -> dict[str, Any]:
    """stored id -> the Django user, for the ids that are Django users' primary keys."""
    pks = user_pks(user_ids)
    if not pks:
        return {}
    found = get_user_model()._default_manager.filter(pk__in=set(pks.values()))
    by_pk = {str(user.pk): user for user in found}
    return {user_id: by_pk[str(pk)] for user_id, pk in pks.items() if str(pk) in by_pk}


def usernames(user_ids: Iterable[str]) -> dict[str, str]:
    """stored id -> username, for the ids that are Django users' primary keys (none when
    there is no auth app or no database to ask: the ids are shown as they are)."""
    try:
        return {user_id: str(user.get_username()) for user_id, user in users(user_ids).items()}
    except Exception:
        return {}
