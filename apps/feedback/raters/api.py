"""The raters figures over the REST API (keys with `read`): the same rater figures
and agreement as the Raters page, the run's reward-model versions, and a version as a
download (the zip the run page offers: apps/rewards/rm_download.py)."""

from __future__ import annotations

from datetime import datetime

from django.http import FileResponse, HttpRequest
from ninja import Router, Schema, Status
from ninja.params.functions import Path

from apps.feedback.raters.figures import RatersData, raters_data
from apps.rewards.rm_download import (
    ExportState,
    download_name,
    export_states,
    export_zip_path,
    reward_model_export_request,
    reward_model_version_get,
)
from apps.rewards.models import K12Grader, RewardModel
from apps.runs.api_kit import ERRORS, Error, RunId, responses, run_reachable
from kernel.exceptions import Conflict
from kernel.jsontypes import Body

# The operation ids are the ones this router had as apps/rewards/api.py (generated clients
# name their methods by them).
router = Router(tags=["raters"])


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
    created_at: datetime


@router.get("/runs/{run_id}/raters", response=responses(RatersOut), operation_id="apps_rewards_api_raters_get", summary="Rater agreement, reliability and weights")
def raters_get(request: HttpRequest, run_id: int = RunId) -> RatersData:
    return raters_data(run=run_reachable(request, run_id))


@router.get("/runs/{run_id}/reward-models", response=responses(list[RewardModelOut]),
            operation_id="apps_rewards_api_reward_models_list", summary="The run's learned reward-model versions, newest first")
def reward_models_list(request: HttpRequest, run_id: int = RunId) -> list[RewardModel]:
    return list(RewardModel.objects.filter(run=run_reachable(request, run_id)).order_by("-version"))


Version: int = Path(..., ge=1, le=2**31 - 1, description="the reward model's version")


class ExportOut(Schema):
    version: int
    # ready: the zip is there (`download`); preparing: a reward worker is packing it;
    # failed: the last try failed (`error`; POST again); none: nobody asked yet.
    state: str
    # While preparing: queued (no reward worker has started on it yet), packing, or stalled
    # (queued longer than a free worker needs: is one running? POST again); else empty.
    stage: str
    bytes: int
    error: str
    download: str | None


def _export_out(run_id: int, version: int, state: ExportState) -> Body:
    name = "ready" if state.ready else "preparing" if state.preparing else "failed" if state.error else "none"
    return {"version": version, "state": name, "stage": state.stage, "bytes": state.size, "error": state.error,
            "download": f"/api/v1/runs/{run_id}/reward-models/{version}/export.zip" if state.ready else None}


@router.post("/runs/{run_id}/reward-models/{version}/export", response={**responses(ExportOut), 202: ExportOut},
             operation_id="apps_rewards_api_reward_model_export_post", summary="Pack a reward-model version as a zip AutoModelForSequenceClassification loads (202 while a worker packs it)")
def reward_model_export_post(request: HttpRequest, run_id: int = RunId, version: int = Version) -> Status[Body]:
    state = reward_model_export_request(run=run_reachable(request, run_id), version=version)
    return Status(200 if state.ready else 202, _export_out(run_id, version, state))


@router.get("/runs/{run_id}/reward-models/{version}/export", response=responses(ExportOut),
            operation_id="apps_rewards_api_reward_model_export_get", summary="Where a reward-model version's zip stands")
def reward_model_export_get(request: HttpRequest, run_id: int = RunId, version: int = Version) -> Body:
    rm = reward_model_version_get(run=run_reachable(request, run_id), version=version)
    return _export_out(run_id, version, export_states([rm])[rm.version])


@router.get("/runs/{run_id}/reward-models/{version}/export.zip", response={**ERRORS, 409: Error},
            operation_id="apps_rewards_api_reward_model_export_zip", summary="A packed reward-model version (POST …/export first)")
def reward_model_export_zip(request: HttpRequest, run_id: int = RunId, version: int = Version) -> FileResponse:
    rm = reward_model_version_get(run=run_reachable(request, run_id), version=version)
    path = export_zip_path(rm)
    if not path.is_file():
        raise Conflict(f"reward model v{version} is not packed yet: POST /api/v1/runs/{run_id}/reward-models/"
                       f"{version}/export and wait until its state is ready")
    return FileResponse(path.open("rb"), as_attachment=True, filename=download_name(rm), content_type="application/zip")


class K12GraderOut(Schema):
    version: int
    accuracy: float | None
    pairs_train: int
    pairs_heldout: int
    grades: int
    path: str
    created_at: datetime


@router.get("/runs/{run_id}/k12-graders", response=responses(list[K12GraderOut]),
            operation_id="apps_rewards_api_k12_graders_list", summary="The run's learned K-12 grader versions, newest first")
def k12_graders_list(request: HttpRequest, run_id: int = RunId) -> list[K12Grader]:
    return list(K12Grader.objects.filter(run=run_reachable(request, run_id)).order_by("-version"))
