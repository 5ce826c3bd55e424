"""Kinds of feedback as the rest of the app knows them: each declared once, in one module.

A kind is registered here by name with everything the rest of the loop must know of it —
its value as a typed model (validated in its constructor; `stored()` is the JSON row's
`value`, `Feedback.parsed` reads it back), what it targets (one experience, a pair of one
group, a whole group), whether and how it folds into a member's human reward, which
preference pairs it yields for the reward model, whether it may be revised, and how the
environment API (`apps.envapi.schemas.FeedbackIn`, `api.feedback_create`) and `rft feedback`
take it. Its service (`kind_service`) lives in `apps.feedback.services` for the built-in
kinds, or in the kind's own module, storing through the shared `services.feedback_store`.
Nothing else compares kind names to decide behaviour (queries for one kind's rows, such as
the DPO export's comparisons or the pipeline's flag filter, name the kind they read).

Adding one: a module here (see `rating.py`) listed in `_REGISTRY`'s built-ins, and a `Feedback.Kind`
choice (with its choices-only migration) so the admin and the counts list it;
tests/feedback/test_kind_registry.py registers one from a single test module.

The folding math stays in the kernel (`kernel.feedback_policy`, which cannot import this
app): registering a kind that folds hands the kernel its signal source.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar

from apps.rewards.pairs import PreferencePair
from kernel.feedback_policy import Signal, signal_source_register, signal_source_unregister
from kernel.jsontypes import Body
from kernel.registry import Registry

if TYPE_CHECKING:
    from apps.buffer.models import Experience
    from apps.feedback.models import Feedback

Target = Literal["experience", "pair", "group"]
V = TypeVar("V", bound="KindValue")
Winner = Literal["a", "b", "tie"]


class FeedbackPayload(Protocol):
    """What the kinds read of the environment API's FeedbackIn (apps.envapi.schemas, above
    this app): `api_check` may normalise `value`, `score` and `winner`."""

    value: float | None
    score: int | None
    winner: Winner | None

    @property
    def experience_id(self) -> int | None: ...
    @property
    def reward_parts(self) -> Mapping[str, float]: ...
    @property
    def thumb(self) -> Literal["up", "down"] | None: ...
    @property
    def other_experience_id(self) -> int | None: ...
    @property
    def preferred(self) -> Winner | None: ...
    @property
    def order(self) -> Sequence[int] | None: ...
    @property
    def flags(self) -> Sequence[str]: ...
    @property
    def reason(self) -> str: ...


# Who gives a piece of feedback, passed on to the kind's service: run, author or api_key,
# comment.
Who = Mapping[str, object]


@dataclass(frozen=True)
class KindValue:
    """A kind's typed value. Subclasses are frozen dataclasses that validate in
    `__post_init__` (raising kernel.exceptions.InvalidInput naming the field)."""

    def stored(self) -> Body:
        """The JSON stored in Feedback.value (the one shape of the kind; see the model)."""
        return {k: v for k, v in asdict(self).items() if not (k == "legacy" and v is None)}

    @classmethod
    def from_stored(cls: type[V], raw: Mapping[str, object]) -> V:
        """The value of a stored row (shapes as documented on Feedback, migration 0003's
        `legacy` included)."""
        return cls(**raw)

    @classmethod
    def _unchecked(cls: type[V], **fields: object) -> V:
        """A stored row migration 0003 kept in a shape no new value may take (its `legacy`):
        read as it is, past the constructor's checks."""
        value = object.__new__(cls)
        for name, field_value in fields.items():
            object.__setattr__(value, name, field_value)
        return value


