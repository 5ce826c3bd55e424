from django.urls import path

from apps.buffer import views as buffer_views
from apps.control import views

app_name = "runs"

urlpatterns = [
    path("", views.run_list, name="list"),
    path("new/", views.run_new, name="new"),
    path("workers/", views.worker_health, name="workers"),
    path("<int:run_id>/", views.run_detail, name="detail"),
    path("<int:run_id>/metrics/", views.run_metrics, name="metrics"),
    path("<int:run_id>/controls/", views.run_controls, name="controls"),
    path("<int:run_id>/control/<str:action>/", views.run_control, name="control"),
    path("<int:run_id>/feedback-policy/", views.run_feedback_policy, name="feedback_policy"),
    path("<int:run_id>/timeline/", views.run_timeline, name="timeline"),
    path("<int:run_id>/audit/", views.run_audit_log, name="audit"),
    path("<int:run_id>/failures/", views.run_failures, name="failures"),
    path("<int:run_id>/waiting/", views.run_waiting_view, name="waiting"),
    path("<int:run_id>/members/", views.run_members, name="members"),
    path("<int:run_id>/members/<int:member_id>/remove/", views.run_member_delete, name="member_remove"),
    path("<int:run_id>/experiences/", views.experience_list, name="experiences"),
    path("<int:run_id>/groups/<str:group_id>/", views.experience_group, name="group"),
    path("<int:run_id>/export/", views.export_page, name="export"),
    path("<int:run_id>/export/<str:kind>.jsonl", views.export_download, name="export_download"),
    path("<int:run_id>/images/<str:sha256>/", buffer_views.task_image, name="image"),
]
