"""Blind side-by-side evaluation: asking for one, opening it once its answers are written,
voting and closing (docs/guide/blind-evaluation.md). Every vote door (the vote page, the REST
API, the CLI) goes through these services, so the same refusals hold everywhere:

- a person who cannot see the run (never could, or lost access) gets NotFound, the answer a
  missing evaluation gets; one who can see it but is not among its voters gets NotAllowed;
- a vote before the evaluation opens or after it closes is a Conflict, as is a second vote
  on the same pair by the same person, or a vote on a pair that has all its votes.
"""

from __future__ import annotations

import hashlib
import json
import random
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User
from django.db import IntegrityError, transaction
from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from apps.buffer.models import Task
from apps.evaluation.models import Answer, Entrant, Evaluation, Item, Prompt, Vote
from apps.runs.models import ModelVersion, Run
from apps.runs.selectors import run_role
from kernel.exceptions import Conflict, InvalidInput, NotAllowed, NotFound
from kernel.input_checks import text_check
from rftweb.celery import app

ANSWERS_TASK = "workers.explore.blind.answers_generate"
PROMPTS_MAX = 500
VOTES_PER_PAIR_MAX = 20
COMMENT_MAX = 2000
# One prompt in CHECK_EVERY (at least one) also appears as a planted check.
CHECK_EVERY = 10
# The tasks read from the evaluation taskset to draw prompts from.
CANDIDATES_MAX = 10_000


@dataclass(frozen=True)
class VersionRef:
    """A version to compare: number `number` of run `run_id` (None: the evaluation's run)."""

    number: int
    run_id: int | None = None