class FeedbackKind:
    """One kind of feedback's declaration. Subclasses set the class attributes and override
    what differs; `kind_register` makes one instance of each."""

    name: ClassVar[str]
    Value: ClassVar[type[KindValue]]
    target: ClassVar[Target] = "experience"
    # Its signals are part of a member's human reward (`signals`).
    folds: ClassVar[bool] = False
    # A label for the reward model: it yields preference pairs, counts toward the learned
    # policy's retraining, and toward an annotator's day.
    labels: ClassVar[bool] = False
    # How a label of this kind reaches the policy's training (apps.feedback.ledger): folded
    # into its targets' rewards ("reward": any algorithm that trains on the model's own
    # rollouts, unless the feedback mode is auto), as a preference pair of its targets
    # ("preference": an algorithm that trains on pairs, DPO), as the expert experience it
    # wrote ("expert": an algorithm whose batches take expert experiences, SFT and MIX), or
    # not at all (None). Derived from `folds` when not set.
    reaches: ClassVar[Literal["reward", "preference", "expert"] | None] = None
    # Its preference pairs come from the group's folded human rewards (ratings), not from
    # each row alone (`pairs`).
    pairs_by_fold: ClassVar[bool] = False
    # The author may change or withdraw it until its group is trained on (apps.feedback.revise).
    revisable: ClassVar[bool] = False
    # The run's owner may accept or reject it on the review page (apps.feedback.review).
    reviewable: ClassVar[bool] = True
    # Posted through the environment API (FeedbackIn.kind), and the FeedbackIn fields only it
    # may set (with what is said when another kind sets them).
    api: ClassVar[bool] = False
    api_exclusive: ClassVar[tuple[str, ...]] = ()
    api_exclusive_message: ClassVar[str] = ""
    # Given through `rft feedback` (apps.cli: its options are the command's, see `cli_store`).
    cli: ClassVar[bool] = False
    # What people call one and several of them on the pages ("rating", "ratings"); empty:
    # the name, and the name + "s".
    nouns: ClassVar[tuple[str, str]] = ("", "")

    def noun(self, count: int) -> str:
        one, many = self.nouns
        one = one or self.name.replace("_", " ")
        return one if count == 1 else (many or f"{one}s")

    def parse(self, raw: Mapping[str, object]) -> KindValue:
        return self.Value.from_stored(raw)

    def targets(self, fb: Feedback) -> list[int]:
        """The experience ids the row is about."""
        return [i for i in (fb.experience_id, fb.other_id) if i]

    def pair_ids(self, fb: Feedback) -> list[int]:
        """The experience ids its preference pairs need read (default: its targets)."""
        return self.targets(fb)

    def reaches_training(self) -> Literal["reward", "preference", "expert"] | None:
        """How its labels reach the policy's training (`reaches`; folding kinds: "reward")."""
        return self.reaches or ("reward" if self.folds else None)

    def trained_ids(self, fb: Feedback) -> list[int]:
        """The experience ids whose training carries the label (default: its targets)."""
        return self.targets(fb)

    def signals(self, fb: Feedback) -> Iterable[Signal]:
        """Its part of the members' human rewards: (experience id, score on [0, 1], whether
        the rater's scale offset applies). Only for `folds` kinds."""
        return ()

    def pairs(self, fb: Feedback, exps: Mapping[int, Experience], *, trust: float) -> list[PreferencePair]:
        """The preference pairs one row yields (`exps`: the experiences it names, by id)."""
        return []

    def reviewed(self, fb: Feedback, *, rejected: bool) -> str:
        """What a review changes beyond the row itself, which a rejection leaves out of every
        fold, the reward model's pairs and the exports (FeedbackQuerySet.effective); returns
        what it did, in words ("" for nothing). Called inside the review's transaction."""
        return ""

    def store(self, **fields: object) -> Feedback:
        """Store one through its service (for the kinds whose service returns the row)."""
        stored: Feedback = self.service(**fields)
        return stored

    @property
    def service(self) -> Callable[..., Any]:
        """Its service (`kind_service`): what every door calls to store one."""
        try:
            return _SERVICES[self.name]
        except KeyError:
            raise LookupError(f"no service is registered for {self.name} feedback") from None

    def api_check(self, payload: FeedbackPayload) -> None:
        """Check (and normalise) a FeedbackIn of this kind; ValueError says what is wrong."""

    def cli_store(self, opts: Mapping[str, Any], *, who: Who) -> Feedback:
        """Store one from `rft feedback`'s options (`who`: run, author, comment); InvalidInput
        names the option that is wrong."""
        raise NotImplementedError(f"{self.name} feedback is not given through the command line")

    def api_store(self, payload: FeedbackPayload, *, experience: int, who: Who) -> Feedback:
        """Store a checked FeedbackIn through the kind's service (`who`: run, api_key, comment)."""
        raise NotImplementedError(f"{self.name} feedback is not posted through the environment API")


