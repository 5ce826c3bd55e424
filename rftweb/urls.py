from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView

from apps.envapi.api import api as envapi

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="runs:list", permanent=False)),
    path("admin/", admin.site.urls),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("runs/", include("apps.runs.urls")),
    path("runs/<int:run_id>/annotate/", include("apps.feedback.urls")),
    path("health/", include("apps.runs.health_urls")),
    path("api/v1/", envapi.urls),
    path("", include("apps.envapi.urls")),
]
