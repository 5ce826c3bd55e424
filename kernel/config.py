"""The run config: one schema that validates configs everywhere (form, API, file).

Errors name the bad field by its dotted path (`sampling.temperature`), so a form can show
them beside the field and the CLI can print them as they are.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from enum import StrEnum
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from kernel.hygiene import InputRejected, config_text_parse, tree_check
from kernel import vocabulary
from kernel.algorithms import (
    LEGACY_TRAINER_KEYS,
    AlgorithmParams,
    algorithm_get,
    algorithm_names,
    algorithm_params_parse,
    algorithms,
    trainer_legacy_upgrade,
)
from kernel.eval_series import best_by_check
from kernel.plain_errors import error_plain
from kernel.preferences import preference_names
from kernel.reward_kinds import DEFAULT_REWARD_KIND, reward_kind_get, reward_kind_names, reward_kinds
from kernel.exceptions import InvalidInput
from kernel.strict import StrictModel
from kernel.jsontypes import JSON, JSONObject


class Mode(StrEnum):
    SYNC = "sync"
    ASYNC = "async"
    EXPLORE = "explore"
    TRAIN = "train"


def _known(name: str, known: Collection[str], *, what: str) -> str:
    """`name` when it is one of the registered `known` names; else a ValueError listing them."""
    if name not in known:
        raise ValueError(f"unknown {what} {name!r}; known: {', '.join(sorted(known))}")
    return name


class FieldConflict(InvalidInput, ValueError):
    """A model validator's error about one field (its dotted path from the model's root), so
    that forms and the API report it beside that field rather than the whole config. A
    ValueError too: pydantic turns only those into its validation errors."""

    code = "field_conflict"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, field=field)
        # pydantic's message is str(error): the message alone, the field goes beside it.
        self.args = (message,)


def line_ends_normalise(text: str) -> str:
    """`text` with its line endings as \n (\r\n and lone \r, as browsers and old editors send)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


