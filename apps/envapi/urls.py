from django.urls import path

from apps.envapi import views

app_name = "envapi"

urlpatterns = [
    path("runs/<int:run_id>/keys/", views.run_keys, name="run-keys"),
    path("runs/<int:run_id>/keys/<int:key_id>/revoke/", views.run_key_revoke, name="run-key-revoke"),
]
