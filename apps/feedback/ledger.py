"""The ledger of labels: where every label people gave ended up, derived from the buffer.

A label is a feedback row of a kind that labels (rating, ranking, A/B choice, correction:
`kind_names(labels=True)`). Each is in exactly one state, the first of these that holds:

1. unused, rejected: the run's owner rejected it on the review page;
2. trained: the policy trained on it: the experiences that carry it (its targets; a
   correction's expert experience) were in a train batch, step N (`Experience.trained_step`),
   after it was saved (not late), and the run's algorithm takes it (see 4); it is in
   version V, the first published at or after step N;
3. reward model: the policy did not train on it, but the run's reward model learned from it:
   version V, the first whose data was read (its publication less its training time) after
   the label was saved;
4. unused, algorithm: the run never trains on this kind of label: the feedback mode is auto
   (no label moves a reward), the algorithm trains no rollouts (SFT), trains on no pairs (an
   A/B choice outside DPO) or on no expert experiences (a correction outside SFT and MIX);
5. unused, late: it came after its group was trained;
6. unused, filtered: a filter dropped its group (the reason is the row's filter_reason);
7. unused, run ended: the run ended before its group trained;
8. pending: its group waits for labels, is in the queue for training, or is being trained.

Counted per run and per person from the same states, so no label is counted twice. A read:
no writes. Its own module so that whatever restructures the feedback app keeps one ledger.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from apps.buffer.models import Experience
from apps.feedback.kinds import FeedbackKind, kind_get, kind_names
from apps.feedback.models import Feedback
from apps.rewards.models import RewardModel
from kernel.algorithms import algorithm_get
from apps.runs.models import ModelVersion, Run

State = Literal["trained", "reward_model", "pending", "unused"]
STATES: tuple[State, ...] = ("trained", "reward_model", "pending", "unused")
# Why a label is unused, and why one is pending, in the order pages list them.
UNUSED_REASONS = ("rejected", "algorithm", "late", "filtered", "run_ended")
PENDING_REASONS = ("waiting", "queued", "training")
STATE_WORDS = {"trained": "trained", "reward_model": "taught the reward model", "pending": "pending",
               "unused": "unused"}
REASON_WORDS = {
    "rejected": "rejected in review",
    "algorithm": "this run does not train on that kind of label",
    "late": "came after its group was trained",
    "filtered": "a filter dropped its group",
    "run_ended": "the run ended before its group trained",
    "waiting": "its group waits for labels",
    "queued": "in the queue for training",
    "training": "in a batch being trained",
}
ENDED = (Run.Status.FINISHED, Run.Status.FAILED, Run.Status.STOPPED)


@dataclass(frozen=True)
class LabelState:
    """Where one label stands: `state`, `reason` (why unused or pending; "" otherwise), the
    train step and version that trained it, or the reward-model version it taught, and the
    whole of it in words (`text`)."""

    state: State
    reason: str = ""
    step: int | None = None
    version: int | None = None
    text: str = ""

    def as_dict(self) -> dict[str, object]:
        return {"state": self.state, "reason": self.reason, "step": self.step, "version": self.version,
                "text": self.text}


@dataclass
class LedgerCounts:
    """How many labels are in each state, and the unused and pending ones by reason."""

    trained: int = 0
    reward_model: int = 0
    pending: int = 0
    unused: int = 0
    unused_by: dict[str, int] = field(default_factory=dict)
    pending_by: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.trained + self.reward_model + self.pending + self.unused

    def add(self, state: LabelState) -> None:
        setattr(self, state.state, getattr(self, state.state) + 1)
        by = self.unused_by if state.state == "unused" else self.pending_by if state.state == "pending" else None
        if by is not None:
            by[state.reason] = by.get(state.reason, 0) + 1

    def unused_reasons(self) -> list[tuple[str, str, int]]:
        """(reason, words, count) of the unused labels, in the pages' order."""
        return [(r, REASON_WORDS[r], self.unused_by[r]) for r in UNUSED_REASONS if self.unused_by.get(r)]

    def as_dict(self) -> dict[str, object]:
        return {"total": self.total, "trained": self.trained, "reward_model": self.reward_model,
                "pending": self.pending, "unused": self.unused,
                "unused_by": {r: self.unused_by.get(r, 0) for r in UNUSED_REASONS},
                "pending_by": {r: self.pending_by.get(r, 0) for r in PENDING_REASONS}}


