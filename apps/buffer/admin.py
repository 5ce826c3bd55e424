from django.contrib import admin

from apps.buffer.models import Experience, Task, TaskAttempt, Taskset


@admin.register(Taskset)
class TasksetAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "owner", "source", "created_at")


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = ("id", "taskset", "index", "domain", "is_synthetic", "filter_reason")
    list_filter = ("domain", "is_synthetic")
    search_fields = ("prompt",)


@admin.register(TaskAttempt)
class TaskAttemptAdmin(admin.ModelAdmin):
    list_display = ("id", "run", "task", "epoch", "status", "lease_owner", "lease_expires_at", "tries")
    list_filter = ("status",)


@admin.register(Experience)
class ExperienceAdmin(admin.ModelAdmin):
    list_display = ("id", "run", "group_id", "status", "reward", "model_version", "is_expert", "use_count", "created_at")
    list_filter = ("status", "is_expert", "source")
    search_fields = ("key", "group_id")
    raw_id_fields = ("task", "parent")