class SamplingConfig(StrictModel):
    temperature: float = Field(1.0, ge=0.0, le=5.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    max_tokens: int = Field(64, ge=1, le=65536)
    stop: list[str] = Field(default_factory=list)
    seed: int | None = None


class RewardTerm(StrictModel):
    name: str = Field(min_length=1)
    weight: float = 1.0
    params: dict[str, object] = Field(default_factory=dict)
    # Apply only to tasks of these domains; empty means every domain.
    domains: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _known_reward(cls, name: str) -> str:
        return _known(name, vocabulary.reward_names(), what="reward")

    @field_validator("domains")
    @classmethod
    def _known_domains(cls, domains: list[str]) -> list[str]:
        for domain in domains:
            if domain not in vocabulary.domains():
                raise ValueError(f"unknown domain {domain!r}; known: {', '.join(vocabulary.domains())}")
        return domains

    @model_validator(mode="after")
    def _params_fit(self) -> RewardTerm:
        # Each reward checks its own params (a regex that compiles, a model path), so a bad
        # term fails run validation instead of every explore step.
        vocabulary.reward_params_check(self.name, self.params)
        return self


class SelectionRule(StrictModel):
    """How the annotation queue is ordered (apps/feedback/handout/rule.py). Each weight scales
    one source of a candidate's priority, each on [0, 1]; all zero keeps arrival order.
    `random_share` of the items handed out are drawn uniformly at random instead, so some
    labels stay an unbiased sample (held-out evaluation of the reward model). With `pairs`,
    items go out two siblings at a time and the share counts pairs.

    Active by default (since 2026-11-28, issue 62): the reward model's least sure sibling pairs
    (`uncertainty` 1) and a fifth of the pairs at random (`random_share` 0.2), the selection
    every steering figure was measured with (bench/steering, bench/README.md). Before, a run
    got arrival order. Without a reward model (blend, human, or before its first version) the
    rule has no scores to rank by and the non-random hand-outs go in arrival order."""

    # The figures: on bench/steering's generated family (8 preferences x 4 seeds, 30 steps) rm10
    # under this rule gained +0.124 on the median in the preferred share where random10 gained
    # +0.008; on three pairs of that family (g5 mixed, g6, g7; seed 0, 30 steps) rm10 with
    # this rule against the same arm in arrival order: bench/README.md, "Active selection as
    # the default".
    uncertainty: float = Field(1.0, ge=0.0, description="the reward model's small margin to the nearest sibling")
    disagreement: float = Field(0.0, ge=0.0, description="reward model vs automatic reward (rank within the group)")
    variance: float = Field(0.0, ge=0.0, description="spread of the group's automatic rewards")
    # An unbiased share of the hand-outs: the reward model's accuracy on it
    # (RewardModel.accuracy_random) is the one its rule-chosen pairs cannot give.
    random_share: float = Field(0.2, ge=0.0, le=1.0)
    # Hand items out as sibling pairs (two members of one group, both to one annotator): a
    # rating becomes a reward-model preference pair only beside a differently rated sibling
    # that a trusted rater rated, so single picks spread over groups mostly teach it nothing.
    pairs: bool = Field(True, description="hand out labels as pairs of siblings (one group, one annotator)")


class TrustHandout(StrictModel):
    """How the annotation queue hands items out by each annotator's measured trust (the
    reward-model trust of apps/feedback/raters/reliability.py, earned on gold items or agreement):
    a rater answering at random should cost the run little of its label budget, and a new
    rater should be measured within their first items. Needs `rater_weighting`."""

    # An annotator not yet measured on this many gold items gets gold items only, up to this
    # many, before any fresh item: trust is then known after their first few labels instead
    # of after gold_rate spreads a few gold items over dozens (needs rater_weighting gold).
    gold_first: int = Field(0, ge=0, le=100, description="gold items a new annotator rates first, before fresh items")
    # Share of the fresh items a trusted annotator would get that an untrusted one (measured,
    # trust below the reward model's bar) still gets; the rest stay for trusted annotators.
    # Their unrated gold items come first either way, so they can earn trust back. 0: gold only.
    untrusted_share: float = Field(1.0, ge=0.0, le=1.0,
                                   description="share of fresh items an untrusted annotator still gets (0: gold only)")


class FeedbackSettings(StrictModel):
    # learned: automatic reward + the run's reward model where no person rated (see
    # kernel/fold.py); needs reward_model.enabled.
    mode: Literal["auto", "blend", "human", "learned"] = "auto"
    w_auto: float = Field(0.5, ge=0.0)
    w_human: float = Field(0.5, ge=0.0)
    # learned: the reward model's weight beside w_auto where no person rated.
    w_rm: float = Field(1.0, ge=0.0)
    # learned falls back as blend until a reward model's held-out pairwise accuracy is at least
    # this, with `rm_accuracy_confidence` confidence: the one-sided Wilson lower bound of the
    # accuracy on its held-out pairs must reach it (apps.feedback.reward_model.versions.accuracy_lower_bound).
    # An accuracy on a handful of pairs is noise, and a chance-level reward model folded into
    # rewards steers the run at random; a bound asks a perfect model for few pairs (9 at 0.75,
    # 95%) and a mediocre one for many, where a fixed pair count holds both back alike.
    min_rm_accuracy: float = Field(0.7, ge=0.0, le=1.0)
    # 0.5: the point estimate alone (no bound).
    rm_accuracy_confidence: float = Field(0.95, ge=0.5, lt=1.0)
    # ... and on at least this many held-out pairs (a floor beside the bound; 0: the bound alone).
    min_rm_heldout_pairs: int = Field(0, ge=0)
    # How the reward model enters. `bound`: all at once, when the bound reaches min_rm_accuracy
    # (until then not at all). `evidence`: as soon as the bound is above chance (0.5), its
    # calibrated score drawn toward the scale's middle by what the bound has not yet shown:
    # weight (bound - 0.5) / (min_rm_accuracy - 0.5), full from min_rm_accuracy on, where `bound`
    # would open (apps.feedback.reward_model.versions.reward_model_weight). A model that ranks pairs well on
    # few pairs steers a little from the first steps instead of not at all for half the run.
    # `calibrated`: as soon as the bound is above chance, at full weight: the calibration
    # (fitted on out-of-fold scores) already draws a weak or noisy model's scores toward
    # people's mean, and the raters' own noise caps the accuracy a bound reads, so a second
    # discount by that accuracy holds back a model that people's ratings cannot show better.
    # The default since 2026-11-27: on bench/steering's generated family (8 preferences x 4
    # seeds, 29 pairs with a ceiling) rm10/all read median 0.88 / 25th percentile 0.60 under
    # `calibrated`, 0.73 / 0.47 under `evidence` (`bound`: 0.52 / 0.29 on an earlier reading of 3
    # pairs at 15 steps; bench/README.md).
    rm_gate: Literal["bound", "evidence", "calibrated"] = Field(
        "calibrated", description="how the reward model enters: bound (all at once when min_rm_accuracy is shown), "
                             "evidence (from better than chance, weighted by how far its accuracy is shown) or "
                             "calibrated (from better than chance, as its calibration scales it)")
    # How each rater's votes count in the fold: equal (off), by accuracy on gold items, or by
    # agreement with the other raters' consensus (apps/feedback/raters/reliability.py).
    rater_weighting: Literal["off", "gold", "agreement"] = "off"
    # Subtract each rater's scale offset (how far their ratings sit above the others' on
    # shared items) before folding, so a harsh or a generous rater counts like the rest.
    normalise_raters: bool = False
    # Share of an annotator's hand-outs that are gold items (known answers), unannounced.
    gold_rate: float = Field(0.0, ge=0.0, le=0.5)
    selection: SelectionRule = Field(default_factory=SelectionRule)
    trust: TrustHandout = Field(default_factory=TrustHandout)
    # How long a group waits for human rewards before the fallback applies. Under `learned`,
    # until the reward model passes its gate, the most a group waits: one nobody holds waits
    # `hold_seconds`, a held one while the hold lasts (apps.feedback.handout.expiry.wait_window).
    wait_seconds: float = Field(600.0, ge=0.0)
    fallback: Literal["auto", "drop"] = "auto"
    # A group a person has open (an item of it on top of their queue: the first two open ones,
    # apps.feedback.handout.holds.HOLDS_PER_PERSON) waits for them rather than
    # training under their hands: the trainer's claim skips it for `hold_seconds` after their
    # last sign of work (opening or polling the page, a label), and never longer than
    # `hold_cap_seconds` after the item was handed to them. 0: no holds. Not under `auto`
    # (labels move no reward there).
    hold_seconds: float = Field(45.0, ge=0.0, le=3600.0,
                                description="how long a group an annotator has open waits after their last activity")
    hold_cap_seconds: float = Field(180.0, ge=0.0, le=86400.0,
                                    description="the longest a group waits for an annotator who holds it")
    # How many annotators see each item.
    overlap: int = Field(1, ge=1, le=10)
    rank_rule: Literal["borda"] = "borda"
    # What raters see: guidelines (Markdown, rendered sanitised beside the items), whether
    # the automatic reward is shown (it biases people, so not by default), a daily target.
    guidelines: str = Field("", max_length=20000, json_schema_extra={"widget": "markdown"},
                            description="Markdown shown to raters beside the items")
    show_auto_reward: bool = Field(False, description="show raters the automatic reward (it biases them)")
    daily_target: int = Field(0, ge=0, description="items per rater per day shown as a target; 0: none")

    @field_validator("guidelines")
    @classmethod
    def _unix_line_ends(cls, value: str) -> str:
        # A browser posts a textarea's lines ending \r\n: a run copied through the form
        # stored them so, and its config diff listed the guidelines as changed.
        return line_ends_normalise(value)

    @model_validator(mode="after")
    def _weights(self) -> FeedbackSettings:
        if self.mode in ("blend", "learned") and self.w_auto + self.w_human <= 0:
            raise ValueError(f"{self.mode} needs w_auto + w_human > 0")
        # Trust is only measured under a weighting: without one every rater would stay
        # "unmeasured" and the hand-out settings would silently do nothing.
        if self.trust.gold_first and self.rater_weighting != "gold":
            raise FieldConflict("trust.gold_first",
                                "trust.gold_first needs rater_weighting gold (trust measured on gold items)")
        if self.trust.untrusted_share < 1 and self.rater_weighting == "off":
            raise FieldConflict("trust.untrusted_share",
                                "trust.untrusted_share needs rater_weighting gold or agreement (trust is not measured)")
        return self


# The folds of a kind that declares `crossval` when a config does not say.
DEFAULT_CROSSVAL_FOLDS = 4


class RewardModelConfig(StrictModel):
    """A reward model learned from the run's human feedback (workers/reward/trainer.py)."""

    enabled: bool = False
    # A registered reward-model kind (kernel.reward_kinds): head (the default: an ensemble
    # of scalar heads on the base's pooled hidden states), likelihood (the base's token
    # log-likelihoods weighed by a Bradley-Terry model), classifier (TRL's RewardTrainer), …
    kind: str = Field(DEFAULT_REWARD_KIND, json_schema_extra={"registry": "reward_kinds"})
    # "policy": the run's current checkpoint (with a fresh scalar head for `classifier`);
    # else a path or hub id (a separately trained "judge" model is a deployment's choice).
    base: str = Field("policy", min_length=1)
    # Train a new version when this many labels (feedback rows) arrived since the last one.
    retrain_every: int = Field(20, ge=1)
    # Kinds that declare `warm_start` (classifier): start each version from the previous
    # version's weights instead of the base.
    warm_start: bool = False
    heldout_share: float = Field(0.2, gt=0.0, lt=1.0)
    epochs: int = Field(4, ge=1, le=100)
    learning_rate: float = Field(2e-4, gt=0.0)
    batch_size: int = Field(16, ge=1)
    max_length: int = Field(256, ge=8)
    score_batch_size: int = Field(64, ge=1)
    # likelihood: the answer span is the last match of this regex (its first group when it
    # has one); empty: no span features.
    answer_pattern: str = Field(r"<answer>(.*?)</answer>", max_length=500)
    # head: how many heads the ensemble has, each on its own bootstrap sample of the pairs
    # (their spread is the selection rule's uncertainty; 1: one head on every pair).
    ensemble: int = Field(5, ge=1, le=32)
    # head, likelihood: L2 penalty of the Bradley-Terry weights.
    l2: float = Field(1e-2, ge=0.0)
    # Kinds that declare `crossval` (head, likelihood): measure held-out accuracy by k-fold
    # cross-validation over prompts (k >= 2) instead of the `heldout_share` split: every pair is
    # held out once (ranked by a fit that never saw its prompt), so the gate has k / 1 x (at
    # 0.25, 4x) the evidence; the published version fits every pair. 0: the split.
    # Unset: 4 for those kinds, 0 for the others (bench/steering, three style raters, three
    # seeds: with 4 folds the head model was usable from step 3 instead of step 6-15 or never,
    # and rm10 reached 0.73-0.83x of `all`'s gain instead of 0.02-0.81x).
    crossval_folds: int = Field(0, ge=0, le=20)

    @model_validator(mode="before")
    @classmethod
    def _crossval_by_kind(cls, data: object) -> object:
        if isinstance(data, dict) and "crossval_folds" not in data:
            kind = data.get("kind", cls.model_fields["kind"].default)
            if isinstance(kind, str) and kind in reward_kind_names() and reward_kind_get(kind).crossval:
                data = {**data, "crossval_folds": DEFAULT_CROSSVAL_FOLDS}
        return data

    @field_validator("crossval_folds")
    @classmethod
    def _folds_are_two_or_more(cls, value: int) -> int:
        if value == 1:
            raise ValueError("0 (the held-out share) or at least 2 folds")
        return value

    @field_validator("kind")
    @classmethod
    def _registered_kind(cls, name: str) -> str:
        if name not in reward_kind_names():
            raise ValueError(f"must be one of the registered reward-model kinds: {', '.join(reward_kind_names())}")
        return name

    @model_validator(mode="after")
    def _crossval_is_the_declaring_kinds(self) -> RewardModelConfig:
        # A kind without folds (its held-out split is the prompt split) would silently
        # ignore the setting: it is refused.
        if self.crossval_folds and self.kind in reward_kind_names() and not reward_kind_get(self.kind).crossval:
            able = ", ".join(repr(k.name) for k in reward_kinds() if k.crossval)
            raise ValueError(f"reward_model.crossval_folds applies to the kinds {able} only")
        return self

    @field_validator("answer_pattern")
    @classmethod
    def _pattern_compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from exc
        return value


class ReplayConfig(StrictModel):
    # 1 means every experience is trained on once.
    max_uses: int = Field(1, ge=1)
    cooldown_seconds: float = Field(0.0, ge=0.0)
    priority_decay: float = Field(1.0, gt=0.0, le=1.0)


class AdapterConfig(StrictModel):
    """A LoRA adapter (peft): only these weights train; the base stays frozen and is the
    KL reference with the adapter switched off."""

    rank: int = Field(8, ge=1, le=512)
    alpha: float = Field(16.0, gt=0.0)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    # Module names as the model calls them (Qwen2/Llama: q_proj … down_proj). The output head
    # and embeddings are not allowed: vLLM cannot serve adapters on them.
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1,
    )

    @field_validator("target_modules")
    @classmethod
    def _servable(cls, names: list[str]) -> list[str]:
        bad = [n for n in names if not n or not n.replace("_", "").replace(".", "").isalnum()]
        if bad:
            raise ValueError(f"not a module name: {bad[0]!r}")
        heads = [n for n in names if n.split(".")[-1] in ("lm_head", "embed_tokens")]
        if heads:
            raise ValueError(f"{heads[0]!r} cannot carry an adapter here (vLLM serves adapters on linear layers only)")
        if len(set(names)) != len(names):
            raise ValueError("a module is named twice")
        return names


