"""What the review page reads (issue 32 item 5, from Argilla / Label Studio): a run's labels
newest first with their review state, and its disagreements, the items where people's labels
conflict.

Two labels of different people conflict when
- they score one completion far apart: their votes (a rating's normalised score, a
  ranking's Borda score; see kernel.fold) differ by RATING_GAP or more, e.g.
  1/5 against 3/5, a thumb up against a thumb down, or a ranking's first place against 1/5;
- or one of them is a choice (an A/B comparison, a correction) and the other prefers the
  opposite of it: A over B against B over A, from a comparison or a ranking.
A conflict stays open until one side is rejected, or both are accepted (the owner looked and
kept both). Rejected labels take no part (FeedbackQuerySet.effective).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from django.db.models import Count, Q, QuerySet

from apps.buffer.models import Experience
from apps.feedback.kinds import kind_get, kind_names
from apps.feedback.kinds.ranking import RankingValue
from apps.feedback.kinds.rating import RatingValue
from apps.feedback.models import Feedback
from apps.runs.models import Run
from kernel.exceptions import InvalidInput

# Votes on [0, 1] this far apart disagree: two points on the 1..5 scale, thumbs up and down.
RATING_GAP = 0.5
REVIEW_STATES = tuple(Feedback.Review.values)
_TRAINED = (Experience.Status.LEASED, Experience.Status.CONSUMED)
_PAGE = 100
# The review page's labels a page (114 labels on one page were 9,248 px tall on a phone).
REVIEW_PAGE_SIZE = 20
# The longest text search kept.
SEARCH_MAX = 200


@dataclass(frozen=True)
class LabelConflict:
    first: int  # feedback ids, the older first
    second: int
    why: str


@dataclass
class Disagreement:
    """The conflicting labels of one item (a group: one prompt's completions)."""

    group_id: str
    prompt: str
    labels: list[Feedback]
    conflicts: list[LabelConflict]
    # The completions the conflicts are about, for the owner's own label.
    experiences: list[Experience] = field(default_factory=list)
    # (A, B) pairs a choice is in conflict over, for the owner's own choice.
    pairs: list[tuple[int, int]] = field(default_factory=list)
    trained: bool = False


@dataclass
class ReviewRow:
    feedback: Feedback
    # Its group was trained on (or it came late): a rejection leaves the reward already taught.
    trained: bool
    disagreement: bool
    # A correction's own text (its expert experience; issue 64 item 3: the reviewer saw only the
    # original answer), None for a label that writes none.
    correction: str | None = None


def who(fb: Feedback) -> str:
    """Who gave it, as the page names them."""
    if fb.author_id is not None and fb.author is not None:
        return fb.author.get_username()
    if fb.api_key_id is not None and fb.api_key is not None:
        return f"key {fb.api_key.name}"
    return "someone"


def _who_key(fb: Feedback) -> tuple[str, int | None]:
    return ("user", fb.author_id) if fb.author_id is not None else ("key", fb.api_key_id)


def _said(fb: Feedback, exp_id: int, score: float) -> str:
    value = fb.parsed
    if isinstance(value, RatingValue):
        return f"{value.score}/5" if value.score is not None else f"thumb {value.thumb}"
    if isinstance(value, RankingValue) and exp_id in value.order:
        place = value.order.index(exp_id) + 1
        return f"ranked {place} of {len(value.order)}"
    return f"{score:.2f}"


def _votes(fb: Feedback) -> dict[int, float]:
    kind = kind_get(fb.kind)
    return {exp: score for exp, score, _ in kind.votes(fb)} if kind.folds else {}


def _claims(fb: Feedback, exps: Mapping[int, Experience]) -> set[tuple[int, int]]:
    kind = kind_get(fb.kind)
    if kind.pairs_by_fold:
        return set()
    return {(p.chosen_id, p.rejected_id) for p in kind.pairs(fb, exps, trust=1.0)}


def conflicts_among(rows: Sequence[Feedback], exps: Mapping[int, Experience]) -> list[LabelConflict]:
    """Every conflicting pair of `rows` (labels of one group, by different people)."""
    votes = {fb.pk: _votes(fb) for fb in rows}
    claims = {fb.pk: _claims(fb, exps) for fb in rows}
    chooses = {fb.pk: not kind_get(fb.kind).folds for fb in rows}
    out: list[LabelConflict] = []
    ordered = sorted(rows, key=lambda f: (f.created_at, f.pk))
    for i, a in enumerate(ordered):
        for b in ordered[i + 1:]:
            if _who_key(a) == _who_key(b):
                continue
            reasons = []
            for exp in sorted(votes[a.pk].keys() & votes[b.pk].keys()):
                sa, sb = votes[a.pk][exp], votes[b.pk][exp]
                if abs(sa - sb) >= RATING_GAP:
                    reasons.append(f"#{exp}: {who(a)} {_said(a, exp, sa)}, {who(b)} {_said(b, exp, sb)}")
            if chooses[a.pk] or chooses[b.pk]:
                for x, y in sorted(claims[a.pk]):
                    if (y, x) in claims[b.pk]:
                        reasons.append(f"{who(a)} prefers #{x} to #{y}, {who(b)} #{y} to #{x}")
            if reasons:
                out.append(LabelConflict(first=a.pk, second=b.pk, why="; ".join(reasons[:3])))
    return out


def _open(conflict: LabelConflict, states: Mapping[int, str]) -> bool:
    return not (states[conflict.first] == states[conflict.second] == Feedback.Review.ACCEPTED)


def _label_rows(run: Run, *, group_ids: Iterable[str] | None = None) -> list[Feedback]:
    qs = Feedback.objects.effective().filter(run=run, kind__in=kind_names(labels=True, reviewable=True))
    if group_ids is not None:
        qs = qs.filter(group_id__in=list(group_ids))
    return list(qs.select_related("author", "api_key").order_by("created_at", "id"))


def _experiences(run: Run, ids: Iterable[int]) -> dict[int, Experience]:
    return {e.pk: e for e in Experience.objects.filter(run=run, pk__in=set(ids)).only(
        "pk", "group_id", "prompt_text", "response_text", "status")}


def disagreements(*, run: Run, group_id: str | None = None) -> list[Disagreement]:
    """The run's open disagreements (module docstring), the one with the newest label first."""
    rows = _label_rows(run, group_ids=[group_id] if group_id is not None else None)
    by_group: dict[str, list[Feedback]] = defaultdict(list)
    for fb in rows:
        by_group[fb.group_id].append(fb)
    by_group = {g: fbs for g, fbs in by_group.items() if len({_who_key(f) for f in fbs}) > 1}
    wanted: set[int] = set()
    for fbs in by_group.values():
        for fb in fbs:
            wanted.update(kind_get(fb.kind).pair_ids(fb))
    exps = _experiences(run, wanted)
    trained_groups = set(Experience.objects.filter(run=run, group_id__in=list(by_group), is_expert=False,
                                                   status__in=_TRAINED).values_list("group_id", flat=True))
    found: list[Disagreement] = []
    for gid, fbs in by_group.items():
        states = {f.pk: f.review for f in fbs}
        conflicts = [c for c in conflicts_among(fbs, exps) if _open(c, states)]
        if not conflicts:
            continue
        involved = {c.first for c in conflicts} | {c.second for c in conflicts}
        labels = [f for f in fbs if f.pk in involved]
        about: set[int] = set()
        pairs: set[tuple[int, int]] = set()
        for f in labels:
            about.update(kind_get(f.kind).targets(f))
        for c in conflicts:
            a = next(f for f in labels if f.pk == c.first)
            b = next(f for f in labels if f.pk == c.second)
            for x, y in _claims(a, exps) | _claims(b, exps):
                if (y, x) in _claims(a, exps) | _claims(b, exps):
                    pairs.add((min(x, y), max(x, y)))
        members = [exps[i] for i in sorted(about) if i in exps and exps[i].group_id == gid]
        prompt = members[0].prompt_text if members else ""
        found.append(Disagreement(group_id=gid, prompt=prompt, labels=labels, conflicts=conflicts,
                                  experiences=members, pairs=sorted(pairs),
                                  trained=gid in trained_groups or any(f.late for f in labels)))
    found.sort(key=lambda d: max(f.created_at for f in d.labels), reverse=True)
    return found


@dataclass(frozen=True)
class ReviewFilters:
    kind: str = ""
    person: str = ""
    status: str = ""
    disagreements: bool = False
    # Text search: the label's comment, or the prompt or completion it is about (any case).
    q: str = ""
    # The page of the list (REVIEW_PAGE_SIZE labels a page), from 1.
    page: int = 1

    def query(self, **changes: object) -> dict[str, str]:
        """The filters as query parameters (a page's links, a form's hidden fields); `changes`
        replace some (page=2)."""
        values = {"kind": self.kind, "person": self.person, "status": self.status,
                  "disagreements": self.disagreements, "q": self.q, "page": self.page, **changes}
        out = {k: ("1" if v is True else str(v)) for k, v in values.items() if v not in ("", False, None)}
        if out.get("page") == "1":
            del out["page"]
        return out


def review_filters_parse(params: Mapping[str, object]) -> ReviewFilters:
    """The page's and the API's filters; a bad one is an InvalidInput naming it."""
    kind = str(params.get("kind") or "").strip()
    if kind and kind not in kind_names(reviewable=True):
        raise InvalidInput(f"{kind[:40]!r} is not a kind of label; one of {', '.join(kind_names(reviewable=True))}",
                           field="kind")
    status = str(params.get("status") or "").strip()
    if status and status not in REVIEW_STATES:
        raise InvalidInput(f"{status[:40]!r} is not a review state; one of {', '.join(REVIEW_STATES)}", field="status")
    person = str(params.get("person") or "").strip()[:150]
    if "\x00" in person:
        raise InvalidInput("a person's name holds no NUL character", field="person")
    flag = str(params.get("disagreements") or "").strip().lower()
    q = str(params.get("q") or "").strip()[:SEARCH_MAX]
    raw_page = str(params.get("page") or "").strip()
    if raw_page and not (raw_page.isdigit() and len(raw_page) < 7 and int(raw_page) >= 1):
        raise InvalidInput(f"{raw_page[:20]!r} is not a page number (1, 2, …)", field="page")
    return ReviewFilters(kind=kind, person=person, status=status, disagreements=flag in ("1", "true", "on", "yes"),
                         q=q, page=int(raw_page or 1))


def _reviewable(run: Run, filters: ReviewFilters, disputed: set[int]) -> QuerySet[Feedback]:
    qs = Feedback.objects.filter(run=run, kind__in=kind_names(reviewable=True))
    if filters.kind:
        qs = qs.filter(kind=filters.kind)
    if filters.person:
        qs = qs.filter(Q(author__username=filters.person) | Q(api_key__name=filters.person.removeprefix("key ")))
    if filters.status:
        qs = qs.filter(review=filters.status)
    if filters.disagreements:
        qs = qs.filter(pk__in=disputed)
    if filters.q:
        qs = qs.filter(Q(comment__icontains=filters.q) | Q(experience__prompt_text__icontains=filters.q)
                       | Q(experience__response_text__icontains=filters.q))
    return qs


def review_rows_count(*, run: Run, filters: ReviewFilters, open_disagreements: Sequence[Disagreement]) -> int:
    """How many labels match `filters` on every page."""
    return _reviewable(run, filters, {f.pk for d in open_disagreements for f in d.labels}).count()


def review_rows(*, run: Run, filters: ReviewFilters, limit: int = _PAGE, offset: int = 0,
                open_disagreements: Sequence[Disagreement] | None = None) -> list[ReviewRow]:
    """The run's reviewable feedback, newest first, as filtered (`limit` of them from
    `offset`), each with whether its group was trained on and whether it is part of an open
    disagreement."""
    found = disagreements(run=run) if open_disagreements is None else open_disagreements
    disputed = {f.pk for d in found for f in d.labels}
    qs = _reviewable(run, filters, disputed)
    rows = list(qs.select_related("author", "api_key", "reviewed_by", "experience", "other")
                .order_by("-created_at", "-id")[offset:offset + limit])
    trained = set(Experience.objects.filter(run=run, group_id__in={f.group_id for f in rows}, is_expert=False,
                                            status__in=_TRAINED).values_list("group_id", flat=True))
    corrections = corrections_of(run=run, rows=rows)
    return [ReviewRow(feedback=f, trained=f.late or f.group_id in trained, disagreement=f.pk in disputed,
                      correction=corrections.get(f.pk)) for f in rows]


def corrections_of(*, run: Run, rows: Sequence[Feedback]) -> dict[int, str]:
    """The corrected text of each row that wrote an expert experience (a kind whose labels reach
    training as one: an edit), by feedback id, in one read."""
    experts = {f.pk: ids[0] for f in rows
               if kind_get(f.kind).reaches_training() == "expert" and (ids := kind_get(f.kind).trained_ids(f))}
    texts = dict(Experience.objects.filter(run=run, is_expert=True, pk__in=set(experts.values()))
                 .values_list("pk", "response_text"))
    return {pk: texts[expert] for pk, expert in experts.items() if expert in texts}


def review_people(*, run: Run) -> list[str]:
    """Who gave the run's reviewable feedback (the person filter's choices)."""
    names = set(Feedback.objects.filter(run=run, kind__in=kind_names(reviewable=True), author__isnull=False)
                .values_list("author__username", flat=True))
    keys = set(Feedback.objects.filter(run=run, kind__in=kind_names(reviewable=True), api_key__isnull=False)
               .values_list("api_key__name", flat=True))
    return sorted(names) + sorted(f"key {k}" for k in keys)


def review_counts(*, run: Run) -> dict[str, int]:
    """Labels by review state."""
    counts = dict.fromkeys(REVIEW_STATES, 0)
    for row in (Feedback.objects.filter(run=run, kind__in=kind_names(reviewable=True)).order_by()
                .values("review").annotate(n=Count("id"))):
        counts[row["review"]] = row["n"]
    return counts
