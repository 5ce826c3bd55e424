"""K-12 free-form answers, web side (no torch): the two graders a run's reward spec can name
for tasks of domain `k12`, their typed params, the graded answers the learned grader learns
from, and its versions.

- `k12_judge`: a reference-guided LLM judge. The judge model (params.model, else the run's
  current model) is prompted with the question, the reference answer and a rubric through a
  rollout engine of workers/engines, and answers "Score: N" and "Reason: ...". Output without
  a readable score scores 0 with the reason logged and stored (workers/reward/k12.py).
- `k12_learned`: a learned grader, a scalar-head reward model trained with the machinery of
  the human-feedback reward model (workers/reward/trainer.py: TRL's RewardTrainer, held-out
  pairwise accuracy, calibration onto the grade scale) on graded answers: the taskset's
  `graded_answers` column and people's ratings of K-12 experiences. Each trained grader is a
  numbered version of the run (K12Grader), retrained when `retrain_every` new grades came in.

Both are scored on the `reward` queue. Which one a run uses and with what weight is a term of
its `rewards` list, e.g. `{name: k12_judge, weight: 0.5, domains: [k12]}`; with no terms a
K-12 task gets `k12_judge` (apps/rewards/scoring.py).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import Field, ValidationError

from apps.rewards.pairs import PreferencePair
from kernel.rewards import ParamsCheck, RewardFn, RewardResult, domain_register, register
from kernel.config_base import StrictModel
from kernel.plain_errors import error_plain
from kernel.rewards import task_field
from kernel.rewards import reference_text

if TYPE_CHECKING:
    from apps.rewards.models import K12Grader
    from apps.runs.models import Run

log = logging.getLogger(__name__)

DOMAIN = "k12"
ACCURACY_METRIC = "k12_grader/accuracy"

DEFAULT_RUBRIC = (
    "Full marks when the answer states the same fact as the reference (other words are fine); "
    "half marks when it is partly right or incomplete; zero when it is wrong, off-topic or empty."
)


class K12JudgeParams(StrictModel):
    rubric: str = Field(DEFAULT_RUBRIC, min_length=1, max_length=4000)
    # Without a model the judge is the run's current model.
    model: str | None = Field(None, min_length=1)
    engine: str = Field("transformers", pattern="^(transformers|vllm)$")
    scale: float = Field(10.0, gt=0.0, le=100.0)
    max_tokens: int = Field(64, ge=4, le=1024)
    max_prompt_tokens: int = Field(2048, ge=64, le=65536)


class K12LearnedParams(StrictModel):
    # The model a version is trained from: a path or hub id; None: the run's current model.
    base: str | None = Field(None, min_length=1)
    retrain_every: int = Field(20, ge=1)
    heldout_share: float = Field(0.25, gt=0.0, lt=1.0)
    epochs: int = Field(4, ge=1, le=100)
    learning_rate: float = Field(3e-4, gt=0.0)
    batch_size: int = Field(16, ge=1)
    max_length: int = Field(256, ge=8)


def _params_check(name: str, model: type[StrictModel]) -> ParamsCheck:
    def check(params: Mapping[str, object]) -> None:
        try:
            model.model_validate(dict(params))
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            msg = f"unknown param {where!r}" if err["type"] == "extra_forbidden" else error_plain(err)
            raise ValueError(f"{name}: params.{where}: {msg}") from None

    return check


def judge_params(params: Mapping[str, object]) -> K12JudgeParams:
    return K12JudgeParams.model_validate(dict(params))


def learned_params(params: Mapping[str, object]) -> K12LearnedParams:
    return K12LearnedParams.model_validate(dict(params))


def _worker_only(name: str) -> RewardFn:
    def fn(completion: str, task: object, **params: object) -> RewardResult:
        raise RuntimeError(f"reward {name!r} is scored by workers.reward.k12 on queue 'reward', not inline")

    fn.__name__ = name
    return fn


register("k12_judge", where="reward", check=_params_check("k12_judge", K12JudgeParams),
         description="a reference-guided LLM judge of a K-12 answer: question, reference and rubric in, "
                     "'Score: N' and a reason out, scaled to 0..1")(_worker_only("k12_judge"))
register("k12_learned", where="reward", check=_params_check("k12_learned", K12LearnedParams),
         description="the run's learned K-12 grader (a reward model trained on graded answers, versioned), "
                     "its score calibrated to the 0..1 grade scale")(_worker_only("k12_learned"))


# ---------------------------------------------------------------------------------------
# Graded answers


@dataclass(frozen=True)
class GradedAnswer:
    task_id: int
    question: str
    reference: str
    answer: str
    grade: float  # on [0, 1]
    source: str  # "taskset" or "rating"


def grader_prompt(*, question: str, reference: str) -> str:
    """What the learned grader reads before an answer: it grades against the reference."""
    return f"Question: {question}\nReference answer: {reference}\nStudent answer:"


def graded_answers_of_record(value: object) -> list[tuple[str, float]]:
    """(answer, grade) pairs of a task's `graded_answers` column: a list of {answer, grade}
    with the grade on [0, 1]; entries of another shape are skipped."""
    out = []
    for item in value if isinstance(value, list) else []:
        if not isinstance(item, Mapping):
            continue
        answer, grade = item.get("answer"), item.get("grade")
        if isinstance(answer, str) and answer.strip() and isinstance(grade, (int, float)) \
                and not isinstance(grade, bool) and 0.0 <= float(grade) <= 1.0:
            out.append((answer, float(grade)))
    return out


def task_question(task: object) -> str:
    """A task's question as text: its prompt, or its chat messages' contents joined."""

    prompt = task_field(task, "prompt") or ""
    messages = task_field(task, "messages")
    if not prompt and isinstance(messages, list):
        prompt = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, Mapping))
    return str(prompt)


def k12_graded_answers(*, run: Run) -> list[GradedAnswer]:
    """Every graded answer of the run's K-12 tasks: the taskset's `graded_answers` column,
    then people's ratings (the human reward on [0, 1]) of K-12 experiences."""
    # Django-free: the kernel's registries import this module without Django (tests/test_layers.py).
    from apps.buffer.models import Experience, Task

    out: list[GradedAnswer] = []
    if run.taskset_id is not None:
        for task in Task.objects.filter(taskset_id=run.taskset_id, domain=DOMAIN).order_by("index"):
            for answer, grade in graded_answers_of_record((task.metadata or {}).get("graded_answers")):
                out.append(GradedAnswer(task.pk, task_question(task), reference_text(task), answer, grade, "taskset"))
    rated = (Experience.objects.filter(run=run, task__domain=DOMAIN, human_reward__isnull=False, is_expert=False)
             .select_related("task").order_by("id"))
    for exp in rated:
        rated_task = exp.task
        assert rated_task is not None  # filtered on its domain
        out.append(GradedAnswer(rated_task.pk, task_question(rated_task), reference_text(rated_task), exp.response_text,
                                min(1.0, max(0.0, float(exp.human_reward or 0.0))), "rating"))
    return out


