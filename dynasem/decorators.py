"""The view decorator: ``@semaphore("tbl_issues:{project_id}")`` on sync, async and
class-based views (through ``method_decorator``)."""

from __future__ import annotations

import functools
import string
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpResponse

from .exceptions import SemaphoreBusy

if TYPE_CHECKING:
    from .core import Semaphore

# Characters a template value keeps as written in every template: for values made only of
# these the decorator's key is the template formatted as written, the same string an f-string
# of it gives, so `@semaphore("deploy:{slug}")` and `with semaphore(f"deploy:{slug}")` are one
# lock.
SAFE = frozenset(string.ascii_letters + string.digits + "-_.")


@functools.lru_cache(maxsize=1024)
def _escaped_chars(template: str) -> frozenset[str]:
    """The characters values must escape (as ``%XX``) in ``template``, after checking it.

    One field: nothing; the key ``prefix + value + suffix`` gives the value back. Several
    fields: each pair must be parted by a literal holding a character outside ``SAFE`` and
    ``%``; escaping those characters (and ``%``) in the values means the first of them after
    a field always belongs to the literal that follows it, so every key parses back to one
    set of values.
    """
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(
            f"resource template {template!r} is not a valid format string: {exc}"
        ) from None
    separators: set[str] = set()
    fields = 0
    between = ""  # the literal text since the last field
    for literal, field, _spec, _conv in parts:
        between += literal
        if field is None:
            continue
        if fields:
            parting = {c for c in between if c not in SAFE and c != "%"}
            if not parting:
                raise ValueError(
                    f"resource template {template!r} has fields separated only by "
                    f"{between!r}: put a separator such as ':' or '/' between fields (letters, "
                    "digits, '-', '_', '.' and '%' can be part of a value) so that different "
                    "arguments never share a key"
                )
            separators |= parting
        fields += 1
        between = ""
    return frozenset(separators | {"%"}) if fields > 1 else frozenset()


def check_template(template: str) -> None:
    """Refuse templates whose keys could collide: two fields with nothing but letters, digits,
    ``-``, ``_``, ``.`` or ``%`` between them (``"{a}{b}"``, ``"{a}-{b}"``)."""
    _escaped_chars(template)


def _escape(value: str, chars: frozenset[str]) -> str:
    if not chars or not any(c in chars for c in value):
        return value
    return "".join("".join(f"%{b:02X}" for b in c.encode()) if c in chars else c for c in value)


class _EscapingFormatter(string.Formatter):
    def __init__(self, chars: frozenset[str]) -> None:
        self.chars = chars

    def format_field(self, value: Any, format_spec: str) -> str:
        return _escape(super().format_field(value, format_spec), self.chars)


def resource_key(template: str, /, *args: Any, **kwargs: Any) -> str:
    """The resource the decorator locks for these template values: ``template.format(*args,
    **kwargs)`` where every value made only of letters, digits, ``-``, ``_`` and ``.`` is used
    as written; other characters are escaped (``%XX``) where needed to keep two sets of values
    apart (only in templates with several fields: ``%`` and the characters that part them)."""
    if not isinstance(template, str):
        raise TypeError(f"template must be a str, not {type(template).__name__}")
    return _EscapingFormatter(_escaped_chars(template)).format(template, *args, **kwargs)


def format_key(template: Any, request: Any, args: tuple, kwargs: dict) -> str:
    if callable(template):
        key = template(request, *args, **kwargs)
        if not isinstance(key, str):
            raise TypeError(f"the resource callable returned {type(key).__name__}, not a str")
        return key
    try:
        return resource_key(template, *args, **kwargs)
    except (KeyError, IndexError) as exc:
        raise ValueError(
            f"resource template {template!r} names {exc} but the view got "
            f"args={args!r} kwargs={sorted(kwargs)!r}"
        ) from None


def busy_response(request: Any, exc: SemaphoreBusy) -> HttpResponse:
    """HTTP 423 Locked with ``Retry-After``; says nothing about the holder's token."""
    response = HttpResponse(
        f"Locked: this resource is busy. Retry after {exc.retry_after} seconds.\n",
        status=423,
        content_type="text/plain; charset=utf-8",
    )
    response["Retry-After"] = str(exc.retry_after)
    return response


def lock_view(sem: Semaphore, view: Callable[..., Any]) -> Callable[..., Any]:
    template = sem._raw_resource
    if isinstance(template, list | tuple):
        for t in template:
            check_template(t)
    elif isinstance(template, str):
        check_template(template)
    on_busy = sem.on_busy or busy_response

    def keyed(request: Any, args: tuple, kwargs: dict, user: Any) -> Semaphore:
        if isinstance(template, list | tuple):
            key: Any = [format_key(t, request, args, kwargs) for t in template]
        else:
            key = format_key(template, request, args, kwargs)
        # The holder is the request's user, never anything the request data says.
        return sem.with_resource(key, user)

    if iscoroutinefunction(view):

        async def async_wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                # request.user is lazy and loads from the database: not inside the loop.
                auser = getattr(request, "auser", None)
                user = await auser() if auser is not None else getattr(request, "user", None)
                async with keyed(request, args, kwargs, user):
                    return await view(request, *args, **kwargs)
            except SemaphoreBusy as exc:
                return on_busy(request, exc)

        wrapper: Callable[..., Any] = markcoroutinefunction(async_wrapper)
    else:

        def wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                with keyed(request, args, kwargs, getattr(request, "user", None)):
                    return view(request, *args, **kwargs)
            except SemaphoreBusy as exc:
                return on_busy(request, exc)

    return functools.wraps(view)(wrapper)
