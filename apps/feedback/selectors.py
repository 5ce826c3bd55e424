"""Reads of feedback: who may annotate, what a label does, the counts by kind, and the pairs
people stated (DPO's, a preference algorithm's batch). The queue's reads are the hand-out's
(apps.feedback.handout.queue)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db.models import Count, Q, QuerySet

from apps.buffer.models import Experience
from apps.feedback.models import Feedback, Person
from apps.feedback.kinds import kind_get, kind_names, preference_kind_names
from apps.feedback.ledger import kind_refusal
from apps.runs.models import Run
from apps.runs.selectors import run_role


def run_may_annotate(*, run: Run, user: Person) -> bool:
    """Owners, staff and the run's annotators give feedback; viewers only look."""
    return run_role(run=run, user=user) in ("owner", "annotator")


def feedback_effect(*, run: Run, feedback: Feedback) -> str:
    """What a piece of feedback does, in the words the page, the API and the CLI all use. A
    label that arrives after its group trained (late) still teaches the run's reward model
    (apps.feedback.reward_model.preferences takes late labels: the next version trains on them)."""
    kind = kind_get(feedback.kind)
    teaches = kind.labels and run.cfg.reward_model.enabled
    # Where the run never trains on the kind, the label says so and where it would count.
    refusal = kind_refusal(run=run, kind_name=feedback.kind)
    untrained = f"; not trained by this run: {refusal}" if refusal else ""
    if feedback.late and kind.reaches_training() != "expert":
        return ("late: teaches the reward model" if teaches else "late: kept for DPO, SFT and export") + untrained
    parts = []
    if kind.folds and run.cfg.feedback.mode != "auto":
        parts.append("moves its group's reward")
    if kind.reaches_training() == "expert" and refusal is None:
        parts.append("trains as an expert experience")
    if teaches:
        parts.append("teaches the reward model")
    return (" and ".join(parts) or "stored") + untrained


def late_words(*, run: Run, feedback: Feedback) -> str:
    """" (what it does)" for a late row, as the saved notes say it; "" otherwise."""
    if not feedback.late:
        return ""
    return f" ({feedback_effect(run=run, feedback=feedback)})"


def feedback_counts(*, run: Run) -> dict[str, int]:
    """Feedback of the run by kind (every registered kind, none given: 0), plus `late` (stored
    after its target was trained on) and `labels` (the label kinds: the ledger's total, which
    the annotation header shows beside the states)."""
    counts = dict.fromkeys(kind_names(), 0)
    counts["late"] = counts["labels"] = 0
    labels = set(kind_names(labels=True))
    # One query (the annotation header asks after every label and every 10 s).
    for row in Feedback.objects.filter(run=run).values("kind").annotate(n=Count("id"), late=Count("id", filter=Q(late=True))):
        counts[row["kind"]] = row["n"]
        counts["late"] += row["late"]
        if row["kind"] in labels:
            counts["labels"] += row["n"]
    return counts


@dataclass(frozen=True)
class DpoPair:
    feedback_id: int
    prompt: str
    chosen: str
    rejected: str
    chosen_id: int
    rejected_id: int
    late: bool


def _stated_preferences(rows: QuerySet[Feedback]) -> list[tuple[Feedback, int, int]]:
    """(row, better id, worse id) for each pair the rows state, through each row's kind
    (`preferred`: a pairwise tie states none), oldest row first."""
    ordered = rows.order_by("created_at", "id").only("kind", "experience_id", "other_id", "value", "late")
    return [(fb, better, worse) for fb in ordered for better, worse in kind_get(fb.kind).preferred(fb)]


def dpo_pairs(*, run: Run, include_late: bool = True) -> list[DpoPair]:
    """Preference pairs people stated, oldest first: every pair of each label whose kind
    reaches training as preferences (`preference_kind_names`: the A/B choices; a tie carries
    no preference). Late ones are included by default: DPO learns from them even when the
    GRPO step that used their completions is long past."""
    qs = Feedback.objects.effective().filter(run=run, kind__in=preference_kind_names())
    if not include_late:
        qs = qs.filter(late=False)
    stated = _stated_preferences(qs)
    ids = {pk for _, better, worse in stated for pk in (better, worse)}
    exps = Experience.objects.filter(pk__in=ids).only("pk", "prompt_text", "response_text").in_bulk() if ids else {}
    pairs = []
    for fb, better, worse in stated:
        chosen, rejected = exps.get(better), exps.get(worse)
        if chosen is None or rejected is None:
            continue
        pairs.append(DpoPair(
            feedback_id=fb.pk, prompt=chosen.prompt_text, chosen=chosen.response_text, rejected=rejected.response_text,
            chosen_id=chosen.pk, rejected_id=rejected.pk, late=fb.late,
        ))
    return pairs


def batch_feedback_metrics(*, rows: Sequence[Experience]) -> dict[str, float]:
    """How much of a trained batch people's feedback reached, as step metrics (`feedback/…`):
    the share of the model's own experiences that carry a human reward, their mean human
    reward, and the expert (corrected) experiences trained on. They go where every metric
    goes (the run page, its live event, the run's experiment trackers), so a team sees how
    many of the steps' rewards came from people, not only the label count."""
    own = [e for e in rows if not e.is_expert]
    rated = [e.human_reward for e in own if e.human_reward is not None]
    out = {"feedback/human_share": len(rated) / len(own) if own else 0.0,
           "feedback/expert": float(len(rows) - len(own))}
    if rated:
        out["feedback/human_reward_mean"] = sum(rated) / len(rated)
    return out


def preferences_among(*, run: Run, ids: list[int]) -> list[tuple[int, int]]:
    """(better id, worse id) of every pair people stated whose two experiences are both in
    `ids` (a preference algorithm's batch), oldest label first: the labels of the kinds that
    reach training as preferences (`preference_kind_names`), each pair as its kind's
    `preferred` states it (a pairwise tie carries none). Late labels count: the pair was
    stored, and the algorithm learns from it. One statement: the labels about the batch's
    experiences or of its groups (a label of a whole group names none of them itself).
    """
    wanted = set(ids)
    groups = Experience.objects.filter(run=run, pk__in=wanted).values("group_id")
    rows = Feedback.objects.effective().filter(Q(experience_id__in=wanted) | Q(group_id__in=groups), run=run,
                                               kind__in=preference_kind_names())
    return [(better, worse) for _, better, worse in _stated_preferences(rows) if better in wanted and worse in wanted]