class AlgorithmConfig(StrictModel):
    """The trainer's settings: those every algorithm shares, and `params`, the run's
    algorithm's own (its declaration's params model: kernel/algorithms/<name>.py)."""

    learning_rate: float = Field(1e-5, gt=0.0)
    max_grad_norm: float = Field(1.0, gt=0.0)
    # The run's algorithm's settings (GRPO's loss_type, beta, epsilon, …; DPO's beta; MIX's
    # mu, expert_share and GRPO's), validated by `RunConfig` against its `algorithm`.
    params: SerializeAsAny[AlgorithmParams] = Field(
        default_factory=AlgorithmParams, json_schema_extra={"per_algorithm": True},
        description="the algorithm's own settings (YAML), e.g. loss_type: dapo for GRPO; blank: its defaults")
    # Train a LoRA adapter instead of every weight (None: full fine-tuning).
    lora: AdapterConfig | None = None
    # Mixed precision of the forward and backward passes (weights and optimizer state stay
    # float32, except a LoRA base, which is frozen and held in this precision). A trainer
    # whose device lacks it fails the run with a message saying so.
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    # Recompute activations in the backward pass: less memory, about a third more compute.
    gradient_checkpointing: bool = False
    # Learner processes (ranks) in all, over `hosts` hosts: PyTorch's FSDP2 across them (gloo
    # on CPU, NCCL with one GPU per process). Each takes part of every batch; rank 0 (the
    # train worker's own process) claims, journals, commits and publishes whole versions.
    processes: int = Field(1, ge=1, le=64)
    hosts: int = Field(1, ge=1, le=16)
    # How the learner group splits the model: full (parameters, gradients and optimizer
    # state sharded; FSDP2, ZeRO-3-like), grad_op (gradients and optimizer state sharded,
    # parameters kept gathered from forward to backward; ZeRO-2-like), none (whole replicas,
    # PyTorch's DistributedDataParallel).
    sharding: Literal["full", "grad_op", "none"] = "full"
    # Seconds a learner group waits on one collective, and on its ranks' rendezvous, before
    # the step fails naming the rank and host that stopped answering (a host lost, a link
    # cut: nothing resets the connection, so without a bound the group would wait forever).
    # The step is sent again and runs once the group is whole again (workers/algorithms/
    # group.py). Longer than the slowest rank's share of a step lags behind the others.
    collective_timeout_s: float = Field(300.0, gt=0.0, le=86400.0)
    # AdamW with 8-bit state (bitsandbytes, CUDA only; refused with a message elsewhere).
    optimizer: Literal["adamw", "adamw_8bit"] = "adamw"