@dataclass
class RunLedger:
    """The run's labels by state, in all (`run`) and per person (by who gave them)."""

    run: LedgerCounts
    people: dict[str, LedgerCounts]

    def as_dict(self) -> dict[str, object]:
        return {"run": self.run.as_dict(), "people": {who: c.as_dict() for who, c in self.people.items()}}


@dataclass(frozen=True)
class _Target:
    status: str
    trained_step: int | None
    trained: bool
    filter_reason: str


def _algorithm_refusal(run: Run, kind: FeedbackKind) -> str | None:
    """Why the run's policy never trains on labels of `kind` (None: it may)."""
    cfg = run.cfg
    algorithm = algorithm_get(cfg.algorithm)
    plan = algorithm.batch_plan(cfg)
    reaches = kind.reaches_training()
    many = kind.noun(2)
    if reaches == "expert":
        if plan.expert > 0:
            return None
        return f"{cfg.algorithm} does not train on {many}: they count in an SFT or MIX run, or an export (sft.jsonl)"
    if plan.usual == 0:
        return f"{cfg.algorithm} trains on corrections only, not on {many}"
    if reaches == "preference":
        if algorithm.preference_pairs:
            return None
        return f"{cfg.algorithm} does not train on {many}: DPO does (and a reward model learns from them)"
    if reaches == "reward":
        if cfg.feedback.mode == "auto":
            return f"feedback mode auto: {many} move no reward"
        return None
    return f"no algorithm trains on {many}"


def kind_refusal(*, run: Run, kind_name: str) -> str | None:
    """Why the run's policy never trains on labels of this kind, in words (None: it may):
    what a correction says when it is saved, and the API's and CLI's effect."""
    kind = kind_get(kind_name)
    return _algorithm_refusal(run, kind) if kind.labels else None


def correction_saved_words(*, run: Run, expert: Experience) -> str:
    """What a saved correction says: the expert experience it wrote and whether this run
    trains on it, else where it will count (never "saved as expert experience" alone)."""
    refusal = kind_refusal(run=run, kind_name="edit")
    if refusal is None:
        return f"Saved as expert experience #{expert.pk}: this run's {run.cfg.algorithm} batches train on it"
    return f"Saved as expert experience #{expert.pk}, not trained by this run: {refusal}"


def _version_after(versions: Sequence[tuple[int, int]], step: int) -> int | None:
    """The first published version (number, train step) at or after `step`."""
    for number, train_step in versions:
        if train_step >= step:
            return number
    return None


def _rm_taught(reads: Sequence[tuple[int, datetime]], saved: datetime) -> int | None:
    """The first reward-model version whose data was read after `saved`."""
    for version, read_at in reads:
        if read_at >= saved:
            return version
    return None


