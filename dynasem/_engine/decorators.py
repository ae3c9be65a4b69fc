"""The decorator: ``@semaphore("job:{pk}")`` on any callable.

Views (sync, async, class-based through ``method_decorator``) answer HTTP 423 when busy and
record ``request.user``; anything else (plain and async functions, methods, Celery tasks,
Django tasks) raises :class:`SemaphoreBusy`. A call is a view call when its first positional
argument is a Django ``HttpRequest`` (or wraps one, as Django REST framework's ``Request``
does). The template's fields are bound from the call's arguments through the callable's
signature.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import string
import threading
import unicodedata
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.http.response import HttpResponseBase
from django.template.response import SimpleTemplateResponse
from django.utils.functional import LazyObject
from django.views import View

from .._observability.logs import facts
from .._transactions import fencing
from ..exceptions import Coalesced, LockLost, Picklable, SemaphoreBusy
from .arguments import LEADER_PREFIX, MAX_RESOURCE_BYTES, check_printable, utf8_size
from .hold import exit_cut_short
from .reentry import exit_failed, leave, left, lent
from .steps import announced_after, from_receiver, run_io_to_end

logger = logging.getLogger("dynasem")

# Characters a template value keeps as written in every template: for values made only of
# these the decorator's key is the template formatted as written, the same string an f-string
# of it gives, so `@semaphore("deploy:{slug}")` and `with semaphore(f"deploy:{slug}")` are one
# lock.
SAFE = frozenset(string.ascii_letters + string.digits + "-_.")


class Decoration:
    """What a semaphore keeps only for decorating: the resource as given (a key template, a
    list of them, or a callable making the key) and ``on_busy``."""

    __slots__ = ("on_busy", "resource")

    def __init__(self, resource: Any, on_busy: Callable[..., Any] | None):
        if on_busy is not None and not callable(on_busy):
            raise TypeError(f"on_busy must be callable(request, exc), not {on_busy!r}")
        self.resource, self.on_busy = resource, on_busy

    @property
    def is_callable(self) -> bool:
        """The key is made by a callable: only a decorated call can make it."""
        return callable(self.resource)


class CallLock(Protocol):
    """The lock around one decorated call: entered with ``with`` or ``async with``."""

    def __enter__(self) -> object: ...

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None: ...

    async def __aenter__(self) -> object: ...

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None: ...


class Decoratable(Protocol):
    """What the decorator needs of a semaphore (``core.Semaphore`` is one by its shape; this
    module never imports ``core``, which imports it)."""

    decoration: Decoration  # the key template (or callable) and ``on_busy``
    user: Any  # the holder recorded for a call that is not a view's

    def with_resource(self, resource: Any, user: Any, after: frozenset[str]) -> CallLock:
        """The lock for one call: the same semaphore on ``resource``, held by ``user``,
        waiting out the holds ``after`` names."""


# What tells a decorated call the holds it succeeds: functions of the call's positional
# arguments that give their tokens (``dynasem.celery``'s, added at ready(): a task's retry, sent
# from its run inside that run's block, succeeds that block's holds). The call's acquire waits
# such a hold out, up to when it could be taken over, rather than be refused by it.
succession: list[Callable[[tuple[Any, ...]], frozenset[str]]] = []


def _succeeded(args: tuple[Any, ...]) -> frozenset[str]:
    """The tokens of the holds this call succeeds (none, outside a task's retry)."""
    return frozenset().union(*(find(args) for find in succession))


def _kept(char: str) -> bool:
    """Whether a template value keeps ``char`` as written in every template: letters,
    digits, ``-``, ``_``, ``.``, and printable characters beyond ASCII (``é``, ``日``). Every
    other ASCII character (``%``, ``:``, ``/``, space, controls) and every non-ASCII
    control, format character or space is escaped: a key's ASCII punctuation is then all the
    template's own, and a key never holds a character that prints nothing or rewrites a
    terminal. A lone surrogate is kept, for the resource check to refuse by name."""
    if char.isascii():
        return char in SAFE  # every SAFE character is ASCII
    category = unicodedata.category(char)
    return category == "Cs" or category[0] not in "CZ"


@functools.lru_cache(maxsize=1024)
def _parsed(template: str) -> tuple[frozenset[str], str, str]:
    """What a template's values escape beyond what ``_kept`` escapes (the characters parting
    its fields: one beyond ASCII, ``→``, must be escaped in values too), the literal text
    before its first field, and that text and the literal after the first field (for
    ``LEADER_PREFIX``); after checking the template.

    Each pair of fields must be parted by a literal holding a character outside ``SAFE`` and
    ``%``: escaping those characters (and ``%``) in the values means the first of them after
    a field always belongs to the literal that follows it, so every key parses back to one
    set of values.
    """
    check_printable(template, "resource template")
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(
            f"resource template {template!r} is not a valid format string: {exc}"
        ) from None
    literals = [""]  # the literal text before each field, then after the last
    for literal, field, _spec, _conv in parts:
        literals[-1] += literal
        if field is not None:
            literals.append("")
    separators: set[str] = set()
    for between in literals[1:-1]:  # the text between two fields
        parting = {c for c in between if c not in SAFE and c != "%"}
        if not parting:
            raise ValueError(
                f"resource template {template!r} has fields separated only by "
                f"{between!r}: put a separator such as ':' or '/' between fields (letters, "
                "digits, '-', '_', '.' and '%' can be part of a value) so that different "
                "arguments never share a key"
            )
        separators |= parting
    also = frozenset(c for c in separators if not c.isascii())
    return also, literals[0], "".join(literals[:2])


def _percent(char: str) -> str:
    """``char`` as ``%XX`` per UTF-8 byte (``é``: ``%C3%A9``)."""
    return "".join(f"%{b:02X}" for b in char.encode())


class _EscapingFormatter(string.Formatter):
    def __init__(self, also: frozenset[str]) -> None:
        self.also = also

    def format_field(self, value: Any, format_spec: str) -> str:
        text: str = super().format_field(value, format_spec)
        if SAFE.issuperset(text):  # digits, slugs: the common case, kept whole at once
            return text
        return "".join(c if _kept(c) and c not in self.also else _percent(c) for c in text)


def _unreserved(key: str, lead: str, around: str) -> str:
    """``key``, unless a field's value reaches into the reserved ``leader:`` (``{kind}:{id}`` with
    ``kind="leader"``): then the first character that value gave it is escaped too, which
    keeps the key apart from every other value's (``%`` is escaped in every value)."""
    # The resources dynasem's own features take, which no formatted field may reach: a view's
    # {slug} of "leader:beat", or {kind}:{id} with kind="leader", must not take (or block) a
    # leadership. (A unique task's key is its own template's: ':' being escaped in every field
    # keeps it out of another template's reach.)
    if key.startswith(LEADER_PREFIX) and not around.startswith(LEADER_PREFIX):
        # Values never hold ':' and the prefix is letters then ':': that ':' is the
        # template's, and the one value in the letters before it is the first field's,
        # which begins right after the leading text (and is not empty: else the
        # template's own text would make the prefix). Its first character is a letter.
        start = len(lead)
        return key[:start] + _percent(key[start]) + key[start + 1 :]
    return key


def resource_key(template: str, /, *args: Any, **kwargs: Any) -> str:
    """The resource the decorator locks for these template values: ``template.format(*args,
    **kwargs)`` where every value made only of letters, digits, ``-``, ``_`` and ``.`` is used
    as written. In any other value every ASCII character but those (``%``, ``:``, ``/``,
    spaces, controls) and every non-ASCII control or space is written ``%XX`` (its UTF-8
    bytes), so no two sets of values share a key and no value makes a key of a template
    with other punctuation (``tbl_issues:{id}`` never makes ``tbl_issues:1:export``), nor
    reaches dynasem's own ``leader:`` resources. Code outside the decorated call names the
    same lock with it: ``resource_key("deploy:{slug}", slug="web")`` is ``"deploy:web"``. A
    field the values lack is a ValueError, as it is for the decorator."""
    if not isinstance(template, str):
        raise TypeError(f"template must be a str, not {type(template).__name__}")
    also, lead, around = _parsed(template)
    try:
        key = _EscapingFormatter(also).format(template, *args, **kwargs)
    except (KeyError, IndexError, AttributeError) as exc:
        raise FieldMissing(template, exc) from None
    return _unreserved(key, lead, around)


class FieldMissing(Picklable, ValueError):
    """A template names a value (a field, a position, an attribute) its values lack: a
    ValueError, as the decorator's call that lacks it is, not str.format's KeyError."""

    def __init__(self, template: str, exc: Exception):
        self.field = str(exc)
        super().__init__(
            f"resource template {template!r} names a value not given "
            f"({type(exc).__name__}: {self.field})"
        )


# What a view's key is made of, as a BadKey names it.
REQUEST = "this request's arguments"


class BadKey(Picklable, ValueError):
    """The key a call's arguments make cannot be a resource: for a view, the request's fault
    (a URL value), answered 400, not 500."""


class KeyTooLong(BadKey):
    """The key a view's arguments make is longer than a resource may be: the request's fault
    (a URL value of hundreds of escaped characters), answered 400, not 500."""

    def __init__(self, key: str, limit: int, made_of: str = REQUEST):
        self.size, self.limit = len(key.encode("utf-8")), limit
        super().__init__(
            f"the lock key made from {made_of} is {self.size} UTF-8 bytes; at most {limit} are "
            "allowed"
        )


class KeyNotPrintable(BadKey):
    """The key a callable made of a view's arguments holds a control character (a template's
    values are escaped; a callable's key is used as returned): answered 400, not 500."""

    def __init__(self, char: str, index: int, made_of: str = REQUEST):
        self.char, self.index = char, index
        super().__init__(
            f"the lock key made from {made_of} contains the control character {char!r} at "
            f"index {index}"
        )


def checked_keys(resource: Any, made_of: str = REQUEST) -> Any:
    """A call's resource(s), refused as :class:`BadKey` when empty, past the size a key may
    have or with a control character in it (``made_of``: what the key was made of, as the
    error names it: a view's request, a task's enqueue)."""
    for key in resource if isinstance(resource, list | tuple) else [resource]:
        if not isinstance(key, str):
            continue
        if not key:  # a URL value of "" for a template of that value alone
            raise BadKey(f"the lock key made from {made_of} is empty")
        # utf8_size: a lone surrogate is a ValueError naming the resource, not a codec error.
        if utf8_size(key, "resource") > MAX_RESOURCE_BYTES:
            raise KeyTooLong(key, MAX_RESOURCE_BYTES, made_of)
        for index, char in enumerate(key):
            if unicodedata.category(char) == "Cc":
                raise KeyNotPrintable(char, index, made_of)
    return resource


def bad_key_response(request: Any, exc: BadKey) -> HttpResponse:
    """HTTP 400: the URL's values make a lock key that cannot be a resource (empty, longer
    than DynamoDB's 1,024-byte limit, or holding a control character)."""
    return HttpResponseBadRequest(
        f"Bad Request: {exc}.\n", content_type="text/plain; charset=utf-8"
    )


def coalesced_response(request: Any, exc: Coalesced) -> HttpResponse:
    """HTTP 202 Accepted: the resource is busy and a run that starts after this request is
    queued (``coalesce=True``), so this request's changes will be part of it. What a
    decorated view answers for a ``Coalesced``; logged as ``busy_response`` logs."""
    response = HttpResponse(
        "Accepted: a run that starts after this request is queued; it includes this "
        "request's changes.\n",
        status=202,
        content_type="text/plain; charset=utf-8",
    )
    said = ("Accepted: %s: %r is busy and its next run is queued (by %r)", exc.next_user_id)
    plain = {"next_user_id": exc.next_user_id}
    return _logged(
        request, exc, response, said, plain, outcome="accepted", next_holder=exc.next_user_id
    )


def busy_response(request: Any, exc: SemaphoreBusy) -> HttpResponse:
    """HTTP 423 Locked with ``Retry-After``: what a decorated view answers when busy, unless
    its ``on_busy`` answers otherwise (an ``on_busy(request, exc)`` may call it and adapt the
    response). Says nothing about the holder's token.

    Logged here, once, at INFO on the ``dynasem`` logger with its facts as ``extra``
    (``resource``, ``holder_user_id``, ``retry_after``, ``queue_position``,
    ``estimated_wait``, and ``status_code`` and ``request`` as Django's own request log
    has them), and marked as logged, so that Django's ``django.request`` does not log
    this expected answer of a busy lock again as a WARNING per request.

    A coalescing semaphore's ``Coalesced`` gets ``coalesced_response`` instead."""
    if isinstance(exc, Coalesced):
        return coalesced_response(request, exc)
    unit = "second" if exc.retry_after == 1 else "seconds"
    response = HttpResponse(
        f"Locked: this resource is busy. Retry after {exc.retry_after} {unit}.\n",
        status=423,
        content_type="text/plain; charset=utf-8",
    )
    response["Retry-After"] = str(exc.retry_after)
    message = "Locked: %s: %r is busy (held by %r, queue position %s); Retry-After: %d"
    said = (message, exc.holder_user_id, exc.queue_position, exc.retry_after)
    more = {"retry_after": exc.retry_after, "queue_position": exc.queue_position}
    plain = {**more, "estimated_wait": exc.estimated_wait}
    _logged(request, exc, response, said, plain, outcome="busy", wait=exc.estimated_wait, **more)
    # django.utils.log.log_response skips a response carrying this mark (Django 4.2 to 6.1
    # alike); it is the mark Django sets itself once it has logged a response.
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


def _logged(
    request: Any,
    exc: SemaphoreBusy,
    response: HttpResponse,
    said: tuple[Any, ...],
    plain: dict[str, Any],
    **more: Any,
) -> HttpResponse:
    """``response``, logged at INFO: ``said`` is the message and its arguments after the
    request's path and the resource; ``extra`` holds what Django's request log has
    (``status_code``, ``request``), the busy lock's facts by their plain names (``resource``,
    ``holder_user_id``, then ``plain``) and by dynasem's (:func:`facts`, with ``more``)."""
    # Escaped as Django escapes the paths it logs: a request's path is the client's.
    path = str(getattr(request, "path", "-")).encode("unicode_escape").decode("ascii")
    holder = exc.holder_user_id
    extra = {"status_code": response.status_code, "request": request, "resource": exc.resource}
    extra.update(holder_user_id=holder, **plain)
    extra.update(facts(exc.resource, path=path, holder=holder, **more))
    logger.info(said[0], path, exc.resource, *said[1:], extra=extra)
    return response


def request_of(args: tuple[Any, ...]) -> Any:
    """The request when this is a view call: the first positional argument is an
    ``HttpRequest``, or wraps one in ``_request`` (Django REST framework's ``Request``)."""
    first = args[0] if args else None
    wrapped = getattr(first, "_request", None)
    return first if isinstance(first, HttpRequest) or isinstance(wrapped, HttpRequest) else None


def _signatures(func: Callable[..., Any]) -> list[inspect.Signature]:
    """The signatures to bind a call with, the likeliest first. ``method_decorator`` hands
    us a ``partial`` of the bound method whose ``__wrapped__`` is the unbound one (with
    ``self``): for it, the partial's own signature comes first."""
    found: list[inspect.Signature] = []
    order = (False, True) if isinstance(func, functools.partial) else (True, False)
    for follow in order:
        try:
            sig = inspect.signature(func, follow_wrapped=follow)
        except (TypeError, ValueError):  # no signature (some builtins): use the call as is
            continue
        if sig not in found:
            found.append(sig)
    return found


class KeyMaker:
    """Builds the resource(s) of one call from the decorator's template(s) or callable."""

    def __init__(self, template: Any, func: Callable[..., Any], name: str = "resource") -> None:
        if isinstance(template, str | list | tuple):
            for each in [template] if isinstance(template, str) else template:
                # A unique task's unique_key comes here unchecked (semaphore() checked its own).
                if not isinstance(each, str):
                    kind = type(each).__name__
                    raise TypeError(f"{name} must be a str template, not {kind}: {each!r}")
                if not each:
                    raise ValueError(f"{name} must be a non-empty str template")
                _parsed(each)  # refuses a template whose keys could collide
        elif not callable(template):
            raise TypeError(
                f"{name} must be a str template, a list of them or a callable, not "
                f"{type(template).__name__}: {template!r}"
            )
        self.template = template
        self.name = getattr(func, "__qualname__", None) or repr(func)
        self.signatures = _signatures(func)

    def named(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments by name: bound through the signature, defaults applied."""
        error: TypeError | None = None
        for sig in self.signatures:
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError as exc:
                error = error or exc
                continue
            bound.apply_defaults()
            named = dict(bound.arguments)
            for param in sig.parameters.values():
                if param.kind is inspect.Parameter.VAR_KEYWORD:
                    named.update(named.pop(param.name, {}))
            return named
        if error is not None:
            # The call itself would fail the same way: say so before taking anything.
            raise TypeError(f"{self.name}() {error}") from None
        return dict(kwargs)

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any], view: bool) -> Any:
        template = self.template
        if callable(template):
            key = template(*args, **kwargs)  # the same arguments as the decorated callable
            if not isinstance(key, str | list | tuple):
                raise TypeError(f"the resource callable returned {type(key).__name__}, not a str")
            return key
        # Positional fields ({0}) index the arguments after the request for a view, every
        # positional argument otherwise; named fields come from the signature.
        positional = args[1:] if view else args
        named = self.named(args, kwargs)
        keys = []
        for each in template if isinstance(template, list | tuple) else [template]:
            try:
                keys.append(resource_key(each, *positional, **named))
            except FieldMissing as exc:
                raise ValueError(
                    f"resource template {each!r} names {exc.field} but the "
                    f"{'view' if view else 'call'} {self.name}() got args={positional!r} "
                    f"and arguments {sorted(named)!r}"
                ) from None
        return keys if isinstance(template, list | tuple) else keys[0]


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


def _refuse(func: Any) -> None:
    celery_task = hasattr(func, "apply_async") and hasattr(func, "run")
    if celery_task or type(func).__module__.startswith("django.tasks"):
        raise TypeError(
            f"semaphore(...) goes below the task decorator, next to the function: "
            f"@task / @semaphore(...) / def ..., not over the task {func!r}"
        )
    if not callable(func):
        raise TypeError(f"semaphore(...) decorates a callable, not {func!r}")
    if isinstance(func, type):
        raise TypeError(
            f"semaphore(...) cannot decorate the class {func.__qualname__}: decorate a method "
            "(for a class-based view: @method_decorator(semaphore(...), name='post'))"
        )
    called = _called(func)
    if inspect.isgeneratorfunction(called) or inspect.isasyncgenfunction(called):
        raise TypeError(
            f"semaphore(...) cannot decorate the generator function {called.__qualname__}: the "
            "lock would be given back at its first yield; use `with semaphore(...)` inside it"
        )


def _called(func: Any) -> Any:
    """What runs when ``func`` is called: itself, or for an instance of a class with a
    ``__call__`` (a handler object), that method, which asgiref's and inspect's tests of
    coroutine and generator functions do not look at."""
    if inspect.isroutine(func) or isinstance(func, functools.partial):
        return func
    return type(func).__call__


def _is_async(func: Any) -> bool:
    """Whether calling ``func`` makes a coroutine (an instance whose ``__call__`` is a
    coroutine function too, an async class-based view's ``dispatch``: locked as a sync call,
    its coroutine would run after the lock was given back)."""
    return (
        iscoroutinefunction(func)
        or iscoroutinefunction(_called(func))
        or _async_views_sync_handler(func)
    )


# The sync methods of Django's View that answer an async view with a coroutine.
_ASYNC_ANSWERING = frozenset({"dispatch", "options", "http_method_not_allowed"})


def _async_views_sync_handler(func: Any) -> bool:
    """Whether ``func`` is ``dispatch`` (or ``options``, ``http_method_not_allowed``) of an
    async class-based view, as ``method_decorator`` hands it (a ``partial`` of the bound
    method, maybe inside other decorators' wrappers): a sync method that returns the
    handler's coroutine, which Django awaits."""
    for layer in _layers(func):
        view = getattr(layer, "__self__", None)
        if isinstance(view, View):
            named = getattr(layer, "__name__", None) in _ASYNC_ANSWERING
            return named and bool(type(view).view_is_async)
    return False


def lock_callable(sem: Decoratable, func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` taking ``sem`` (with the call's resource) around every call."""
    _refuse(func)
    is_async = _is_async(func)
    if is_async and getattr(sem, "fence_db", False):
        raise fencing.no_async()
    keys = KeyMaker(sem.decoration.resource, func)
    when_busy = functools.partial(_when_busy, sem.decoration.on_busy)

    if is_async:

        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            request, resource, bad = _resolve(keys, args, kwargs)
            if bad is not None:
                return bad
            # The holder: the request's user (never anything from request data), or the
            # decorator's own user= for anything that is not a view.
            user = await request_user(request) if request is not None else sem.user
            async with contextlib.AsyncExitStack() as stack:
                lock = sem.with_resource(resource, user, _succeeded(args))
                try:
                    held = await stack.enter_async_context(lock)
                except SemaphoreBusy as exc:
                    result = when_busy(request, exc, args, kwargs)
                    return await result if inspect.isawaitable(result) else result
                # Held until the coroutine finishes, not until it is created.
                return _answered(stack, request, await func(*args, **kwargs), lock, held)

        wrapper: Callable[..., Any] = markcoroutinefunction(async_wrapper)
    else:

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            request, resource, bad = _resolve(keys, args, kwargs)
            if bad is not None:
                return bad
            user = getattr(request, "user", None) if request is not None else sem.user
            with contextlib.ExitStack() as stack:
                lock = sem.with_resource(resource, user, _succeeded(args))
                try:
                    held = stack.enter_context(lock)
                except SemaphoreBusy as exc:
                    return when_busy(request, exc, args, kwargs)
                done = _synchronous(func(*args, **kwargs), func, keys.name)
                return _answered(stack, request, done, lock, held)

    return functools.wraps(func)(wrapper)


def _synchronous(result: Any, func: Any, name: str) -> Any:
    """``result`` of a call of ``func`` locked as a sync one; a coroutine (an ``async def``
    under a sync decorator that hides it) is closed unstarted and refused: its work would run
    once the lock was given back. So is the generator of a generator function (or an async
    one) hidden so, as the generator function itself is (a generator another generator
    function of the call made is the call's answer)."""
    if inspect.iscoroutine(result):
        result.close()
        raise TypeError(
            f"{name}() returned a coroutine from a call locked as a sync one: its work would run "
            "after the lock was given back; put @semaphore(...) directly on the async def (or "
            "mark the sync wrapper with asgiref.sync.markcoroutinefunction)"
        )
    code = getattr(result, "gi_code", None) or getattr(result, "ag_code", None)
    if code is not None and code is _hidden_generators_code(func):
        if inspect.isgenerator(result):
            result.close()
        raise TypeError(
            f"{name}() is a generator function under a decorator that hides it: the lock would "
            "be given back before its body began; use `with semaphore(...)` inside it"
        )
    return result


def _hidden_generators_code(func: Any) -> Any:
    """The code of the generator function (or async one) that ``func`` wraps (its
    ``__wrapped__`` chain, ``partial``s), if any."""
    for layer in _layers(func):
        if inspect.isgeneratorfunction(layer) or inspect.isasyncgenfunction(layer):
            return getattr(layer, "__code__", None)
    return None


def _layers(func: Any) -> Iterator[Any]:
    """``func`` and what it wraps, outermost first: its ``__wrapped__`` chain, through
    ``partial``s (the function of each, not the partial itself), each once (a chain that
    comes round again ends there)."""
    seen: set[int] = set()
    while func is not None and id(func) not in seen:
        seen.add(id(func))
        if isinstance(func, functools.partial):
            func = func.func
            continue
        yield func
        func = getattr(func, "__wrapped__", None)


def _when_busy(
    on_busy: Callable[..., Any] | None, request: Any, exc: SemaphoreBusy, args: Any, kwargs: Any
) -> Any:
    """What a busy call answers: a view, ``on_busy(request, exc)`` or 423; anything else,
    ``on_busy(exc, *args, **kwargs)``, or the exception raised. A signal receiver's
    ``SemaphoreBusy`` (another lock's, as the hold was given back) is raised as it is."""
    if from_receiver(exc):
        raise exc
    if request is not None:
        return (on_busy or busy_response)(request, exc)
    if on_busy is None:
        raise exc
    return on_busy(exc, *args, **kwargs)


def _resolve(keys: KeyMaker, args: Any, kwargs: Any) -> tuple[Any, Any, HttpResponse | None]:
    """The call's request (a view's), its resource, and the 400 to answer instead when a
    view's key cannot be a resource."""
    request = request_of(args)
    resource = keys(args, kwargs, request is not None)
    if request is not None:
        try:
            resource = checked_keys(resource)
        except BadKey as exc:
            return request, resource, bad_key_response(request, exc)
    return request, resource, None


def _answered(stack: Any, request: Any, response: Any, lock: Any, held: Any) -> Any:
    """``response``; a view's response whose work runs after the view returns takes the hold
    with it (the block ``stack`` holds it in ends with that work, not here): a streaming
    body, run as the server sends it; a template response, rendered by Django's handler
    (class-based views' lazy querysets are read then). A fenced semaphore's transaction ends
    with the view: its hold does too."""
    if request is None or getattr(lock, "fence_db", False):
        return response
    if isinstance(response, HttpResponseBase) and response.streaming:
        stack.pop_all()
        return _held_while_streaming(response, lock, held)
    if isinstance(response, SimpleTemplateResponse) and not response.is_rendered:
        stack.pop_all()
        give_back = _carried(response, lock, held)
        # Called by render() once the content is made (None: the response stays as it is).
        response.add_post_render_callback(lambda rendered: give_back())
        render = _rendered_holding(response, held, give_back)
        response.render = render  # type: ignore[method-assign]
        return response
    return response


def _rendered_holding(
    response: Any, held: Any, give_back: Callable[[bool], None]
) -> Callable[[], Any]:
    """A template response's ``render``, run as the view's holder of ``held`` (Django's
    ASGI handler renders in another ``sync_to_async`` call than the view's). Weakly: the
    response must not keep itself alive, or its drop is seen by the collector only. An
    outer decorator's wraps an inner one's. A render that raises gives the hold back
    (``give_back``): the view's work is over, and the response, kept by the exception's
    traceback in a reference cycle (asgiref's), may be dropped by the collector only."""
    inner = vars(response).get("render")
    ref = weakref.ref(response)

    def render() -> Any:
        answer = ref()
        if answer is None:  # gone: nothing to render
            return None
        vars(answer).pop("render", None)  # once; never pickled with the response
        try:
            with lent(held):
                return inner() if inner is not None else answer.render()
        except BaseException:
            # The render's own exception goes on past a raising lock_released receiver
            # (logged), as a streamed body's does; a loss is logged and signalled then.
            give_back(True)
            raise

    return render


def _carried(response: Any, lock: Any, held: Any) -> Callable[..., None]:
    """What gives back ``held``, carried by ``response`` past the view: once, whoever calls
    first. The view's block is left now (its hold is no longer this thread's or task's
    ``current_hold``). Also given back when the response is dropped unfinished (below).
    Nothing of it is kept on the response: a rendered template response is pickled by
    Django's cache middleware."""
    left(lock, None, "semaphore")
    # Once (the stream's end, then close(), each call it): a re-entered hold (the caller's
    # block holds it too) counts this block's depth once; a second release would give back
    # the caller's share while its block runs.
    ours = [held]

    def give_back(raised: bool = False) -> None:
        """``raised``: the work ended with an exception of its own (a streamed body's), which
        goes on past a raising lock_released receiver (logged), as a block's does."""
        depth = getattr(held, "outer", held).depth  # plain attributes: no signal lands here
        try:
            ours.pop()  # one caller only, across threads
        except IndexError:
            return  # given back already
        except BaseException as failure:  # an interrupt as it returned: ours, not begun
            exit_cut_short(held, depth, failure)
            raise
        try:
            leave(held, raised)
        except BaseException as failure:  # an interrupt at its first line: as a block's exit
            exit_cut_short(held, depth, failure)
            raise

    # Neither finished nor closed: replaced by another response and dropped (Django's
    # ConditionalGetMiddleware answers a revalidation with a new 304 and leaves this one
    # unclosed; a template that raises leaves it unrendered). Else renewed for nobody while
    # the process lives. Given back in a thread of its own: the collector may run this
    # anywhere, holding anything.
    weakref.finalize(response, _given_back_when_dropped, ours, give_back).atexit = False
    return give_back


def _held_while_streaming(response: Any, lock: Any, held: Any) -> Any:
    """``response``, its lock given back when its body has been sent (or the stream is
    closed, or the response dropped), not when the view returned: the body of a streaming
    view is its work."""
    give_back = _carried(response, lock, held)
    # Closed without being iterated (a body never started has no finally to run).
    response._resource_closers.append(give_back)
    chunks = response.streaming_content
    if response.is_async:

        async def content() -> Any:
            raised = True  # till the body ends: its exception, a cancel, aclose()
            try:
                async for chunk in chunks:
                    yield chunk
                raised = False
            finally:
                # lock_released sent here, as an async block's is (steps.announced_after).
                failed = functools.partial(exit_failed, held) if raised else None
                await announced_after(run_io_to_end(give_back, raised), failed)

        response.streaming_content = content()
    else:

        def content() -> Any:
            raised = True  # till the body ends: its exception, close()
            try:
                yield from chunks
                raised = False
            finally:
                give_back(raised)

        response.streaming_content = content()
    return response


def _given_back_when_dropped(ours: list[Any], give_back: Callable[[], None]) -> None:
    def quietly() -> None:
        with contextlib.suppress(LockLost):  # lost meanwhile: logged and signalled then
            give_back()

    if ours:  # not given back by the body's end or close()
        threading.Thread(target=quietly, name="dynasem-dropped-stream", daemon=True).start()
