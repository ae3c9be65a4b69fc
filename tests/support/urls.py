from __future__ import annotations

from django.contrib import admin
from django.urls import path

from tests.support import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("rebuild/<int:project_id>/", views.rebuild, name="rebuild"),
    path("arebuild/<int:project_id>/", views.arebuild, name="arebuild"),
    path("cbv/<int:project_id>/", views.RebuildView.as_view(), name="cbv"),
    path("custom/<str:name>/", views.custom_busy, name="custom"),
    path("tx/<str:name>/", views.write_in_transaction, name="tx"),
]
