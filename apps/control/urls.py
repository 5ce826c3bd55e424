from django.urls import path

from apps.buffer import views as buffer_views
from apps.control import accounts, bulk_views, views

app_name = "runs"

urlpatterns = [
    path("", views.run_list, name="list"),
    path("new/", views.run_new, name="new"),
    path("workers/", views.worker_health, name="workers"),
    path("<int:run_id>/", views.run_detail, name="detail"),
    path("<int:run_id>/metrics/", views.run_metrics, name="metrics"),
    path("<int:run_id>/diff/", views.run_config_diff, name="diff"),
    path("<int:run_id>/diff/<int:other_id>/", views.run_config_diff, name="diff_with"),
    path("<int:run_id>/summary/", views.run_summary_view, name="summary"),
    path("<int:run_id>/twin/", views.run_twin, name="twin"),
    path("<int:run_id>/versions/", views.run_versions, name="versions"),
    path("<int:run_id>/headline/", views.run_headline_view, name="headline"),
    path("<int:run_id>/weights/<int:version>/", views.run_weights_prepare, name="weights_prepare"),
    path("<int:run_id>/weights/<int:version>.zip", views.run_weights_download, name="weights_download"),
    path("<int:run_id>/controls/", views.run_controls, name="controls"),
    path("<int:run_id>/control/<str:action>/", views.run_control, name="control"),
    path("<int:run_id>/feedback-settings/", views.run_feedback_settings, name="feedback_settings"),
    # The old path (bookmarks, forms open in old tabs) answers 308: a POST stays a POST.
    path("<int:run_id>/feedback-policy/", views.run_feedback_settings_moved, name="feedback_settings_moved"),
    path("<int:run_id>/timeline/", views.run_timeline, name="timeline"),
    path("<int:run_id>/audit/", views.run_audit_log, name="audit"),
    path("<int:run_id>/failures/", views.run_failures, name="failures"),
    path("<int:run_id>/waiting/", views.run_waiting_view, name="waiting"),
    path("<int:run_id>/labelling/", views.run_labelling, name="labelling"),
    path("<int:run_id>/labels/", views.run_ledger_view, name="ledger"),
    path("<int:run_id>/taskset-import/", views.run_taskset_import, name="taskset_import"),
    path("<int:run_id>/members/", views.run_members, name="members"),
    path("<int:run_id>/members/<int:member_id>/remove/", views.run_member_delete, name="member_remove"),
    path("<int:run_id>/invitations/", accounts.run_invitations, name="invitations"),
    path("<int:run_id>/invitations/<int:invitation_id>/revoke/", accounts.run_invitation_revoke,
         name="invitation_revoke"),
    path("<int:run_id>/experiences/", views.experience_list, name="experiences"),
    path("<int:run_id>/experiences/bulk/", bulk_views.experience_bulk, name="experiences_bulk"),
    path("<int:run_id>/groups/<str:group_id>/", views.experience_group, name="group"),
    path("<int:run_id>/export/", views.export_page, name="export"),
    path("<int:run_id>/export/<str:export_format>.jsonl", views.export_download, name="export_download"),
    path("<int:run_id>/images/<str:sha256>/", buffer_views.task_image, name="image"),
]
