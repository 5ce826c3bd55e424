from django.contrib import admin

from apps.runs.models import AuditEntry, Metric, ModelVersion, Run, RunMember, WorkerHeartbeat


class RunMemberInline(admin.TabularInline):
    model = RunMember
    extra = 0


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "owner", "status", "current_version", "train_step", "created_at")
    list_filter = ("status",)
    search_fields = ("name",)
    inlines = [RunMemberInline]


@admin.register(ModelVersion)
class ModelVersionAdmin(admin.ModelAdmin):
    list_display = ("run", "number", "checkpoint", "train_step", "created_at")
    list_filter = ("run",)


@admin.register(Metric)
class MetricAdmin(admin.ModelAdmin):
    list_display = ("run", "step", "name", "value", "time")
    list_filter = ("name",)


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    list_display = ("run", "action", "actor", "created_at")


admin.site.register(RunMember)


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(admin.ModelAdmin):
    list_display = ("hostname", "queues", "pool", "concurrency", "last_seen", "stopped_at")