def prompt_digest(*, text: str, messages: object) -> str:
    raw = json.dumps({"text": text, "messages": messages}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()


def token_new() -> str:
    return secrets.token_urlsafe(16)


def _entrant_runs(*, run: Run, versions: Sequence[VersionRef] | None, by: User) -> list[tuple[Run, int]]:
    if not versions:
        if run.current_version == 0:
            raise InvalidInput("the run has published no version yet to compare with its starting model",
                               field="versions")
        return [(run, 0), (run, run.current_version)]
    if len(versions) < 2:
        raise InvalidInput("compare two or more versions", field="versions")
    out: list[tuple[Run, int]] = []
    for ref in versions:
        other = run if ref.run_id in (None, run.pk) else Run.objects.filter(pk=ref.run_id).first()
        if other is None or run_role(run=other, user=by) is None:
            raise NotFound(f"run {ref.run_id} not found", field="versions")
        if ref.number != 0 and not ModelVersion.objects.filter(run=other, number=ref.number).exists():
            raise InvalidInput(f"run {other.pk} has no published version {ref.number}", field="versions")
        if (other, ref.number) in out:
            raise InvalidInput(f"version {ref.number} of run {other.pk} is named twice", field="versions")
        out.append((other, ref.number))
    return out


def _prompts(*, run: Run, prompts: Sequence[str] | None, count: int, rng: random.Random) -> list[tuple[str, object]]:
    if prompts:
        texts = [text_check(p, field="prompts").strip() for p in prompts]
        if any(not t for t in texts):
            raise InvalidInput("a prompt is empty", field="prompts")
        return [(t, None) for t in texts[:count]]
    taskset = run.cfg.eval.taskset
    if taskset is None:
        raise InvalidInput("the run has no evaluation taskset (eval.taskset): upload prompts for the evaluation",
                           field="prompts")
    # Held out from training: the run's evaluation taskset, text tasks only (no pictures).
    candidates = [(t.prompt, t.messages) for t in Task.objects.filter(taskset_id=taskset).order_by("index")
                  .only("prompt", "messages", "images")[:CANDIDATES_MAX] if not t.images and (t.prompt or t.messages)]
    if not candidates:
        raise InvalidInput(f"evaluation taskset {taskset} has no text tasks", field="prompts")
    return rng.sample(candidates, min(count, len(candidates)))


def _voters(*, run: Run, usernames: Sequence[str] | None) -> list[User]:
    names = sorted(set(usernames or []))
    users = list(User.objects.filter(username__in=names))
    missing = sorted(set(names) - {u.username for u in users} |
                     {u.username for u in users if run_role(run=run, user=u) is None})
    if missing:
        raise InvalidInput(f"not people of this run: {', '.join(missing)}", field="voters")
    return users


@transaction.atomic
def evaluation_create(*, run: Run, by: User, versions: Sequence[VersionRef] | None = None,
                      prompts: Sequence[str] | None = None, prompt_count: int = 20, votes_per_pair: int = 1,
                      voters: Sequence[str] | None = None, seed: int | None = None,
                      placement: str = Evaluation.Placement.PAGE) -> Evaluation:
    """Ask for a blind evaluation of `run` (its owner or staff): `versions` (default the
    starting version 0 against the newest; the first is the baseline), on `prompt_count`
    prompts held out from training (the run's evaluation taskset, or `prompts`), each pair
    voted on by `votes_per_pair` different people among `voters` (default the run's owner and
    annotators), on the vote page of its own or (`placement` "between") also between the items
    of the run's annotation page. The workers generate the answers not cached yet, then it opens."""
    if run_role(run=run, user=by) != "owner":
        raise NotAllowed("only the run's owner or staff may ask for an evaluation")
    if not 1 <= prompt_count <= PROMPTS_MAX:
        raise InvalidInput(f"prompt_count must be from 1 to {PROMPTS_MAX}", field="prompt_count")
    if not 1 <= votes_per_pair <= VOTES_PER_PAIR_MAX:
        raise InvalidInput(f"votes_per_pair must be from 1 to {VOTES_PER_PAIR_MAX}", field="votes_per_pair")
    if placement not in Evaluation.Placement.values:
        raise InvalidInput(f"placement must be one of {', '.join(Evaluation.Placement.values)}", field="placement")
    if seed is not None and not 0 <= seed < 2**31:
        raise InvalidInput("seed must be from 0 to 2^31-1", field="seed")
    seed = secrets.randbelow(2**31) if seed is None else seed
    entrants = _entrant_runs(run=run, versions=versions, by=by)
    chosen = _prompts(run=run, prompts=prompts, count=prompt_count, rng=random.Random(seed))
    people = _voters(run=run, usernames=voters)
    evaluation = Evaluation.objects.create(run=run, created_by=by, token=token_new(), seed=seed,
                                           votes_per_pair=votes_per_pair, placement=placement)
    evaluation.voters.set(people)
    Entrant.objects.bulk_create(Entrant(evaluation=evaluation, position=i, run=r, number=n)
                                for i, (r, n) in enumerate(entrants))
    Prompt.objects.bulk_create(Prompt(evaluation=evaluation, position=i, text=text, messages=messages,
                                      digest=prompt_digest(text=text, messages=messages))
                               for i, (text, messages) in enumerate(chosen))
    if not evaluation_open(evaluation_id=evaluation.pk):
        transaction.on_commit(lambda: app.send_task(ANSWERS_TASK, args=[evaluation.pk]))
    evaluation.refresh_from_db()
    return evaluation


@dataclass(frozen=True)
class AnswerNeed:
    """An answer the workers must write: version `version` of run `run_id` on a prompt, at `seed`."""

    run_id: int
    version: int
    digest: str
    seed: int
    text: str
    messages: object


def answers_missing(*, evaluation: Evaluation) -> list[AnswerNeed]:
    prompts = list(evaluation.prompts.all())
    needs: list[AnswerNeed] = []
    for entrant in evaluation.entrants.all():
        have = set(Answer.objects.filter(run_id=entrant.run_id, version=entrant.number, seed=evaluation.seed,
                                         digest__in=[p.digest for p in prompts]).values_list("digest", flat=True))
        needs += [AnswerNeed(run_id=entrant.run_id, version=entrant.number, digest=p.digest, seed=evaluation.seed,
                             text=p.text, messages=p.messages) for p in prompts if p.digest not in have]
    return needs


def answer_record(*, run_id: int, version: int, digest: str, seed: int, text: str) -> None:
    """Cache an answer; a second writer of the same key keeps the first (the cache is by key)."""
    Answer.objects.get_or_create(run_id=run_id, version=version, digest=digest, seed=seed, defaults={"text": text})


def _items(evaluation: Evaluation) -> list[Item]:
    entrants = list(evaluation.entrants.all())
    prompts = list(evaluation.prompts.all())
    answers = {(a.run_id, a.version, a.digest): a for a in Answer.objects.filter(
        seed=evaluation.seed, digest__in=[p.digest for p in prompts],
        run_id__in=[e.run_id for e in entrants])}
    # The sides and the order are drawn by the system's randomness, not the recorded seed:
    # whoever knows the seed must not learn which side is which.
    sides = secrets.SystemRandom()
    items: list[Item] = []
    for prompt in prompts:
        for i, first in enumerate(entrants):
            for second in entrants[i + 1:]:
                left, right = (first, second) if sides.random() < 0.5 else (second, first)
                items.append(Item(evaluation=evaluation, prompt=prompt, left=left, right=right,
                                  left_answer=answers[(left.run_id, left.number, prompt.digest)],
                                  right_answer=answers[(right.run_id, right.number, prompt.digest)],
                                  token=token_new(), order=0))
    checked = random.Random(evaluation.seed).sample(prompts, max(1, len(prompts) // CHECK_EVERY))
    for prompt in checked:
        newest = entrants[-1]
        answer = answers[(newest.run_id, newest.number, prompt.digest)]
        items.append(Item(evaluation=evaluation, prompt=prompt, left=newest, right=newest, left_answer=answer,
                          right_answer=answer, is_check=True, token=token_new(), order=0))
    sides.shuffle(items)
    for order, item in enumerate(items):
        item.order = order
    return items


def evaluation_open(*, evaluation_id: int) -> bool:
    """Open the evaluation for voting once every answer it needs is cached (its items drawn);
    False while some are missing. Idempotent: an open or closed evaluation stays as it is."""
    with transaction.atomic():
        evaluation = Evaluation.objects.select_for_update().filter(pk=evaluation_id).first()
        if evaluation is None:
            return False
        if evaluation.status != Evaluation.Status.GENERATING:
            return True
        if answers_missing(evaluation=evaluation):
            return False
        Item.objects.bulk_create(_items(evaluation))
        evaluation.status = Evaluation.Status.OPEN
        evaluation.opened_at = timezone.now()
        evaluation.save(update_fields=["status", "opened_at"])
    return True


def evaluation_failed(*, evaluation_id: int, error: str) -> None:
    Evaluation.objects.filter(pk=evaluation_id, status=Evaluation.Status.GENERATING).update(error=error[:2000])


def evaluation_close(*, evaluation: Evaluation, by: AbstractBaseUser | AnonymousUser) -> Evaluation:
    if run_role(run=evaluation.run, user=by) is None:
        raise NotFound(f"evaluation {evaluation.pk} not found")
    if run_role(run=evaluation.run, user=by) != "owner":
        raise NotAllowed("only the run's owner or staff may close an evaluation")
    closed = Evaluation.objects.filter(pk=evaluation.pk).exclude(status=Evaluation.Status.CLOSED).update(
        status=Evaluation.Status.CLOSED, closed_at=timezone.now())
    if not closed:
        raise Conflict(f"evaluation {evaluation.pk} is already closed")
    evaluation.refresh_from_db()
    return evaluation


def voter_check(*, evaluation: Evaluation, user: AbstractBaseUser | AnonymousUser) -> int:
    """The voter's id; NotFound for a person who cannot see the run (as for a missing
    evaluation), NotAllowed for one who can but is not among its voters."""
    role = run_role(run=evaluation.run, user=user)
    if role is None or not isinstance(user.pk, int):
        raise NotFound("no such evaluation")
    voter_id: int = user.pk
    named = evaluation.voters.all()
    if named.exists():
        if not named.filter(pk=voter_id).exists():
            raise NotAllowed("you are not among this evaluation's voters")
    elif role not in ("owner", "annotator"):
        raise NotAllowed("viewers of a run do not vote on its evaluations")
    return voter_id


def items_open_to(*, evaluation: Evaluation, user: AbstractBaseUser | AnonymousUser) -> QuerySet[Item]:
    """The pairs `user` may still vote on: never one they voted on, and a pair only while it
    lacks votes (planted checks are for everyone)."""
    return (evaluation.items.exclude(votes__voter_id=user.pk)
            .annotate(n_votes=Count("votes"))
            .filter(Q(is_check=True) | Q(n_votes__lt=evaluation.votes_per_pair))
            .order_by("order"))


def vote_cast(*, evaluation: Evaluation, token: str, voter: AbstractBaseUser | AnonymousUser, choice: str,
              comment: str = "") -> Vote:
    voter_id = voter_check(evaluation=evaluation, user=voter)
    if choice not in Vote.Choice.values:
        raise InvalidInput(f"choice must be one of {', '.join(Vote.Choice.values)}", field="choice")
    comment = text_check(comment, field="comment").strip()
    if len(comment) > COMMENT_MAX:
        raise InvalidInput(f"a comment is at most {COMMENT_MAX} characters", field="comment")
    with transaction.atomic():
        current = Evaluation.objects.select_for_update().get(pk=evaluation.pk)
        if current.status != Evaluation.Status.OPEN:
            raise Conflict("this evaluation is closed" if current.status == Evaluation.Status.CLOSED
                           else "this evaluation is not open for votes yet")
        item = Item.objects.filter(evaluation=current, token=token).first()
        if item is None:
            raise NotFound("no such pair in this evaluation", field="token")
        if item.votes.filter(voter_id=voter_id).exists():
            raise Conflict("you have already voted on this pair")
        if not item.is_check and item.votes.count() >= current.votes_per_pair:
            raise Conflict("this pair has all its votes")
        try:
            with transaction.atomic():
                return Vote.objects.create(item=item, voter_id=voter_id, choice=choice, comment=comment)
        except IntegrityError:
            raise Conflict("you have already voted on this pair") from None
