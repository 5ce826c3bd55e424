"""Reads of blind evaluations: the next pair for a voter, their progress, the figures (from
the vote rows, kernel/pairwise_stats.py) and the runs' evaluations a person may vote on."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet

from apps.evaluation.models import Evaluation, Item, Vote
from apps.evaluation.services import items_open_to
from apps.runs.models import Run
from apps.runs.selectors import run_role
from kernel.jsontypes import JSONObject
from kernel.pairwise_stats import Figures, PairVote, figures


@dataclass(frozen=True)
class Progress:
    done: int
    total: int


@dataclass(frozen=True)
class NextItem:
    """What a voter is shown: the pair's opaque token and its texts; never a version."""

    token: str
    prompt: str
    a: str
    b: str
    progress: Progress


def progress_of(*, evaluation: Evaluation, user: AbstractBaseUser | AnonymousUser) -> Progress:
    done = Vote.objects.filter(item__evaluation=evaluation, voter_id=user.pk).count()
    return Progress(done=done, total=done + items_open_to(evaluation=evaluation, user=user).count())


def prompt_shown(item: Item) -> str:
    """The prompt as the voter reads it: its text, or its chat messages one a line."""
    prompt = item.prompt
    if prompt.text or not isinstance(prompt.messages, list):
        return prompt.text
    return "\n\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in prompt.messages if isinstance(m, dict))


def next_item(*, evaluation: Evaluation, user: AbstractBaseUser | AnonymousUser) -> NextItem | None:
    """The next pair for `user` (the access checks are the caller's: services.voter_check)."""
    item = (items_open_to(evaluation=evaluation, user=user)
            .select_related("prompt", "left_answer", "right_answer").first())
    if item is None:
        return None
    return NextItem(token=item.token, prompt=prompt_shown(item), a=item.left_answer.text, b=item.right_answer.text,
                    progress=progress_of(evaluation=evaluation, user=user))


def labels(evaluation: Evaluation) -> list[str]:
    """The versions compared, baseline first ("v0", "v5", or "run 12 v3" for another run's)."""
    return [e.label(evaluation.run_id) for e in evaluation.entrants.all()]


def pair_votes(evaluation: Evaluation) -> list[PairVote]:
    run_id = evaluation.run_id
    rows = Vote.objects.filter(item__evaluation=evaluation).select_related("item__left", "item__right", "voter")
    return [PairVote(item=v.item_id, left=v.item.left.label(run_id), right=v.item.right.label(run_id),
                     choice=v.choice, voter=v.voter.get_username(), check=v.item.is_check) for v in rows]


def evaluation_figures(evaluation: Evaluation) -> Figures:
    return figures(pair_votes(evaluation), labels(evaluation), seed=evaluation.seed)


def vote_record(vote: Vote) -> JSONObject:
    """A vote as one line of the JSON-lines export (the owner's: it names the versions)."""
    item = vote.item
    run_id = item.evaluation.run_id
    winner = {"left": item.left.label(run_id), "right": item.right.label(run_id)}.get(vote.choice)
    return {"evaluation": item.evaluation_id, "item": item.pk, "check": item.is_check, "prompt": item.prompt.text,
            "left": item.left.label(run_id), "right": item.right.label(run_id), "choice": vote.choice,
            "winner": winner, "voter": vote.voter.get_username(), "comment": vote.comment,
            "created_at": vote.created_at.isoformat()}


def votes_export(evaluation: Evaluation) -> Iterator[JSONObject]:
    rows = (Vote.objects.filter(item__evaluation=evaluation)
            .select_related("item__evaluation", "item__prompt", "item__left", "item__right", "voter"))
    for vote in rows.iterator(chunk_size=500):
        yield vote_record(vote)


def run_evaluations(*, run: Run) -> QuerySet[Evaluation]:
    return Evaluation.objects.filter(run=run).prefetch_related("entrants").order_by("-created_at")


def evaluations_to_vote(*, user: AbstractBaseUser | AnonymousUser, run: Run | None = None) -> list[Evaluation]:
    """Open evaluations `user` may vote on and has pairs left in (of `run`, or of every run)."""
    if not user.is_authenticated:
        return []
    candidates = Evaluation.objects.filter(status=Evaluation.Status.OPEN).select_related("run")
    if run is not None:
        candidates = candidates.filter(run=run)
    return [e for e in candidates[:50] if votes_waiting(evaluation=e, user=user)]


def votes_waiting(*, evaluation: Evaluation, user: AbstractBaseUser | AnonymousUser,
                  role: str | None | bool = False) -> bool:
    """Whether `user` may vote on `evaluation` (open) and has pairs left in it; `role`: their
    role on its run when the caller knows it already."""
    if evaluation.status != Evaluation.Status.OPEN or not user.is_authenticated:
        return False
    role = run_role(run=evaluation.run, user=user) if role is False else role
    named = list(evaluation.voters.values_list("pk", flat=True))
    may = role is not None and (user.pk in named if named else role in ("owner", "annotator"))
    return may and items_open_to(evaluation=evaluation, user=user).exists()


def evaluation_by_token(token: str) -> Evaluation | None:
    return Evaluation.objects.select_related("run").filter(token=token).first() if token else None
