"""Blind pairs between annotation items (an evaluation's placement "between"): the cards the
annotation page hands out (apps/feedback/extras.py, declared in apps.py's config), and the
person's evaluation votes as their ledger's line "evaluation vote: not trained".

A card is as blind as the vote page: it names the pair by its opaque token and posts to the
vote page's address (`/vote/<evaluation token>/<pair token>/`), so no element, attribute,
URL or answer names the run's versions or steps; its vote is the same Vote row. It is no
label: nothing of apps.feedback reads it (the label ledger, training, the reward model,
rater reliability and the training exports never see these tables)."""

from __future__ import annotations

import secrets

from apps.evaluation.models import Evaluation, Item, Vote
from apps.evaluation.selectors import prompt_shown, votes_waiting
from apps.evaluation.services import items_open_to
from apps.feedback.extras import Card, NotTrained
from apps.feedback.models import Person
from apps.runs.models import Run

# The open pairs a card is drawn from: random among the first few, so a live top-up rarely
# hands out a pair the page already shows (the page keeps one card per id).
DRAWN_FROM = 50
CHOICE_KEYS = (("left", "a", "A is better"), ("right", "b", "B is better"), ("tie", "t", "Tie"),
               ("both_bad", "x", "Both bad"))


def _between(run: Run) -> list[Evaluation]:
    return list(Evaluation.objects.filter(run=run, status=Evaluation.Status.OPEN,
                                          placement=Evaluation.Placement.BETWEEN).select_related("run"))


def card(*, evaluation: Evaluation, item: Item, note: str = "", choice: str = "") -> Card:
    """A pair's card: open (its form), or finished with `note` once voted (`choice`)."""
    return Card(template="evaluation/_between.html", context={
        "evaluation": evaluation, "token": item.token, "prompt": prompt_shown(item), "a": item.left_answer.text,
        "b": item.right_answer.text, "choices": CHOICE_KEYS, "note": note,
        "chosen": next((words for value, _, words in CHOICE_KEYS if value == choice), "")})


class BlindCards:
    """The annotation page's source of blind pairs (apps.feedback.extras.CardSource)."""

    def waiting(self, *, run: Run, person: Person) -> bool:
        return Evaluation.objects.filter(run=run, status=Evaluation.Status.OPEN,
                                         placement=Evaluation.Placement.BETWEEN).exists()

    def cards(self, *, run: Run, person: Person, count: int) -> list[Card]:
        drawn: list[tuple[Evaluation, Item]] = []
        for evaluation in _between(run):
            if votes_waiting(evaluation=evaluation, user=person):
                drawn += [(evaluation, item) for item in items_open_to(evaluation=evaluation, user=person)
                          .select_related("prompt", "left_answer", "right_answer")[:DRAWN_FROM]]
        chosen = secrets.SystemRandom().sample(drawn, min(count, len(drawn)))
        return [card(evaluation=e, item=item) for e, item in chosen]


BLIND_CARDS = BlindCards()


def votes_not_trained(run: Run, person: Person) -> list[NotTrained]:
    """The person's evaluation votes on `run`'s evaluations: their ledger's line."""
    count = Vote.objects.filter(item__evaluation__run=run, voter_id=person.pk).count() if person.pk else 0
    return [NotTrained(what="evaluation vote", count=count,
                       why="blind comparisons measure the model: they teach it nothing")]
