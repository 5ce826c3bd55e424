from django.contrib import admin

from apps.envapi.models import ApiKey


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "prefix", "actions", "rate_limit_per_minute", "created_by", "created_at", "revoked_at")
    readonly_fields = ("prefix", "hashed")