def k12_grade_count(*, run: Run) -> int:
    return len(k12_graded_answers(run=run))


# ---------------------------------------------------------------------------------------
# Versions


def k12_grader_latest(*, run: Run) -> K12Grader | None:
    # Django-free: the kernel's registries import this module without Django (tests/test_layers.py).
    from apps.rewards.models import K12Grader

    return K12Grader.objects.filter(run=run).order_by("-version").first()


def k12_grader_due(*, run: Run, params: K12LearnedParams, grades: int | None = None) -> bool:
    """A version is due when there is none yet or `retrain_every` grades came in since."""
    latest = k12_grader_latest(run=run)
    grades = k12_grade_count(run=run) if grades is None else grades
    if latest is None:
        return grades > 0
    return grades - latest.grades >= params.retrain_every


def k12_grader_publish(
    *, run: Run, path: str, base: str, accuracy: float | None, pairs_train: int, pairs_heldout: int, grades: int,
    seconds: float, scale: float, offset: float,
) -> K12Grader:
    """Record a trained K-12 grader as the run's next version, its accuracy as a metric."""
    # Django-free: the kernel's registries import this module without Django (tests/test_layers.py).
    from apps.rewards.models import K12Grader
    from apps.rewards.services import scorer_publish

    return scorer_publish(
        model=K12Grader, run=run, metric=ACCURACY_METRIC, accuracy=accuracy, path=path, base=base,
        pairs_train=pairs_train, pairs_heldout=pairs_heldout, grades=grades, seconds=seconds, scale=scale, offset=offset,
    )


def k12_grade_pairs(answers: list[GradedAnswer]) -> list[PreferencePair]:
    """Preference pairs (apps.rewards.pairs.PreferencePair) of the graded answers:
    within one question, an answer graded higher over one graded lower; the prompt carries
    the question and reference, the group is the question (so a held-out split keeps whole
    questions out). The same text graded twice counts with its mean grade."""
    grades: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    prompts: dict[int, str] = {}
    for a in answers:
        grades[a.task_id][a.answer].append(a.grade)
        prompts[a.task_id] = grader_prompt(question=a.question, reference=a.reference)
    pairs = []
    for task_id in sorted(grades):
        means = sorted(((sum(g) / len(g), text) for text, g in grades[task_id].items()), reverse=True)
        for i, (hi, chosen) in enumerate(means):
            for lo, rejected in means[i + 1:]:
                if hi > lo:
                    pairs.append(PreferencePair(prompt=prompts[task_id], chosen=chosen, rejected=rejected, chosen_id=0,
                                                rejected_id=0, group_id=f"k12:{task_id}", kind="grade", margin=hi - lo))
    return pairs


# Tasks of this domain are scored by these terms when a run names none of its own.
domain_register("k12", terms={"k12_judge": 1.0})
