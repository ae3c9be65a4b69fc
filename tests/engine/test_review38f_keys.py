"""Review 38f: a view's key that its request's values make empty is the request's fault, as
one too long or holding a control character is: HTTP 400, never a 500, and nothing sent."""

from __future__ import annotations

import asyncio

from django.http import HttpResponse
from django.test import RequestFactory

from dynasem import semaphore


def test_a_url_value_that_makes_an_empty_key_is_a_400_and_sends_nothing(lock_table, requests_sent):
    # re_path(r"^rebuild/(?P<slug>[-\w]*)/$") passes slug="" for "/rebuild//".
    @semaphore("{slug}", wait=0)
    def by_template(request, slug):
        return HttpResponse("must not run")

    @semaphore(lambda request, slug: slug, wait=0)
    def by_callable(request, slug):
        return HttpResponse("must not run")

    @semaphore("{slug}", wait=0)
    async def by_template_async(request, slug):
        return HttpResponse("must not run")

    requests_sent.reset()
    for response in [
        by_template(RequestFactory().post("/rebuild//"), slug=""),
        by_callable(RequestFactory().post("/rebuild//"), slug=""),
        asyncio.run(by_template_async(RequestFactory().post("/rebuild//"), slug="")),
    ]:
        assert response.status_code == 400
        assert "empty" in response.content.decode()
    assert requests_sent.total == 0


def test_the_423_body_counts_its_seconds_in_words_that_agree():
    from dynasem import SemaphoreBusy, busy_response

    request = RequestFactory().post("/rebuild/42/")
    one = busy_response(request, SemaphoreBusy("tbl_issues:42", 1)).content.decode()
    many = busy_response(request, SemaphoreBusy("tbl_issues:42", 7)).content.decode()
    assert "Retry after 1 second." in one
    assert "Retry after 7 seconds." in many
