"""What an app above this one adds to the annotation page, without apps.feedback importing it
(the apps' layers, pyproject.toml): an installed app declares it on its AppConfig, as dotted
paths this module loads by name (so neither side imports the other's modules at app loading):

  annotation_cards = "apps.evaluation.between.BLIND_CARDS"           a CardSource
  annotation_not_trained = "apps.evaluation.between.votes_not_trained"  a NotTrainedSource

- Cards between the queue's items: a source that has something for the person (`waiting`)
  gives up to `count` cards, each a template and its context (`card` in it, beside the page's
  own context: its CSRF token): an `article.item` with an id of its own and, for the page's
  keys, buttons carrying `data-key`. A card follows every `RFT_ANNOTATION_BETWEEN_EVERY`-th
  item the person was handed on the run, counted over all their assignments, so the page and
  its live top-ups place them alike (apps/evaluation/between.py: blind votes, which are no
  feedback and never train).
- Lines of the person's ledger for what they gave on the run that is no label: "3 evaluation
  votes: not trained". The label ledger (apps/feedback/ledger.py) counts labels only.

A run with no source waiting costs each source's `waiting` check and nothing else.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from django.apps import apps as installed
from django.conf import settings
from django.utils.module_loading import import_string

from apps.feedback.models import Assignment, Person
from apps.runs.models import Run


@dataclass(frozen=True)
class Card:
    """A card between items: `template`, rendered with `context` as `card` (feedback/_queue.html)."""

    template: str
    context: Mapping[str, object]


class CardSource(Protocol):
    def waiting(self, *, run: Run, person: Person) -> bool: ...

    def cards(self, *, run: Run, person: Person, count: int) -> list[Card]: ...


@dataclass(frozen=True)
class NotTrained:
    """What a person gave on a run that no training reads: `count` of `what` (singular), and why."""

    what: str
    count: int
    why: str

    @property
    def words(self) -> str:
        return f"{self.count} {self.what}{'' if self.count == 1 else 's'}: not trained"


NotTrainedSource = Callable[[Run, Person], list[NotTrained]]

def _declared(attribute: str) -> list[str]:
    """The dotted paths the installed apps declare under `attribute` on their AppConfig."""
    return [path for config in installed.get_app_configs()
            if isinstance(path := getattr(config, attribute, None), str)]


@functools.cache
def card_sources() -> list[CardSource]:
    return [import_string(path) for path in _declared("annotation_cards")]


@functools.cache
def not_trained_sources() -> list[NotTrainedSource]:
    return [import_string(path) for path in _declared("annotation_not_trained")]


@dataclass(frozen=True)
class QueueEntry:
    """One entry of the annotation queue as the page lists it: an item or a card between items."""

    assignment: Assignment | None = None
    card: Card | None = None


def _slots(*, run: Run, person: Person, items: Sequence[Assignment], every: int) -> list[int]:
    """The indices of `items` a card follows: those the person's every-th assignment on the run."""
    last = max(a.pk for a in items)
    mine = sorted(Assignment.objects.filter(run=run, annotator_id=person.pk, pk__lte=last).values_list("pk", flat=True))
    return [i for i, a in enumerate(items) if bisect.bisect_right(mine, a.pk) % every == 0]


def queue_entries(*, run: Run, person: Person, items: Sequence[Assignment]) -> list[QueueEntry]:
    entries = [QueueEntry(assignment=a) for a in items]
    every = settings.RFT_ANNOTATION_BETWEEN_EVERY
    sources = [s for s in card_sources() if items and every > 0 and s.waiting(run=run, person=person)]
    if not sources:
        return entries
    slots = _slots(run=run, person=person, items=items, every=every)
    cards: list[Card] = []
    for source in sources:
        cards += source.cards(run=run, person=person, count=len(slots) - len(cards)) if len(cards) < len(slots) else []
    # Last slot first, so the earlier indices still point at their items.
    for index, card in reversed(list(zip(slots, cards))):
        entries.insert(index + 1, QueueEntry(card=card))
    return entries


def not_trained(*, run: Run, person: Person) -> list[NotTrained]:
    return [line for source in not_trained_sources() for line in source(run, person) if line.count]
