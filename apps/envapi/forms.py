from __future__ import annotations

from django import forms

from apps.envapi.models import ApiKey


class ApiKeyForm(forms.Form):
    name = forms.CharField(max_length=200, help_text="who or what uses it, e.g. 'guessing-game env'")
    actions = forms.MultipleChoiceField(
        choices=[(a, a) for a in ApiKey.ACTIONS], widget=forms.CheckboxSelectMultiple, initial=["read", "submit"],
        help_text="read: runs and events; submit: tasks, rollouts, trajectories; feedback: rewards and ratings",
    )
    rate_limit_per_minute = forms.IntegerField(min_value=1, max_value=1_000_000, initial=600)