def learner_group_refusal(*, algorithm: str, params: AlgorithmParams) -> str | None:
    """Why a learner of these settings cannot run as a group of processes (None: it can):
    the algorithm's own declaration says (kernel.algorithms)."""
    return algorithm_get(algorithm).group_refusal(params)


def _trainer_params(raw: dict[str, object], algorithm: str) -> dict[str, object]:
    """`raw` (a trainer block) with its `params` validated as `algorithm`'s settings, an old
    flat block upgraded first (kernel.algorithms.trainer_legacy_upgrade). A bad setting
    is a FieldConflict naming `params.<its path>`."""
    raw = trainer_legacy_upgrade(algorithm, raw)
    params = raw.get("params")
    if isinstance(params, AlgorithmParams) and type(params) is not algorithm_get(algorithm).params:
        params = params.model_dump()  # another algorithm's instance: validated as a mapping
    if params is not None and not isinstance(params, (dict, AlgorithmParams)):
        raise FieldConflict("params", f"expected a mapping of {algorithm}'s settings")
    try:
        raw["params"] = algorithm_params_parse(algorithm, params)
    except ValidationError as exc:
        err = exc.errors()[0]
        path = ".".join(["params", *(str(p) for p in err["loc"])])
        msg = f"unknown key {str(err['loc'][-1])!r}" if err["type"] == "extra_forbidden" else error_plain(err)
        raise FieldConflict(path, msg) from None
    return raw


