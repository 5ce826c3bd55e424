from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from apps.buffer.models import Experience
from apps.rewards.k12_rules import DOMAIN as K12
from apps.rewards.models import K12Grader
from apps.rewards.scoring import rewards_for_domain
from apps.runs.models import ModelVersion, Run
from kernel.plugin_names import domains


def experiences_awaiting_rewards(*, run: Run, ids: Sequence[int]) -> list[Experience]:
    """Those of `ids` in `run` whose metadata still lists remote rewards to wait for."""
    rows = Experience.objects.filter(run=run, pk__in=list(ids)).select_related("task").order_by("pk")
    return [e for e in rows if (e.metadata or {}).get("awaiting_rewards")]


def run_current_model(*, run: Run) -> str:
    """The checkpoint of the run's current version; version 0 is the config's model."""
    version = ModelVersion.objects.filter(run=run, number=run.current_version).first()
    return version.checkpoint if version is not None else run.cfg.model


class RewardsSummary(TypedDict):
    routes: list[dict[str, object]]  # {"domain", "terms": [{"key", "weight", "params"}]}
    explicit: bool
    learned: bool
    graders: list[K12Grader]


def rewards_summary(*, run: Run) -> RewardsSummary:
    """What the run page shows of its reward spec: per domain the terms that score it (key,
    weight, params), and the learned K-12 grader's versions when the spec uses it."""

    terms = run.cfg.rewards
    routes: list[dict[str, object]] = [{"domain": domain, "terms": [{"key": key, "weight": t.weight, "params": t.params}
                                           for key, t in rewards_for_domain(terms=terms, domain=domain)]}
              for domain in domains()]
    learned = any(t.name == "k12_learned" for _, t in rewards_for_domain(terms=terms, domain=K12))
    graders = list(K12Grader.objects.filter(run=run).order_by("-version")[:10]) if learned else []
    return {"routes": routes, "explicit": bool(terms), "learned": learned, "graders": graders}
