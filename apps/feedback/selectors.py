"""Reads of feedback: the annotator's queue, counts, and the DPO pairs the trainer takes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, QuerySet

from apps.feedback.kinds import kind_names, value_of
from apps.feedback.kinds.pairwise import PairwiseValue
from apps.feedback.models import Assignment, Feedback
from apps.runs.models import Run
from apps.runs.selectors import run_role


def run_may_annotate(*, run: Run, user: Any) -> bool:
    """Owners, staff and the run's annotators give feedback; viewers only look."""
    return run_role(run=run, user=user) in ("owner", "annotator")


def annotation_queue(*, run: Run, annotator: Any) -> QuerySet[Assignment]:
    """The annotator's leased items, in the order they were handed out."""
    return (
        Assignment.objects.filter(run=run, annotator=annotator, status=Assignment.Status.LEASED)
        .select_related("experience")
        .order_by("id")
    )


# Hand-outs the reward model did not choose: the selection rule's random share, and arrival
# order (no rule). Labels of items handed out only so are an unbiased sample of the run's items.
UNBIASED_SOURCES = (Assignment.Source.RANDOM, Assignment.Source.ARRIVAL)


def experiences_handed_out_unbiased(*, run: Run) -> set[int]:
    """Experiences every hand-out of which (skipped ones too) came from the random share or
    arrival order. One the rule, a gold turn or an unrecorded hand-out also gave out is left
    out, and so is one never handed out (rated through the API: someone chose it)."""
    chosen = Assignment.objects.filter(run=run).exclude(source__in=UNBIASED_SOURCES).values("experience_id")
    return set(Assignment.objects.filter(run=run, source__in=UNBIASED_SOURCES).exclude(experience_id__in=chosen)
               .values_list("experience_id", flat=True).distinct())


def annotator_progress(*, run: Run, annotator: Any) -> dict[str, int]:
    """The annotator's day on the run: judgements given today (local day), items waiting in
    their queue, and the owner's daily target (0: none)."""
    from django.utils import timezone

    start = timezone.localtime().replace(hour=0, minute=0, second=0, microsecond=0)
    done = Feedback.objects.filter(run=run, author=annotator, created_at__gte=start,
                                   kind__in=kind_names(labels=True)).count()
    waiting = Assignment.objects.filter(run=run, annotator=annotator, status=Assignment.Status.LEASED).count()
    return {"done_today": done, "waiting": waiting, "target": run.cfg.feedback.daily_target}


def feedback_counts(*, run: Run) -> dict[str, int]:
    """Feedback of the run by kind, plus `late` (stored after its target was trained on)."""
    counts = dict.fromkeys(Feedback.Kind.values, 0)
    for row in Feedback.objects.filter(run=run).values("kind").annotate(n=Count("id")):
        counts[row["kind"]] = row["n"]
    counts["late"] = Feedback.objects.filter(run=run, late=True).count()
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


def dpo_pairs(*, run: Run, include_late: bool = True) -> list[DpoPair]:
    """Preference pairs from pairwise feedback (ties carry no preference and are left out),
    oldest first. Late comparisons are included by default: DPO learns from them even when
    the GRPO step that used their completions is long past."""
    qs = Feedback.objects.filter(run=run, kind=Feedback.Kind.PAIRWISE, value__winner__in=["a", "b"])
    if not include_late:
        qs = qs.filter(late=False)
    pairs = []
    for fb in qs.select_related("experience", "other").order_by("created_at", "id"):
        a, b = fb.experience, fb.other
        if a is None or b is None:
            continue
        chosen, rejected = (a, b) if value_of(fb, PairwiseValue).winner == "a" else (b, a)
        pairs.append(DpoPair(
            feedback_id=fb.pk, prompt=chosen.prompt_text, chosen=chosen.response_text, rejected=rejected.response_text,
            chosen_id=chosen.pk, rejected_id=rejected.pk, late=fb.late,
        ))
    return pairs


def batch_feedback_metrics(*, rows: Sequence[Any]) -> dict[str, float]:
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
    """(winner id, loser id) from pairwise feedback whose two experiences are both in `ids`,
    oldest first. A pairwise feedback's `experience` is A and `other` is B, and its value is
    {"winner": "a" | "b" | "tie"} (the one shape, see Feedback); ties carry no preference.
    Late choices count: the pair was stored, and DPO learns from it.
    """
    wanted = set(ids)
    rows = Feedback.objects.filter(
        run=run, kind=Feedback.Kind.PAIRWISE, experience_id__in=wanted, other_id__in=wanted,
        value__winner__in=["a", "b"],
    ).order_by("created_at", "id").values_list("experience_id", "other_id", "value__winner")
    return [(a, b) if winner == "a" else (b, a) for a, b, winner in rows]