class PipelineStep(StrictModel):
    name: str = Field(min_length=1)
    # Validated even when left out: some operators have required params.
    params: dict[str, object] = Field(default_factory=dict, validate_default=True)

    @field_validator("name")
    @classmethod
    def _known_operator(cls, name: str) -> str:
        return _known(name, vocabulary.operator_names(), what="pipeline operator")

    @field_validator("params")
    @classmethod
    def _params_fit(cls, params: dict[str, object], info: ValidationInfo) -> dict[str, object]:
        name = info.data.get("name")
        if name is not None:  # an unknown name was already reported
            vocabulary.operator_params_check(name, params)
        return params


class PipelineConfig(StrictModel):
    """Data-pipeline operators per stage, applied in the order listed."""

    on_write: list[PipelineStep] = Field(default_factory=list)
    on_import: list[PipelineStep] = Field(default_factory=list)
    on_claim: list[PipelineStep] = Field(default_factory=list)

    @field_validator("on_write", "on_import", "on_claim")
    @classmethod
    def _runs_at_stage(cls, steps: list[PipelineStep], info: ValidationInfo) -> list[PipelineStep]:
        stage = str(info.field_name).removeprefix("on_")
        for i, step in enumerate(steps):
            try:
                vocabulary.operator_stage_check(step.name, stage)
            except ValueError as exc:
                raise ValueError(f"step {i}: {exc}") from None
        return steps