def preference_pair(chosen: Experience, rejected: Experience, *, kind: str, margin: float, group_id: str,
                    trust: float = 1.0) -> PreferencePair:
    return PreferencePair(
        prompt=chosen.prompt_text, chosen=chosen.response_text, rejected=rejected.response_text,
        chosen_id=chosen.pk, rejected_id=rejected.pk, group_id=group_id, kind=kind, margin=margin,
        trust=min(1.0, trust),
    )


# The kinds that ship with rftweb, one module each, registered on first use; listed in this
# order (the API's description lists them so), then any registered later.
_REGISTRY: Registry[FeedbackKind] = Registry(
    what="feedback kind", package=__name__,
    builtin=("env_reward", "rating", "pairwise", "ranking", "flag", "edit"),
)
# Each kind's service by kind name: registered where it is defined (apps.feedback.services for
# the built-in kinds, which import this package; a kind's own module otherwise), so the kind
# modules need not import the services.
_SERVICES: dict[str, Callable[..., Any]] = {}
F = TypeVar("F", bound=Callable[..., Any])


def kind_service(name: str) -> Callable[[F], F]:
    """Decorator: `fn` is the service of the kind `name`."""
    def register(fn: F) -> F:
        _SERVICES[str(getattr(name, "value", name))] = fn
        return fn
    return register
def kind_register(cls: type[FeedbackKind]) -> type[FeedbackKind]:
    """Class decorator: register one instance of `cls` under `cls.name` (once)."""
    kind = cls()
    _REGISTRY.add(cls.name, kind)
    if kind.folds:
        signal_source_register(cls.name, kind.signals)
    return cls


def kind_unregister(name: str) -> None:
    """Take a kind out again (tests that register one of their own)."""
    _REGISTRY.remove(name)
    _SERVICES.pop(name, None)
    signal_source_unregister(name)


def kinds_load() -> None:
    _REGISTRY.load()


def kinds() -> list[FeedbackKind]:
    return _REGISTRY.entries()


def kind_get(name: object) -> FeedbackKind:
    """The declaration registered as `name` (a str or a str enum); ValueError naming the
    known ones otherwise."""
    return _REGISTRY.get(name)


def kind_names(*, folds: bool | None = None, labels: bool | None = None, revisable: bool | None = None,
               api: bool | None = None, cli: bool | None = None, reviewable: bool | None = None) -> list[str]:
    """The registered kinds' names, those with the given attributes only."""
    wanted = {"folds": folds, "labels": labels, "revisable": revisable, "api": api, "cli": cli,
              "reviewable": reviewable}
    return [k.name for k in kinds() if all(v is None or getattr(k, a) == v for a, v in wanted.items())]


def value_parse(*, kind: str, raw: Mapping[str, object]) -> KindValue:
    """The typed value of a stored row of `kind` (Feedback.parsed is this for a row)."""
    return kind_get(kind).parse(raw)


def value_of(fb: Feedback, cls: type[V]) -> V:
    """A row's typed value as the kind's model the caller expects (TypeError otherwise:
    a reader asking a rating for a winner is a bug, not bad input)."""
    value = value_parse(kind=fb.kind, raw=fb.value)
    if not isinstance(value, cls):
        raise TypeError(f"{fb.kind} feedback holds a {type(value).__name__}, not a {cls.__name__}")
    return value


__all__: Sequence[str] = (
    "FeedbackKind", "KindValue", "Target", "kind_get", "kind_names", "kind_register", "kind_service",
    "kind_unregister", "kinds", "kinds_load", "preference_pair", "value_of", "value_parse",
)
