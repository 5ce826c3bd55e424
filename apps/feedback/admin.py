from django.contrib import admin

from apps.feedback.models import Feedback


@admin.register(Feedback)
class FeedbackAdmin(admin.ModelAdmin):
    list_display = ("id", "run", "kind", "experience", "author", "api_key", "late", "created_at")
    list_filter = ("kind", "late")
    raw_id_fields = ("experience", "other")
