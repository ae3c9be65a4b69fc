"""URLs of the example project: the admin (dynasem's lock list), login, and the demo app."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    # Django's own LoginView/LogoutView at /accounts/login/ and /accounts/logout/.
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("example_project.projects.urls")),
]
