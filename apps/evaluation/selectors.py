"""Reads of blind evaluations: the next pair for a voter, their progress, the figures (from
the vote rows, kernel/pairwise_stats.py) and the runs' evaluations a person may vote on."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Exists, OuterRef, QuerySet

from apps.evaluation.models import Answer, Evaluation, Item, Prompt, Vote
from apps.evaluation.services import items_open_to
from apps.runs.models import Run
from apps.runs.selectors import run_role
from kernel.jsontypes import JSONObject
from kernel.pairwise_stats import Figures, PairVote, WinRate, figures


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
    return prompt_words(item.prompt)


def prompt_words(prompt: Prompt) -> str:
    """A prompt as people read it: its text, or its chat messages one a line."""
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


@dataclass(frozen=True)
class BlindVerdict:
    """The newest blind evaluation of a run with votes: its versions and each win rate
    against its baseline (kernel.pairwise_stats: rate, Wilson interval, verdict)."""

    evaluation: Evaluation
    versions: list[str]
    votes: int
    win_rates: list[WinRate]


def blind_verdict(*, run: Run) -> BlindVerdict | None:
    """The run page headline's blind verdict: the newest of the run's evaluations that has
    votes, None where none has (the headline then says none exists yet)."""
    voted = Evaluation.objects.filter(run=run, items__votes__isnull=False).distinct().order_by("-created_at", "-pk")
    evaluation = voted.prefetch_related("entrants").first()
    if evaluation is None:
        return None
    fig = evaluation_figures(evaluation)
    return BlindVerdict(evaluation=evaluation, versions=labels(evaluation), votes=fig.votes, win_rates=fig.win_rates)


@dataclass(frozen=True)
class AnswerPair:
    prompt: str
    start: str
    newest: str


@dataclass(frozen=True)
class SideBySide:
    """Held-out prompts answered by version 0 and by `version`, at the same seed: the answers
    the blind evaluations cached (Answer, by run, version, prompt and seed); none is made here."""

    version: int
    seed: int
    pairs: list[AnswerPair]


def answers_side_by_side(*, run: Run, count: int = 3) -> SideBySide | None:
    """`count` prompts answered by version 0 and by the newest version that has cached answers
    to the same prompts at the same seed; None where no such answers exist."""
    with_start = Answer.objects.filter(run=run, version=0, digest=OuterRef("digest"), seed=OuterRef("seed"))
    version = (Answer.objects.filter(run=run, version__gt=0).filter(Exists(with_start))
               .order_by("-version").values_list("version", flat=True).first())
    if version is None:
        return None
    newest = list(Answer.objects.filter(run=run, version=version).filter(Exists(with_start)).order_by("seed", "digest")[:count])
    seed = newest[0].seed
    newest = [a for a in newest if a.seed == seed]
    starts = {a.digest: a.text for a in Answer.objects.filter(run=run, version=0, seed=seed,
                                                              digest__in=[a.digest for a in newest])}
    prompts = {p.digest: prompt_words(p) for p in Prompt.objects.filter(digest__in=starts)}
    return SideBySide(version=version, seed=seed, pairs=[
        AnswerPair(prompt=prompts.get(a.digest, ""), start=starts[a.digest], newest=a.text) for a in newest])
