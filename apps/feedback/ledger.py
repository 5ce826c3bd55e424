"""The ledger of labels: where every label people gave ended up, derived from the buffer.

A label is a feedback row of a kind that labels (rating, ranking, A/B choice, correction:
`kind_names(labels=True)`). Each is in exactly one state, the first of these that holds:

1. unused, rejected: the run's owner rejected it on the review page;
2. trained: the policy trained on it: the experiences that carry it (its targets; a
   correction's expert experience) were in a train batch, step N (`Experience.trained_step`),
   after it was saved (not late), and the run's algorithm takes it (see 4); it is in
   version V, the first published at or after step N;
3. reward model: the policy did not train on it, but the run's reward model learned from it:
   version V, the first whose training pairs came from it (RewardModel.trained_on, recorded
   when the version was published from PreferencePair.feedback_ids, and kept per label in
   LabelTaught; not a timestamp);
4. pending: the policy may still train on it: its group waits for labels, is in the queue
   for training, or is being trained (and the run has not ended). A label that made no
   pair is pending here too: its group is open, and a rating made later may pair it. And a
   label the policy will not train on (6-9 hold) that no reward-model version has read yet, in
   a running run with a reward model: the next version reads it (every version trains on all
   the run's labels), so it may still teach it;
5. unused, because it made no preference pair: the policy will not train on it (4 does not
   hold) and the newest reward-model version that read it recorded why it taught nothing
   (RewardModel.held_out, unpaired; LabelTaught.reason): heldout (its pairs were held out
   to measure the version), lone (a rating whose member no other rated member of its group could be
   compared with), gold (a gold item: it measures raters), untrusted (its rater's weight was
   below the trust threshold, apps.feedback.raters.reliability.TRUSTED_WEIGHT), no pair (it states
   no preference: a tie, a correction that changed nothing). The reward model's reason goes
   before the policy's (6-9): it says what the label would have needed to teach anything;
6. unused, algorithm: the run never trains on this kind of label: the feedback mode is auto
   (no label moves a reward), the algorithm trains no rollouts (SFT), trains on no pairs (an
   A/B choice outside DPO) or on no expert experiences (a correction outside SFT and MIX);
7. unused, late: it came after its group was trained;
8. unused, filtered: a filter dropped its group (the reason is the row's filter_reason);
9. unused, run ended: the run ended before its group trained.

A label no reward-model version read yet has no reason of 5: in a running run with a reward
model it is pending for the next version (4), else its policy reason (6-9) stands; versions
published before they recorded their labels (RewardModel.trained_on empty) taught nothing the
ledger can show, and the next version records every label again (each version trains on all
the run's pairs).

Counted per run and per person from the same states, so no label is counted twice. A read:
no writes. Its own module so that whatever restructures the feedback app keeps one ledger.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import connection
from django.db.models import Field

from apps.buffer.models import Experience
from apps.feedback.kinds import FeedbackKind, kind_get, kind_names
from apps.feedback.models import Feedback, LabelTaught
from kernel.algorithms import algorithm_get, algorithms
from apps.runs.models import ModelVersion, Run

State = Literal["trained", "reward_model", "pending", "unused"]
STATES: tuple[State, ...] = ("trained", "reward_model", "pending", "unused")
# Why a label made no preference pair, as a reward-model version records it (RewardModel.held_out:
# "heldout"; RewardModel.unpaired: apps.feedback.reward_model.preferences.UNPAIRED_REASONS).
PAIR_REASONS = ("heldout", "lone", "gold", "untrusted", "no_pair")
# Why a label is unused, and why one is pending, in the order pages list them.
UNUSED_REASONS = ("rejected", *PAIR_REASONS, "algorithm", "late", "filtered", "run_ended")
PENDING_REASONS = ("waiting", "queued", "training", "reward_model_next")
STATE_WORDS = {"trained": "trained", "reward_model": "taught the reward model", "pending": "pending",
               "unused": "unused"}
# The states as every place that counts them shows them (the annotation header, the run page,
# the summary, the notification, the API's `states`, the CLI): in this order, each count followed
# by these words, the counts summing to the total shown beside them (issue 64 item 1: the
# annotation header's line left "taught the reward model only" out). One list: a state added
# here (ledger_state_add) is shown, in its place, by all of them.
STATE_LINE: list[tuple[str, str]] = [
    ("trained", "trained"), ("reward_model", "taught the reward model only"), ("pending", "pending"),
    ("unused", "unused")]


def ledger_state_add(*, state: str, words: str) -> None:
    """Show one more state after the label states, everywhere they are shown (a module that
    counts something a person gave that is no label, e.g. a blind evaluation's votes, registers
    it once and puts its counts in LedgerCounts.more). Idempotent."""
    if state not in {name for name, _ in STATE_LINE}:
        STATE_LINE.append((state, words))
REASON_WORDS = {
    "rejected": "rejected in review",
    "heldout": "held out to measure the reward model, which did not train on it",
    "lone": "no other rated answer in its group to compare it with, so it made no preference pair",
    "gold": "a gold item: it measures raters and teaches the reward model nothing",
    "untrusted": "its rater's weight was below the trust threshold, so the reward model left it out",
    "no_pair": "it states no preference (a tie, or a correction that changed nothing)",
    "algorithm": "this run does not train on that kind of label",
    "late": "came after its group was trained",
    "filtered": "a filter dropped its group",
    "run_ended": "the run ended before its group trained",
    "waiting": "its group waits for labels",
    "queued": "in the queue for training",
    "training": "in a batch being trained",
    "reward_model_next": "the reward model's next version reads it (the policy will not train on it)",
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
    # The counts of the states added to STATE_LINE (ledger_state_add), by state.
    more: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.trained + self.reward_model + self.pending + self.unused + sum(self.more.values())

    def count(self, state: str) -> int:
        """How many are in `state` (a label state, or one added to STATE_LINE)."""
        return int(getattr(self, state)) if state in STATES else self.more.get(state, 0)

    def add(self, state: LabelState, n: int = 1) -> None:
        """Count `n` labels in `state`."""
        setattr(self, state.state, getattr(self, state.state) + n)
        by = self.unused_by if state.state == "unused" else self.pending_by if state.state == "pending" else None
        if by is not None:
            by[state.reason] = by.get(state.reason, 0) + n

    def states(self) -> list[tuple[str, str, int]]:
        """(state, words, count) of every state, in STATE_LINE's order (zeros too): what each
        place shows, summing to `total`."""
        return [(state, words, self.count(state)) for state, words in STATE_LINE]

    def line(self, sep: str = ", ") -> str:
        """The states in words, as the CLI and the notification write them: "3 trained, 0 taught
        the reward model only, 1 pending, 2 unused"."""
        return sep.join(f"{n} {words}" for _, words, n in self.states())

    def unused_reasons(self) -> list[tuple[str, str, int]]:
        """(reason, words, count) of the unused labels, in the pages' order."""
        return [(r, REASON_WORDS[r], self.unused_by[r]) for r in UNUSED_REASONS if self.unused_by.get(r)]

    def pending_reasons(self) -> list[tuple[str, str, int]]:
        """(reason, words, count) of the pending labels, in the pages' order."""
        return [(r, REASON_WORDS[r], self.pending_by[r]) for r in PENDING_REASONS if self.pending_by.get(r)]

    def as_dict(self) -> dict[str, object]:
        return {"total": self.total, "trained": self.trained, "reward_model": self.reward_model,
                "pending": self.pending, "unused": self.unused,
                "states": [{"state": state, "words": words, "count": n} for state, words, n in self.states()],
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
        # Named from the registry (each algorithm declares preference_pairs), not a fixed name.
        pairs = " or ".join(a.name for a in algorithms() if a.preference_pairs) or "no algorithm"
        return f"{cfg.algorithm} does not train on {many}: {pairs} does (and a reward model learns from them)"
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


def _rm_labels(ids: list[int]) -> dict[int, tuple[int | None, str]]:
    """Label id -> (the first reward-model version that trained on it, else None; the newest
    version's reason it made no pair, else ""), as the versions recorded it (LabelTaught):
    one statement. The counts read the same rows (`_SHAPES_SQL`)."""
    return {pk: (taught, reason) for pk, taught, reason in
            LabelTaught.objects.filter(feedback_id__in=ids).values_list("feedback_id", "taught", "reason")}


class _Ledger:
    """What a run's ledger reads once: its versions, reward-model versions and the targets."""

    def __init__(self, run: Run, rows: Sequence[Feedback]) -> None:
        self.run = run
        self.ended = run.status in ENDED
        self.rm_next = rm_reads_next(run)
        self.refusals: dict[str, str | None] = {}
        self._versions: list[tuple[int, int]] | None = None
        self.rm_labels: dict[int, tuple[int | None, str]] = {}
        self.targets: dict[int, _Target] = {}
        if rows:  # no labels, nothing more to read (the pages' query budgets)
            self._read(rows)

    def _read(self, rows: Sequence[Feedback]) -> None:
        self.rm_labels = _rm_labels([fb.pk for fb in rows])
        ids = {pk for fb in rows for pk in kind_get(fb.kind).trained_ids(fb)}
        self.targets = {
            pk: _Target(status=status, trained_step=step, trained=step is not None or used > 0, filter_reason=why)
            for pk, status, step, used, why in Experience.objects.filter(pk__in=ids).values_list(
                "pk", "status", "trained_step", "use_count", "filter_reason")
        }

    @property
    def versions(self) -> list[tuple[int, int]]:
        """The run's published versions (number, train step), read when a trained label asks
        which one it is in: the labels a card or "Your submissions" shows are rarely trained
        yet (tests/test_door_costs.py)."""
        if self._versions is None:
            self._versions = list(ModelVersion.objects.filter(run=self.run, number__gt=0)
                                  .order_by("train_step", "number").values_list("number", "train_step"))
        return self._versions

    def refusal(self, kind: FeedbackKind) -> str | None:
        if kind.name not in self.refusals:
            self.refusals[kind.name] = _algorithm_refusal(self.run, kind)
        return self.refusals[kind.name]

    def state(self, fb: Feedback) -> LabelState:
        if fb.review == Feedback.Review.REJECTED:
            return _unused("rejected")
        kind = kind_get(fb.kind)
        targets = [t for pk in kind.trained_ids(fb) if (t := self.targets.get(pk)) is not None]
        trained = [t for t in targets if t.trained]
        filtered = [t for t in targets if t.status == Experience.Status.FILTERED]
        statuses = {t.status for t in targets}
        taught, rm_reason = self.rm_labels.get(fb.pk, (None, ""))
        refusal = self.refusal(kind)
        state, reason = _verdict(Shape(
            kind=kind, rejected=False, late=fb.late, taught=taught is not None, rm_reason=rm_reason,
            read=fb.pk in self.rm_labels, targets=len(targets),
            trained=len(trained), filtered=bool(filtered), leased=Experience.Status.LEASED in statuses,
            pending=Experience.Status.PENDING in statuses), refusal=refusal, ended=self.ended, rm_next=self.rm_next)
        if state == "trained":
            whole = kind.reaches_training() == "preference"
            steps = [t.trained_step for t in trained if t.trained_step is not None]
            if not steps:
                return LabelState("trained", text="trained (its step was not recorded)")
            step = max(steps) if whole else min(steps)
            version = _version_after(self.versions, step)
            where = f"in v{version}" if version is not None else "in no published version yet"
            return LabelState("trained", step=step, version=version, text=f"trained in step {step}, {where}")
        if state == "reward_model":
            return LabelState("reward_model", version=taught, text=f"taught the reward model v{taught}")
        if state == "pending":
            return LabelState("pending", reason=reason, text=f"pending: {REASON_WORDS[reason]}")
        if reason == "algorithm":
            return _unused(reason, refusal or "")
        if reason == "filtered" and not targets:
            return _unused(reason, "its experiences were removed")
        if reason == "filtered":
            why = filtered[0].filter_reason
            return _unused(reason, f"a filter dropped its group ({why})" if why else "")
        return _unused(reason)


@dataclass(frozen=True)
class Shape:
    """What decides a label's state: its kind, whether it was rejected, came late, taught a
    reward-model version (one trained on a pair from it), the newest version's reason it made
    no pair ("" for none recorded), whether any version read it (LabelTaught has its row), and
    its trained-on experiences (`trained_ids`: how many exist, how many were trained, whether any
    is filtered, leased or pending). The per-label reader
    (`_Ledger`) and the counts in SQL (`_shapes`) both derive it and hand it to `_verdict`."""

    kind: FeedbackKind
    rejected: bool
    late: bool
    taught: bool
    rm_reason: str
    read: bool
    targets: int
    trained: int
    filtered: bool
    leased: bool
    pending: bool


def rm_reads_next(run: Run) -> bool:
    """Whether a reward-model version may still read the run's labels: it has a reward model
    and has not ended (versions train while the run runs)."""
    return run.status not in ENDED and run.cfg.reward_model.enabled


def _verdict(shape: Shape, *, refusal: str | None, ended: bool, rm_next: bool) -> tuple[State, str]:
    """The label's state and reason, the first of the module's list that holds (`rm_next`:
    rm_reads_next of the run)."""
    if shape.rejected:
        return "unused", "rejected"
    kind = shape.kind
    # A pair trains only with both of its experiences in the batch; the rest with any.
    whole = kind.reaches_training() == "preference"
    # A correction writes a new expert experience: however late the original, it is not.
    late = shape.late and kind.reaches_training() != "expert"
    if refusal is None and not late and shape.trained and (shape.trained == shape.targets or not whole):
        return "trained", ""
    if shape.taught:
        return "reward_model", ""
    # Why the policy will not train on it (None: it still may, the label is pending).
    closed = ("algorithm" if refusal is not None else "late" if late or shape.trained
              else "filtered" if not shape.targets or shape.filtered else "run_ended" if ended else None)
    if closed is None:
        return "pending", ("training" if shape.leased else "waiting" if shape.pending else "queued")
    if rm_next and not shape.read:
        return "pending", "reward_model_next"
    return "unused", shape.rm_reason if shape.rm_reason in PAIR_REASONS else closed


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
    """The run's labels by state, in all and per person (the most labels first). Counted in
    the database (`_shapes`): one statement, whose rows are the distinct shapes of the run's
    labels per person, however many labels the run has (tests/test_door_costs.py)."""
    return _counted(run, _shapes(run))


def ledger_counts(*, run: Run, person: AbstractBaseUser | None = None) -> LedgerCounts:
    """The one count of label states (issue 64 item 1): the run's labels by state, or one
    person's (`person`: the labels they gave), from the same statement as run_ledger's."""
    if person is None:
        return run_ledger(run=run).run
    return _counted(run, _shapes(run, author_id=person.pk)).people.get(person.get_username(), LedgerCounts())


def _counted(run: Run, shapes: list[tuple[str, Shape, int]]) -> RunLedger:
    """The labels of `shapes` by state, in all and per person."""
    refusals: dict[str, str | None] = {}
    ended, rm_next = run.status in ENDED, rm_reads_next(run)
    total = LedgerCounts()
    people: dict[str, LedgerCounts] = {}
    for who, shape, n in shapes:
        kind = shape.kind
        if kind.name not in refusals:
            refusals[kind.name] = _algorithm_refusal(run, kind)
        state, reason = _verdict(shape, refusal=refusals[kind.name], ended=ended, rm_next=rm_next)
        counted = LabelState(state, reason=reason)
        mine = people.setdefault(who, LedgerCounts())
        total.add(counted, n)
        mine.add(counted, n)
    ordered = dict(sorted(people.items(), key=lambda kv: (-kv[1].total, kv[0])))
    return RunLedger(run=total, people=ordered)


# The run's labels grouped by who gave them and by what decides their state (`Shape`), with
# how many share each: the row's trained-on experiences are its experience and other, or the
# ids its value holds under the kind's `trained_key` (one id or a list).
_SHAPES_SQL = """
WITH label AS (
    SELECT f.id, f.kind, f.review, f.late, f.created_at, f.author_id, f.api_key_id, f.experience_id, f.other_id,
           f.value
    FROM {feedback} f WHERE f.run_id = %(run)s AND f.kind = ANY(%(kinds)s){author}
), target AS (
    SELECT id, experience_id AS eid FROM label WHERE kind = ANY(%(row_kinds)s) AND experience_id IS NOT NULL
    UNION ALL
    SELECT id, other_id FROM label WHERE kind = ANY(%(row_kinds)s) AND other_id IS NOT NULL
    UNION ALL
    SELECT l.id, x.v::bigint FROM label l
    JOIN unnest(%(key_kinds)s::text[], %(keys)s::text[]) AS k(kind, key) ON k.kind = l.kind
    CROSS JOIN LATERAL jsonb_array_elements_text(CASE jsonb_typeof(l.value -> k.key)
        WHEN 'array' THEN l.value -> k.key WHEN 'number' THEN jsonb_build_array(l.value -> k.key)
        ELSE '[]'::jsonb END) AS x(v)
), per_label AS (
    SELECT l.id, l.kind, l.review = %(rejected)s AS rejected, l.late, m.taught IS NOT NULL AS taught,
           COALESCE(m.reason, '') AS rm_reason, m.feedback_id IS NOT NULL AS read,
           l.author_id, l.api_key_id, count(e.id) AS n, count(e.id) FILTER (
               WHERE e.trained_step IS NOT NULL OR e.use_count > 0) AS n_trained,
           COALESCE(bool_or(e.status = %(filtered)s), false) AS filtered,
           COALESCE(bool_or(e.status = %(leased)s), false) AS leased,
           COALESCE(bool_or(e.status = %(pending)s), false) AS pending
    FROM label l LEFT JOIN target t ON t.id = l.id LEFT JOIN {experience} e ON e.id = t.eid
    LEFT JOIN {taught} m ON m.feedback_id = l.id
    GROUP BY l.id, l.kind, l.review, l.late, m.taught, m.reason, m.feedback_id, l.author_id, l.api_key_id
)
SELECT p.kind, p.rejected, p.late, p.taught, p.rm_reason, p.read, p.n, p.n_trained, p.filtered, p.leased, p.pending,
       u.{username}, k.name, count(*)
FROM per_label p LEFT JOIN {user} u ON u.id = p.author_id LEFT JOIN {api_key} k ON k.id = p.api_key_id
GROUP BY p.kind, p.rejected, p.late, p.taught, p.rm_reason, p.read, p.n, p.n_trained, p.filtered, p.leased, p.pending,
         u.{username}, k.name
"""


def _shapes(run: Run, author_id: int | None = None) -> list[tuple[str, Shape, int]]:
    """(who gave them, their shape, how many) for the run's labels (one person's, given
    `author_id`): one statement."""
    kinds = [kind_get(name) for name in kind_names(labels=True)]
    user = get_user_model()
    username = user._meta.get_field(user.USERNAME_FIELD)
    api_key = Feedback._meta.get_field("api_key").related_model
    assert isinstance(username, Field) and api_key is not None and not isinstance(api_key, str)
    sql = _SHAPES_SQL.format(
        taught=LabelTaught._meta.db_table, feedback=Feedback._meta.db_table, experience=Experience._meta.db_table,
        user=user._meta.db_table, username=username.column, api_key=api_key._meta.db_table,
        author="" if author_id is None else " AND f.author_id = %(author)s")
    params: dict[str, int | str | list[str]] = {
        "run": run.pk, "kinds": [k.name for k in kinds], "row_kinds": [k.name for k in kinds if not k.trained_key],
        "key_kinds": [k.name for k in kinds if k.trained_key], "keys": [k.trained_key for k in kinds if k.trained_key],
        "rejected": Feedback.Review.REJECTED, "filtered": Experience.Status.FILTERED,
        "leased": Experience.Status.LEASED, "pending": Experience.Status.PENDING,
    }
    if author_id is not None:
        params["author"] = author_id
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    by_name = {k.name: k for k in kinds}
    return [(_who(username, key_name), Shape(kind=by_name[kind], rejected=rejected, late=late, taught=taught,
                                               rm_reason=rm_reason, read=read, targets=n, trained=n_trained,
                                               filtered=filtered, leased=leased, pending=pending), count)
            for (kind, rejected, late, taught, rm_reason, read, n, n_trained, filtered, leased, pending, username,
                 key_name, count) in rows]


def _who(username: str | None, key_name: str | None) -> str:
    """`who_gave`'s words from the giver's username and API key name."""
    if username is not None:
        return username
    if key_name is not None:
        return f"API key “{key_name}”"
    return "someone"