def _greedy() -> SamplingConfig:
    return SamplingConfig(temperature=0.0)


class EvalConfig(StrictModel):
    """Held-out evaluation every `eval_every` versions, on the `rollout` queue, scored by
    the run's inline reward terms; greedy unless `sampling` says otherwise."""

    # The id of the taskset to evaluate on (kept apart from the run's training taskset).
    taskset: int | None = Field(None, ge=1)
    sampling: SamplingConfig = Field(default_factory=_greedy)
    # Evaluate on the first max_tasks tasks of the taskset (in file order).
    max_tasks: int = Field(256, ge=1, le=100_000)
    # Samples per task: the reward mean is over all of them (greedy: keep 1).
    n: int = Field(1, ge=1, le=64)
    # Preferences of style (kernel/preferences.py) whose share of the evaluated answers is
    # recorded as eval/preference/<name>: what people teach, measured and never rewarded.
    preferences: list[str] = Field(default_factory=list, max_length=16)
    # The evaluation series that chooses the run's best version (the summary's, its weights
    # download's): accuracy, reward_mean, format_share or preference/<name> (one of
    # `preferences`, e.g. the share the guidelines teach). None: accuracy where the evaluated
    # domain has a verifier, else reward_mean (kernel/eval_series.py).
    best_by: str | None = Field(None, max_length=80, json_schema_extra={"registry": "eval_series"},
                                description="the evaluation series that chooses the best version; blank: accuracy "
                                            "where the domain has a verifier, else reward_mean")

    @model_validator(mode="after")
    def _best_by_known(self) -> EvalConfig:
        try:
            best_by_check(self.best_by, self.preferences)
        except ValueError as exc:
            raise FieldConflict("best_by", str(exc)) from None
        return self

    @field_validator("preferences")
    @classmethod
    def _registered_preferences(cls, names: list[str]) -> list[str]:
        known = preference_names()
        unknown = [name for name in names if name not in known]
        if unknown:
            raise ValueError(f"unknown preference {unknown[0]!r}; known: {', '.join(known)}")
        return list(dict.fromkeys(names))


