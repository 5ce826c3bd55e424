from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView

from apps.envapi import openai_api
from rftweb.api import api

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="runs:list", permanent=False)),
    path("admin/", admin.site.urls),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("runs/", include("apps.control.urls")),
    path("runs/<int:run_id>/annotate/", include("apps.feedback.urls")),
    path("runs/<int:run_id>/signal/", include("apps.feedback.signal_urls")),
    path("health/", include("apps.control.health_urls")),
    # Before the environment API's own routes: OpenAI clients take this as their base URL.
    path("api/v1/runs/<int:run_id>/openai/v1/", include(openai_api.urlpatterns)),
    path("api/v1/", api.urls),
    path("", include("apps.envapi.urls")),
]

# Static files when DEBUG is on and nothing else serves them (daphne serving the ASGI app
# directly, as the page tests do); empty when DEBUG is off.
from django.contrib.staticfiles.urls import staticfiles_urlpatterns

urlpatterns += staticfiles_urlpatterns()
