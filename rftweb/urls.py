from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView

from apps.control import accounts, notification_views
from apps.control import views as control_views
from apps.envapi import openai_api
from rftweb import account
from rftweb.api import api

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="runs:list", permanent=False)),
    path("admin/", admin.site.urls),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    # Accounts without the admin site: invitations, Django's password reset, staff's list.
    path("invite/<str:token>/", accounts.invitation_open, name="invitation"),
    path("password/reset/", auth_views.PasswordResetView.as_view(), name="password_reset"),
    path("password/reset/sent/", auth_views.PasswordResetDoneView.as_view(), name="password_reset_done"),
    path("password/reset/<uidb64>/<token>/", accounts.PasswordSetView.as_view(), name="password_reset_confirm"),
    path("password/reset/done/", auth_views.PasswordResetCompleteView.as_view(), name="password_reset_complete"),
    # A person's own account: email address, password, API keys (rftweb/account.py).
    path("account/", account.account_page, name="account"),
    path("account/password/", auth_views.PasswordChangeView.as_view(), name="password_change"),
    path("account/password/done/", auth_views.PasswordChangeDoneView.as_view(), name="password_change_done"),
    path("accounts/", accounts.account_list, name="accounts"),
    path("accounts/<int:user_id>/active/", accounts.account_active, name="account_active"),
    # A run's end told in the header and by email (apps/control/notifications.py).
    path("notifications/", notification_views.notification_list, name="notifications"),
    path("notifications/read/", notification_views.notification_read, name="notifications_read"),
    path("notifications/badge/", notification_views.notification_badge, name="notifications_badge"),
    path("notifications/runs/<int:run_id>/email/", notification_views.notification_email, name="notifications_email"),
    path("runs/", include("apps.control.urls")),
    path("runs/<int:run_id>/annotate/", include("apps.feedback.urls")),
    path("runs/<int:run_id>/signal/", include("apps.feedback.raters.urls")),
    path("runs/<int:run_id>/review/", include("apps.feedback.review.urls")),
    # The blind vote page: opaque tokens only, no run id in its URLs (apps/evaluation/views.py).
    path("vote/", include("apps.evaluation.urls")),
    path("runs/<int:run_id>/evaluations/", include("apps.evaluation.owner_urls")),
    path("health/", include("apps.control.health_urls")),
    # Readiness: 503 naming Postgres or Redis when either is unreachable (/health/ is liveness).
    path("ready/", control_views.ready, name="ready"),
    # Browsers ask for /favicon.ico on every site (a 404 in each page's console otherwise).
    path("favicon.ico", RedirectView.as_view(url="/" + settings.STATIC_URL.strip("/") + "/rftweb/favicon.svg", permanent=True)),
    # Before the environment API's own routes: OpenAI clients take this as their base URL.
    path("api/v1/runs/<int:run_id>/openai/v1/", include(openai_api.urlpatterns)),
    path("api/v1/", api.urls),
    path("", include("apps.envapi.urls")),
]

# Static files when DEBUG is on and nothing else serves them (daphne serving the ASGI app
# directly, as the page tests do); empty when DEBUG is off.
from django.contrib.staticfiles.urls import staticfiles_urlpatterns

urlpatterns += staticfiles_urlpatterns()

# A service unreachable in a middleware (outside any view) is a 503 too (rftweb/degrade.py).
handler500 = "rftweb.degrade.server_error"