class RolloutEngineConfig(StrictModel):
    """The rollout engine's resources (vLLM; the transformers engine reads `dtype` only)."""

    # auto: float32 on CPU (logprobs comparable with the trainer's), bfloat16 on GPUs.
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # Context length; None: the model's own, capped at 4096 on CPU hosts.
    max_model_len: int | None = Field(None, ge=16, le=1_048_576)
    # Share of each GPU's memory vLLM may take (weights + KV cache).
    memory_share: float = Field(0.5, gt=0.0, le=0.95)
    tensor_parallel_size: int = Field(1, ge=1, le=64)


class RunConfig(StrictModel):
    model: str = Field(min_length=1, description="hub id or local path of the starting model")
    tokenizer: str | None = None
    # A registered algorithm's name (kernel.algorithms): grpo, dpo, sft, mix, …
    algorithm: str = Field("grpo", json_schema_extra={"registry": "algorithms"})
    mode: Mode = Mode.SYNC
    engine: Literal["vllm", "transformers"] = "transformers"
    rollout: RolloutEngineConfig = Field(default_factory=RolloutEngineConfig)
    sync_interval: int = Field(1, ge=1)
    sync_offset: int = Field(0, ge=0)
    max_staleness: int = Field(0, ge=0)
    # The bound on every weight sync and handover of the run (a version's checkpoint written
    # or read, the in-memory handover's background write, an NCCL broadcast): past it the
    # sync raises workers.weights.sync.SyncFailed naming what and where, and the run page's weight-sync
    # timeline shows it, instead of the step hanging (issue 66). Generous: a 7B checkpoint on
    # slow shared storage takes minutes.
    sync_timeout_s: float = Field(600.0, gt=0.0, le=86400.0,
                                  description="seconds a weight sync or handover may take before it fails")
    repeat_times: int = Field(4, ge=1, le=256)
    explore_batch_size: int = Field(8, ge=1, description="tasks per explore step")
    train_batch_size: int = Field(32, ge=1, description="experiences per trainer step")
    total_steps: int = Field(100, ge=1)
    epochs: int = Field(1, ge=1)
    # Each epoch hands out the taskset in its own order, drawn from (seed, epoch) as TRL's
    # sampler shuffles: a taskset sorted by source or difficulty is not trained in blocks,
    # and the same seed gives the same order. Priorities (curriculum, replay) still lead.
    shuffle: bool = True
    # Evaluate every eval_every-th published version on `eval.taskset` (0: never).
    eval_every: int = Field(0, ge=0)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    rewards: list[RewardTerm] = Field(default_factory=list)
    feedback: FeedbackSettings = Field(default_factory=FeedbackSettings)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    # validate_default: the default block's params become the algorithm's (its defaults).
    trainer: AlgorithmConfig = Field(default_factory=AlgorithmConfig, validate_default=True)
    reward_model: RewardModelConfig = Field(default_factory=RewardModelConfig)
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)
    # Experiment trackers this run logs every metric to (one tracker run per rftweb run),
    # besides the deployment's RFT_TRACKERS.
    tracking: list[Literal["tensorboard", "mlflow", "wandb"]] = Field(default_factory=list)
    seed: int = 0

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        if algorithm_get(self.algorithm).group_relative and self.repeat_times < 2:
            relative = " and ".join(a.name for a in algorithms() if a.group_relative)
            raise FieldConflict("repeat_times",
                                f"repeat_times must be at least 2 for {relative} (advantages are group-relative)")
        if self.feedback.mode == "learned" and not self.reward_model.enabled:
            raise FieldConflict("feedback.mode", "feedback.mode learned needs reward_model.enabled")
        return self

    @field_validator("algorithm")
    @classmethod
    def _registered_algorithm(cls, name: str) -> str:
        if name not in algorithm_names():
            raise ValueError(f"must be one of the registered algorithms: {', '.join(algorithm_names())}")
        return name

    @field_validator("trainer", mode="before")
    @classmethod
    def _algorithm_params(cls, raw: object, info: ValidationInfo) -> object:
        # Per algorithm: `params` is the settings model the run's algorithm declares (before
        # the block's own validation, which takes any subclass of AlgorithmParams as it is).
        algorithm = info.data.get("algorithm")
        if isinstance(raw, AlgorithmConfig):
            raw = dict(raw)
        if not isinstance(raw, dict):
            return raw
        if algorithm is None:  # an unknown algorithm, reported already: nothing to check against
            return {k: v for k, v in raw.items() if k != "params" and k not in LEGACY_TRAINER_KEYS}
        return _trainer_params(raw, str(algorithm))

    @field_validator("trainer")
    @classmethod
    def _group_splits(cls, t: AlgorithmConfig, info: ValidationInfo) -> AlgorithmConfig:
        # A field validator, so the error is reported under `trainer` (algorithm comes first).
        algorithm = info.data.get("algorithm")
        if t.processes > 1 and algorithm is not None:
            reason = learner_group_refusal(algorithm=str(algorithm), params=t.params)
            if reason:
                raise ValueError(f"processes: {reason}")
        if t.processes > 1 and t.precision == "fp16":
            raise ValueError("processes: fp16's loss scaler is one process's; a learner group trains in fp32 or bf16")
        if t.processes % t.hosts:
            raise ValueError(f"hosts: {t.processes} processes do not split evenly over {t.hosts} hosts")
        return t

    @field_validator("eval")
    @classmethod
    def _eval_has_tasks(cls, ev: EvalConfig, info: ValidationInfo) -> EvalConfig:
        # A field validator (not the model's) so the error is reported under `eval`.
        if info.data.get("eval_every") and ev.taskset is None:
            raise ValueError("eval_every needs an evaluation taskset: set eval.taskset to a taskset id")
        return ev