class _Ledger:
    """What a run's ledger reads once: its versions, reward-model versions and the targets."""

    def __init__(self, run: Run, rows: Sequence[Feedback]) -> None:
        self.run = run
        self.ended = run.status in ENDED
        self.refusals: dict[str, str | None] = {}
        self.versions: list[tuple[int, int]] = []
        self.rm_reads: list[tuple[int, datetime]] = []
        self.targets: dict[int, _Target] = {}
        if rows:  # no labels, nothing more to read (the pages' query budgets)
            self._read(rows)

    def _read(self, rows: Sequence[Feedback]) -> None:
        run = self.run
        self.versions = list(ModelVersion.objects.filter(run=run, number__gt=0).order_by("train_step", "number")
                             .values_list("number", "train_step"))
        self.rm_reads = [(v, created - timedelta(seconds=seconds)) for v, created, seconds in
                         RewardModel.objects.filter(run=run).order_by("version")
                         .values_list("version", "created_at", "seconds")]
        ids = {pk for fb in rows for pk in kind_get(fb.kind).trained_ids(fb)}
        self.targets = {
            pk: _Target(status=status, trained_step=step, trained=step is not None or used > 0, filter_reason=why)
            for pk, status, step, used, why in Experience.objects.filter(pk__in=ids).values_list(
                "pk", "status", "trained_step", "use_count", "filter_reason")
        }

    def refusal(self, kind: FeedbackKind) -> str | None:
        if kind.name not in self.refusals:
            self.refusals[kind.name] = _algorithm_refusal(self.run, kind)
        return self.refusals[kind.name]

    def state(self, fb: Feedback) -> LabelState:
        if fb.review == Feedback.Review.REJECTED:
            return _unused("rejected")
        kind = kind_get(fb.kind)
        targets = [t for pk in kind.trained_ids(fb) if (t := self.targets.get(pk)) is not None]
        refusal = self.refusal(kind)
        trained = [t for t in targets if t.trained]
        # A pair trains only with both of its experiences in the batch; the rest with any.
        whole = kind.reaches_training() == "preference"
        # A correction writes a new expert experience: however late the original, it is not.
        late = fb.late and kind.reaches_training() != "expert"
        if refusal is None and not late and trained and (len(trained) == len(targets) or not whole):
            steps = [t.trained_step for t in trained if t.trained_step is not None]
            if not steps:
                return LabelState("trained", text="trained (its step was not recorded)")
            step = max(steps) if whole else min(steps)
            version = _version_after(self.versions, step)
            where = f"in v{version}" if version is not None else "in no published version yet"
            return LabelState("trained", step=step, version=version, text=f"trained in step {step}, {where}")
        taught = _rm_taught(self.rm_reads, fb.created_at) if kind.labels else None
        if taught is not None:
            return LabelState("reward_model", version=taught, text=f"taught the reward model v{taught}")
        if refusal is not None:
            return _unused("algorithm", refusal)
        if late or trained:
            return _unused("late")
        if not targets:
            return _unused("filtered", "its experiences were removed")
        filtered = [t for t in targets if t.status == Experience.Status.FILTERED]
        if filtered:
            why = filtered[0].filter_reason
            return _unused("filtered", f"a filter dropped its group ({why})" if why else "")
        if self.ended:
            return _unused("run_ended")
        statuses = {t.status for t in targets}
        reason = ("training" if Experience.Status.LEASED in statuses
                  else "waiting" if Experience.Status.PENDING in statuses else "queued")
        return LabelState("pending", reason=reason, text=f"pending: {REASON_WORDS[reason]}")


def _unused(reason: str, words: str = "") -> LabelState:
    return LabelState("unused", reason=reason, text=f"unused: {words or REASON_WORDS[reason]}")


def _labels(run: Run, author_id: int | None = None) -> list[Feedback]:
    rows = Feedback.objects.filter(run=run, kind__in=kind_names(labels=True))
    if author_id is not None:
        rows = rows.filter(author_id=author_id)
    return list(rows.select_related("author", "api_key").order_by("id"))


def who_gave(fb: Feedback) -> str:
    """Who gave a label, as the pages name them: the person, else the API key."""
    if fb.author is not None:
        return fb.author.get_username()
    if fb.api_key is not None:
        return f"API key “{fb.api_key.name}”"
    return "someone"


def label_states(*, run: Run, feedback: Iterable[Feedback] | None = None) -> dict[int, LabelState]:
    """Each label's state by feedback id (the run's labels, or those given; rows of other
    kinds are left out)."""
    labels = set(kind_names(labels=True))
    rows = _labels(run) if feedback is None else [fb for fb in feedback if fb.kind in labels]
    ledger = _Ledger(run, rows)
    return {fb.pk: ledger.state(fb) for fb in rows}


def label_state(*, feedback: Feedback) -> LabelState | None:
    """One label's state; None for feedback that is not a label (a flag, an env reward)."""
    return label_states(run=feedback.run, feedback=[feedback]).get(feedback.pk)


def run_ledger(*, run: Run) -> RunLedger:
    """The run's labels by state, in all and per person (the most labels first)."""
    rows = _labels(run)
    ledger = _Ledger(run, rows)
    total = LedgerCounts()
    people: dict[str, LedgerCounts] = {}
    for fb in rows:
        state = ledger.state(fb)
        total.add(state)
        people.setdefault(who_gave(fb), LedgerCounts()).add(state)
    ordered = dict(sorted(people.items(), key=lambda kv: (-kv[1].total, kv[0])))
    return RunLedger(run=total, people=ordered)
