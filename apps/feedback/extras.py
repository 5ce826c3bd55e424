"""What an app above this one adds to the annotation page, without apps.feedback importing it
(the apps' layers, pyproject.toml): the app registers a source from its AppConfig.ready().

- Cards between the queue's items: a source that has something for the person (`waiting`)
  gives up to `count` cards, each a template and its context (`card` in it, beside the page's
  own context: its CSRF token): an `article.item` with an id of its own and, for the page's
  keys, buttons carrying `data-key`. A card follows every
  `RFT_ANNOTATION_BETWEEN_EVERY`-th item the person was handed on the run, counted over all
  their assignments, so the page and its live top-ups place them alike (apps/evaluation/between.py:
  blind votes, which are no feedback and never train).
- Lines of the person's ledger for what they gave on the run that is no label: "3 evaluation
  votes: not trained". The label ledger (apps/feedback/ledger.py) counts labels only.

A run with no source waiting costs each source's `waiting` check and nothing else.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from django.conf import settings

from apps.feedback.holds import Person
from apps.feedback.models import Assignment
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

_card_sources: dict[str, CardSource] = {}
_not_trained_sources: dict[str, NotTrainedSource] = {}


def card_source_register(name: str, source: CardSource) -> None:
    """Hand out `source`'s cards between annotation items (again under `name`: replaced)."""
    _card_sources[name] = source


def not_trained_register(name: str, source: NotTrainedSource) -> None:
    _not_trained_sources[name] = source


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
    sources = [s for s in _card_sources.values() if items and every > 0 and s.waiting(run=run, person=person)]
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
    return [line for source in _not_trained_sources.values() for line in source(run, person) if line.count]
