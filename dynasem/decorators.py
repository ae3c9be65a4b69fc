"""The view decorator: ``@semaphore("tbl_issues:{project_id}")`` on sync, async and
class-based views (through ``method_decorator``)."""

from __future__ import annotations

import functools
import string
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.http import HttpResponse, HttpResponseBadRequest
from django.utils.functional import LazyObject

from .exceptions import SemaphoreBusy

if TYPE_CHECKING:
    from .core import Semaphore

# Template values are escaped to letters, digits and %XX only, and two fields must be parted
# by at least one other character: then every key parses back to one set of values.
_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")


def escape_value(value: str) -> str:
    return "".join(c if c in _SAFE else "".join(f"%{b:02X}" for b in c.encode()) for c in value)


class _EscapingFormatter(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> str:
        return escape_value(super().format_field(value, format_spec))


_formatter = _EscapingFormatter()


def check_template(template: str) -> None:
    """Refuse templates whose keys could collide: two fields with nothing but letters, digits
    or ``%`` between them (``"{a}{b}"``, ``"{a}x{b}"``)."""
    previous_was_field = False
    try:
        parts = list(_formatter.parse(template))
    except ValueError as exc:
        raise ValueError(
            f"resource template {template!r} is not a valid format string: {exc}"
        ) from None
    for literal, field, _spec, _conv in parts:
        if (
            previous_was_field
            and field is not None
            and all(c in _SAFE or c == "%" for c in literal)
        ):
            raise ValueError(
                f"resource template {template!r} has fields separated only by {literal!r}: put a "
                "separator such as ':' between fields so different arguments never share a key"
            )
        previous_was_field = field is not None or (previous_was_field and not literal)


def format_key(template: Any, request: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    if callable(template):
        key = template(request, *args, **kwargs)
        if not isinstance(key, str):
            raise TypeError(f"the resource callable returned {type(key).__name__}, not a str")
        return key
    try:
        return _formatter.format(template, *args, **kwargs)
    except (KeyError, IndexError) as exc:
        raise ValueError(
            f"resource template {template!r} names {exc} but the view got "
            f"args={args!r} kwargs={sorted(kwargs)!r}"
        ) from None


class KeyTooLong(ValueError):
    """The key a view's arguments make is longer than a resource may be: the request's fault
    (a URL value of hundreds of escaped characters), answered 400, not 500."""

    def __init__(self, key: str, limit: int):
        self.size, self.limit = len(key.encode("utf-8")), limit
        super().__init__(
            f"the lock key made from this request's arguments is {self.size} UTF-8 bytes; at "
            f"most {limit} are allowed"
        )


def _checked(key: str) -> str:
    from .core import MAX_RESOURCE_BYTES  # (core imports this module)

    if len(key.encode("utf-8")) > MAX_RESOURCE_BYTES:
        raise KeyTooLong(key, MAX_RESOURCE_BYTES)
    return key


def bad_key_response(request: Any, exc: KeyTooLong) -> HttpResponse:
    """HTTP 400: the URL's values make a lock key longer than DynamoDB's 1,024-byte limit."""
    return HttpResponseBadRequest(
        f"Bad Request: {exc}.\n", content_type="text/plain; charset=utf-8"
    )


def busy_response(request: Any, exc: SemaphoreBusy) -> HttpResponse:
    """HTTP 423 Locked with ``Retry-After``; says nothing about the holder's token."""
    response = HttpResponse(
        f"Locked: this resource is busy. Retry after {exc.retry_after} seconds.\n",
        status=423,
        content_type="text/plain; charset=utf-8",
    )
    response["Retry-After"] = str(exc.retry_after)
    return response


async def request_user(request: Any) -> Any:
    """``request.user`` for an async view, loaded outside the event loop: it is lazy and reads
    the session and the user from the database. Django >= 5.0 has ``request.auser()``; on 4.2
    the lazy object is made to load in a thread, as ``auser()`` does."""
    auser = getattr(request, "auser", None)
    if auser is not None:
        return await auser()
    user = getattr(request, "user", None)
    # isinstance() looks at the type only, so it does not load the object; reading any
    # attribute does, in sync_to_async's thread.
    if isinstance(user, LazyObject):
        await sync_to_async(lambda: getattr(user, "pk", None))()
    return user


def lock_view(sem: Semaphore, view: Callable[..., Any]) -> Callable[..., Any]:
    template = sem._raw_resource
    if isinstance(template, list | tuple):
        for t in template:
            check_template(t)
    elif isinstance(template, str):
        check_template(template)
    on_busy = sem.on_busy or busy_response

    def keyed(request: Any, args: tuple[Any, ...], kwargs: dict[str, Any], user: Any) -> Semaphore:
        if isinstance(template, list | tuple):
            key: Any = [_checked(format_key(t, request, args, kwargs)) for t in template]
        else:
            key = _checked(format_key(template, request, args, kwargs))
        # The holder is the request's user, never anything the request data says.
        return sem.with_resource(key, user)

    if iscoroutinefunction(view):

        async def async_wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                user = await request_user(request)
                try:
                    locked = keyed(request, args, kwargs, user)
                except KeyTooLong as exc:
                    return bad_key_response(request, exc)
                async with locked:
                    return await view(request, *args, **kwargs)
            except SemaphoreBusy as exc:
                return on_busy(request, exc)

        wrapper: Callable[..., Any] = markcoroutinefunction(async_wrapper)
    else:

        def wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                locked = keyed(request, args, kwargs, getattr(request, "user", None))
            except KeyTooLong as exc:
                return bad_key_response(request, exc)
            try:
                with locked:
                    return view(request, *args, **kwargs)
            except SemaphoreBusy as exc:
                return on_busy(request, exc)

    return functools.wraps(view)(wrapper)
