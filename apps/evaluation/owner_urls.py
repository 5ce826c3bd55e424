from django.urls import path

from apps.evaluation import owner_views

app_name = "evaluation_owner"

urlpatterns = [
    path("", owner_views.evaluation_create_view, name="create"),
    path("<int:evaluation_id>/close/", owner_views.evaluation_close_view, name="close"),
    path("<int:evaluation_id>/votes.jsonl", owner_views.evaluation_export_view, name="export"),
]