class ConfigInvalid(InvalidInput):
    """A run config failed validation; `errors` maps dotted field paths to messages."""

    code = "config_invalid"

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__(errors=errors)


def _errors_by_field(exc: ValidationError) -> dict[str, str]:
    errors: dict[str, str] = {}
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"])
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, FieldConflict):
            field = ".".join(p for p in (field, cause.field) if p)
        msg = error_plain(err)
        if err["type"] == "extra_forbidden":
            msg = f"unknown key {str(err['loc'][-1])!r}"
        errors.setdefault(field, msg)
    return errors


def config_validate(*, data: object) -> RunConfig:
    """Validate a config mapping; raise ConfigInvalid naming each bad field. Values
    Postgres cannot store (NUL, lone surrogates, NaN, too deep) are refused first
    (`kernel.hygiene.tree_check`), so whatever validates can be written."""
    if isinstance(data, RunConfig):
        return data
    if not isinstance(data, dict):
        raise ConfigInvalid({"": "a run config must be a mapping of keys to values"})
    try:
        tree_check(data, root="")
    except InputRejected as exc:
        raise ConfigInvalid({exc.field: exc.message}) from None
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigInvalid(_errors_by_field(exc)) from None


def config_file_read(*, data: bytes | str, filename: str = "config") -> JSON:
    """A YAML or JSON config file's mapping, unvalidated (to show an invalid file in the
    form). Bytes are decoded strictly as UTF-8; ConfigInvalid names the line."""
    try:
        return config_text_parse(data, filename=filename)
    except InputRejected as exc:
        raise ConfigInvalid({exc.field: exc.message}) from None


def config_parse(*, text: bytes | str, filename: str = "config") -> RunConfig:
    """Parse a YAML or JSON config file (bytes: strictly UTF-8) and validate it."""
    return config_validate(data=config_file_read(data=text, filename=filename))


def config_dump(config: RunConfig) -> JSONObject:
    return config.model_dump(mode="json")
