"""Load the session's user before the view's transaction begins (SQLite only needs it)."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse


class LoadUserFirst:
    """Reads ``request.user`` in autocommit, before ``ATOMIC_REQUESTS`` opens the view's
    transaction. On SQLite a transaction that has read cannot wait for the one writer: it
    fails at once with "database is locked" when it tries to write while another rebuild
    writes. With the user loaded here, a rebuild's first statement is its DELETE, which waits
    for the writer (``timeout``) like any other. PostgreSQL does not need this."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        user = getattr(request, "user", None)
        if user is not None:
            user.is_authenticated  # noqa: B018 - reading it loads the lazy user
        return self.get_response(request)
