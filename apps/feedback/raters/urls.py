from django.urls import path

from apps.feedback.raters import views

app_name = "rewards"

# Mounted at runs/<int:run_id>/signal/ (rftweb/urls.py; the path keeps its old word: bookmarks).
urlpatterns = [
    path("raters/", views.raters_page, name="raters"),
    path("raters.json", views.raters_json, name="raters_json"),
    path("reward-model/", views.reward_model_panel, name="reward_model"),
    path("reward-model/v<int:version>/export/", views.reward_model_export, name="reward_model_export"),
    path("reward-model/v<int:version>/download/", views.reward_model_download, name="reward_model_download"),
    path("preferences.jsonl", views.preferences_export, name="preferences"),
]
