from django.contrib import admin

from apps.feedback.models import Assignment, Feedback


@admin.register(Feedback)
class FeedbackAdmin(admin.ModelAdmin):
    list_display = ("id", "run", "kind", "experience", "author", "api_key", "late", "created_at")
    list_filter = ("kind", "late")
    raw_id_fields = ("experience", "other")


@admin.register(Assignment)
class AssignmentAdmin(admin.ModelAdmin):
    list_display = ("id", "run", "experience", "annotator", "slot", "status", "lease_expires_at", "finished_at")
    list_filter = ("status",)
    raw_id_fields = ("experience",)
