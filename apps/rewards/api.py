"""The human-signal figures over the REST API (keys with `read`): the same rater figures
and agreement as the Raters page, and the run's reward-model versions."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router, Schema

from apps.envapi.schemas import RunId, responses

router = Router(tags=["human signal"])


class AgreementOut(Schema):
    rating_alpha_ordinal: float | None
    rating_alpha_interval: float | None
    thumb_alpha_nominal: float | None
    rated_items: int
    raters: int
    pairwise_agreement: float | None
    pairwise_rater_pairs: int


class RaterOut(Schema):
    rater: str
    labels: int
    kinds: dict[str, int]
    agreement: float | None
    agreement_items: int
    gold_accuracy: float | None
    gold_items: int
    seconds_per_item: float | None
    scale_offset: float | None
    weight: float
    # The weight of the rater's pairs in the reward model: trust earned by measurement.
    earned_weight: float
    # What the annotation queue hands them (feedback.trust): unmeasured, trusted, untrusted;
    # None without rater weighting.
    standing: str | None


class RatersOut(Schema):
    weighting: str
    gold_rate: float
    # feedback.trust: gold_first, untrusted_share.
    trust: dict[str, float]
    agreement: AgreementOut
    raters: list[RaterOut]


class RewardModelOut(Schema):
    version: int
    accuracy: float | None
    # The unbiased estimate: accuracy on the held-out pairs only the random share or arrival
    # order handed out (None: none such; pairs_random None: a version from before it was measured).
    accuracy_random: float | None
    pairs_random: int | None
    pairs_train: int
    pairs_heldout: int
    labels: int
    path: str
    created_at: Any


def _run(request: HttpRequest, run_id: int) -> Any:
    from apps.envapi.api import _run_for

    return _run_for(request, run_id)


@router.get("/runs/{run_id}/raters", response=responses(RatersOut), summary="Rater agreement, reliability and weights")
def raters_get(request: HttpRequest, run_id: int = RunId) -> dict[str, Any]:
    from apps.rewards.views import raters_data

    return raters_data(run=_run(request, run_id))


@router.get("/runs/{run_id}/reward-models", response=responses(list[RewardModelOut]),
            summary="The run's learned reward-model versions, newest first")
def reward_models_list(request: HttpRequest, run_id: int = RunId) -> list[Any]:
    from apps.rewards.models import RewardModel

    return list(RewardModel.objects.filter(run=_run(request, run_id)).order_by("-version"))


class K12GraderOut(Schema):
    version: int
    accuracy: float | None
    pairs_train: int
    pairs_heldout: int
    grades: int
    path: str
    created_at: Any


@router.get("/runs/{run_id}/k12-graders", response=responses(list[K12GraderOut]),
            summary="The run's learned K-12 grader versions, newest first")
def k12_graders_list(request: HttpRequest, run_id: int = RunId) -> list[Any]:
    from apps.rewards.models import K12Grader

    return list(K12Grader.objects.filter(run=_run(request, run_id)).order_by("-version"))
