"""Record why each assignment was handed out (Assignment.source), and fill it in for the rows
already stored where the run's config says it for sure:

- a gold slot (1000 and up: only gold items take those) was a gold hand-out;
- a run whose config has no selection rule (every weight and the random share 0), no gold rate
  and no trust-aware hand-out handed everything out in arrival order;
- anything else stays "unknown": under a selection rule the row cannot tell the rule's pick
  from the random share's, so it is never counted as an unbiased sample.

Self-contained on purpose (the config read as stored, with its defaults of today): a migration
must not change meaning when the app code does.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

GOLD_SLOT_BASE = 1000


def _arrival_only(config: Any) -> bool:
    feedback = (config or {}).get("feedback") or {}
    selection = feedback.get("selection") or {}
    trust = feedback.get("trust") or {}
    if any(float(selection.get(k) or 0) for k in ("uncertainty", "disagreement", "variance", "random_share")):
        return False
    if float(feedback.get("gold_rate") or 0):
        return False
    weighting = feedback.get("rater_weighting", "off")
    trust_on = bool(trust.get("gold_first") or float(trust.get("untrusted_share", 1.0)) < 1)
    return not (weighting != "off" and trust_on)


def sources_fill(apps: Any, schema_editor: Any) -> None:
    Assignment = apps.get_model("feedback", "Assignment")
    Run = apps.get_model("runs", "Run")
    Assignment.objects.filter(slot__gte=GOLD_SLOT_BASE).update(source="gold")
    arrival = [pk for pk, config in Run.objects.values_list("pk", "config").iterator() if _arrival_only(config)]
    for start in range(0, len(arrival), 500):
        Assignment.objects.filter(run_id__in=arrival[start:start + 500], source="unknown").update(source="arrival")


class Migration(migrations.Migration):

    dependencies = [
        ("feedback", "0003_one_value_shape"),
        ("runs", "0002_weight_load"),
    ]

    operations = [
        migrations.AddField(
            model_name="assignment",
            name="source",
            field=models.CharField(choices=[("rule", "Rule"), ("random", "Random"), ("gold", "Gold"),
                                            ("arrival", "Arrival"), ("unknown", "Unknown")],
                                   default="unknown", max_length=8),
        ),
        migrations.RunPython(sources_fill, migrations.RunPython.noop),
    ]
