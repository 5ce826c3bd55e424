from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.forms import BaseFormSet, ModelForm
from django.http import HttpRequest

from apps.envapi.models import ApiKey
from apps.envapi.services import ACTIONS, KeyInvalid, api_key_create, api_key_revoke


class ApiKeyAddForm(forms.ModelForm):
    actions = forms.MultipleChoiceField(choices=[(a, a) for a in ACTIONS], widget=forms.CheckboxSelectMultiple)

    class Meta:
        model = ApiKey
        fields = ("name", "runs", "actions", "rate_limit_per_minute")


@admin.action(description="Revoke the selected keys now")
def revoke(modeladmin: admin.ModelAdmin[ApiKey], request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
    keys = list(queryset.filter(revoked_at__isnull=True))
    for key in keys:  # each one's open event streams end too
        api_key_revoke(key=key)
    modeladmin.message_user(request, f"Revoked {len(keys)} keys.")


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "prefix", "actions", "rate_limit_per_minute", "created_by", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    readonly_fields = ("prefix", "hashed", "created_by", "created_at", "last_used_at")
    filter_horizontal = ("runs",)
    actions = [revoke]

    def get_form(self, request: HttpRequest, obj: ApiKey | None = None, change: bool = False,
                 **kwargs: object) -> type[ModelForm[ApiKey]]:
        if obj is None:
            kwargs["form"] = ApiKeyAddForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> list[str] | tuple[str, ...]:
        return self.readonly_fields if obj is not None else ()

    def get_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> tuple[str, ...]:
        if obj is None:
            return ("name", "runs", "actions", "rate_limit_per_minute")
        return ("name", "prefix", "hashed", "runs", "actions", "rate_limit_per_minute", "created_by", "created_at",
                "last_used_at", "revoked_at")

    def save_model(self, request: HttpRequest, obj: ApiKey, form: ModelForm[ApiKey], change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        # Adding goes through the service: it makes the secret, stores its hash, shows it once.
        try:
            key, raw = api_key_create(
                name=form.cleaned_data["name"], runs=form.cleaned_data["runs"], actions=form.cleaned_data["actions"],
                rate_limit_per_minute=form.cleaned_data["rate_limit_per_minute"], created_by=request.user,
            )
        except KeyInvalid as exc:
            raise ValueError(str(exc)) from None
        obj.pk, obj.prefix, obj.hashed = key.pk, key.prefix, key.hashed
        messages.warning(request, f"The new key, shown only this once: {raw}")

    def save_related(self, request: HttpRequest, form: ModelForm[ApiKey], formsets: list[BaseFormSet[ModelForm[ApiKey]]],
                     change: bool) -> None:
        if change:
            super().save_related(request, form, formsets, change)
