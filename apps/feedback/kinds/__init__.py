"""Kinds of feedback as the rest of the app knows them: each declared once, in one module.

A kind is registered here by name with everything the rest of the loop must know of it —
its value as a typed model (validated in its constructor; `stored()` is the JSON row's
`value`, `Feedback.parsed` reads it back), what it targets (one experience, a pair of one
group, a whole group), whether and how it folds into a member's human reward, which
preference pairs it yields for the reward model, whether it may be revised — and its doors:
its service (`kind_service`, storing through apps.feedback.kinds.submit), its body on the
environment API (`ApiIn`: the API's feedback body is the union of the kinds' bodies,
apps.envapi.schemas.FeedbackIn), its `rft feedback` options (`cli_arguments`) and its panel
on the annotation page (`panel_template`, `panel_context`, `page_store`). Nothing else
compares kind names to decide behaviour: the raters' agreement reads the kinds that declare
what counts for it (`agreement`), a preference algorithm's batches and the DPO export's
human choices the kinds whose labels reach training as preferences (`reaches`), each row
through its kind's `preferred` (the pipeline's flag filter still names the kind it reads).

Adding one is one module (see `rating.py`, and docs/how-to/add-a-feedback-kind.md), listed in
`_REGISTRY`'s built-ins, plus its panel's template when it has one; `Feedback.kind` takes any
registered name without a migration. tests/feedback/test_kind_registry.py adds one from a single
test module and gives it through the page, the API and the CLI.

The folding math stays in the kernel (`kernel.fold`, which cannot import this
app): `feedback_votes` hands it each folding kind's votes as plain data.

The package holds a label's way from the page to its reward, downwards: the annotation form's
submit (`rate_and_flag`) calls a kind's service (its module), which stores through `submit`
(what every kind's service shares: the row, its lateness, the author's leases, the
announcement), which folds the group (`fold`) under the run's feedback settings. Only the fold's
arithmetic comes back up, for each row's votes (`feedback_votes`, the kind's `votes`).
"""

from __future__ import annotations

from argparse import ArgumentParser
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, TypeVar

from django.core.exceptions import ValidationError
from pydantic import BaseModel, ConfigDict, Field, model_validator

from apps.rewards.pairs import PreferencePair
from kernel.fold import RaterVote, Vote, feedback_rater
from kernel.jsontypes import Body
from kernel.registry import Registry

if TYPE_CHECKING:
    from apps.buffer.models import Experience
    from apps.feedback.models import Feedback
    from apps.runs.models import Run

Target = Literal["experience", "pair", "group"]
V = TypeVar("V", bound="KindValue")
Winner = Literal["a", "b", "tie"]
ExperienceId = Annotated[int, Field(ge=1, le=2**63 - 1)]
# A form as the page posts it (a QueryDict): `get` and `getlist`.
PageForm = Any
# Kind names fit Feedback.kind's column.
NAME_MAX = 32


class KindApiIn(BaseModel):
    """A kind's body on the environment API (its `ApiIn`), one model of the union the API's
    feedback route takes (apps.envapi.schemas.FeedbackIn). Unknown keys are refused, so a typo
    is a 422 naming the field; JSON's true/false are never taken for numbers. A kind adds its
    fields (`kind: Literal[<its name>]` names it in the API's description) and checks them in
    a model validator (a ValueError is the 422's message)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    kind: str = Field(description="the kind of feedback")
    experience_id: ExperienceId | None = Field(None, description="the experience it is about")
    comment: Annotated[str, Field(max_length=5000)] = ""

    @model_validator(mode="after")
    def _needs_its_target(self) -> KindApiIn:
        if kind_get(self.kind).target != "group" and self.experience_id is None:
            raise ValueError(f"{self.kind} needs experience_id")
        return self


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

    def __init_subclass__(cls, **kwargs: object) -> None:
        # Round 49 renamed `signals` to `votes`: a kind written on the old name would fold
        # nothing, silently, so it is refused where it is declared.
        super().__init_subclass__()
        if "signals" in vars(cls):
            raise TypeError(f"{cls.__name__}.signals is now votes (docs/concepts.md#names)")

    name: ClassVar[str]
    Value: ClassVar[type[KindValue]]
    target: ClassVar[Target] = "experience"
    # Its votes are part of a member's human reward (`votes`).
    folds: ClassVar[bool] = False
    # A label for the reward model: it yields preference pairs, counts toward the learned
    # policy's retraining, and toward an annotator's day.
    labels: ClassVar[bool] = False
    # How a label of this kind reaches the policy's training (apps.feedback.ledger): folded
    # into its targets' rewards ("reward": any algorithm that trains on the model's own
    # rollouts, unless the feedback mode is auto), as a preference pair of its targets
    # ("preference": an algorithm declaring preference_pairs, DPO), as the expert experience it
    # wrote ("expert": an algorithm whose batches take expert experiences, SFT and MIX), or
    # not at all (None). Derived from `folds` when not set.
    reaches: ClassVar[Literal["reward", "preference", "expert"] | None] = None
    # What its rows count toward in the raters' agreement (apps.feedback.raters.reliability):
    # "rating", one score per item (its value has `normalised` on [0, 1] and a raw `score` or
    # `thumb`: the Rated protocol there), compared between the raters of the same item;
    # "preference", the (better, worse) pairs its rows state (`preferred`), compared between
    # the raters of the same pair; None, nothing.
    agreement: ClassVar[Literal["rating", "preference"] | None] = None
    # Its preference pairs come from the group's folded human rewards (ratings), not from
    # each row alone (`pairs`).
    pairs_by_fold: ClassVar[bool] = False
    # Where a row names the experiences whose training carries it (`trained_ids`): "" for the
    # row's experience and other; else the key of its value that holds one id or a list of ids.
    # The ledger's counts read it in SQL (apps.feedback.ledger), so it is a declaration, not code.
    trained_key: ClassVar[str] = ""
    # A row of it marks its experience as flagged: the experience browser's flagged filter and
    # mark, the bulk export's `flagged`, the bulk flag's "flagged by you before" (`kinds_that_flag`).
    marks_flagged: ClassVar[bool] = False
    # The author may change or withdraw it until its group is trained on (apps.feedback.review.revise):
    # its revision form's fields are `revision_template`, pre-filled from `revision_values`,
    # and `revision_store` stores what they post.
    revisable: ClassVar[bool] = False
    revision_template: ClassVar[str] = ""
    # The run's owner may accept or reject it on the review page (apps.feedback.review.services).
    reviewable: ClassVar[bool] = True
    # Its body on the environment API (None: not posted there); `api_store` stores one.
    ApiIn: ClassVar[type[KindApiIn] | None] = None
    # Given through `rft feedback <run> <name>` (apps.cli): its options are `cli_arguments`,
    # `cli_store` stores one from them.
    cli: ClassVar[bool] = False
    cli_help: ClassVar[str] = ""
    # Its panel on the annotation page (a template name; "" for none), at the item's address
    # + `panel_slug` (default: the name): reached from each item's card by a link with these
    # words, class `act-<slug>` and this key (apps.feedback.views.panel renders it with
    # `panel_context`; posting its form stores one through `page_store`).
    panel_template: ClassVar[str] = ""
    panel_slug: ClassVar[str] = ""
    panel_link: ClassVar[str] = ""
    panel_key: ClassVar[str] = ""
    panel_order: ClassVar[int] = 100  # where its link stands among the card's (lower: first)
    # Its saved note (`page_saved`) ends with what a late one does, which the page adds
    # (apps.feedback.views; the effect is apps.feedback.selectors.feedback_effect).
    late_note: ClassVar[bool] = True
    # What an item's card says once its annotator gave one ("compared"; "": nothing).
    page_mark: ClassVar[str] = ""
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
        """The experience ids whose training carries the label, where `trained_key` says."""
        if not self.trained_key:
            return [i for i in (fb.experience_id, fb.other_id) if i]
        held = fb.value.get(self.trained_key) if isinstance(fb.value, dict) else None
        ids = held if isinstance(held, list) else [] if held is None else [held]
        return [int(i) for i in ids]

    def votes(self, fb: Feedback) -> Iterable[Vote]:
        """Its part of the members' human rewards: (experience id, score on [0, 1], whether
        the rater's scale offset applies). Only for `folds` kinds."""
        return ()

    def pairs(self, fb: Feedback, exps: Mapping[int, Experience], *, trust: float) -> list[PreferencePair]:
        """The preference pairs one row yields (`exps`: the experiences it names, by id)."""
        return []

    def preferred(self, fb: Feedback) -> list[tuple[int, int]]:
        """The (better, worse) experience ids the row itself states: for the raters' pair
        agreement where `agreement` is "preference" (apps.feedback.raters.reliability), and where its
        labels reach training as preferences (`reaches`), for a preference algorithm's batches
        and the DPO export's human choices (apps.feedback.selectors). Default: none."""
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
            return _SERVICES.get(self.name)
        except ValueError:
            raise LookupError(f"no service is registered for {self.name} feedback") from None

    @property
    def api(self) -> bool:
        """Posted through the environment API."""
        return self.ApiIn is not None

    def api_store(self, payload: KindApiIn, *, experience: int, who: Who) -> Feedback:
        """Store a checked body (its `ApiIn`) through the kind's service (`who`: run, api_key,
        comment)."""
        raise NotImplementedError(f"{self.name} feedback is not posted through the environment API")

    def cli_arguments(self, parser: ArgumentParser) -> None:
        """Add its options to `rft feedback <run> <name>` (`--as` and `--comment` are there)."""

    def cli_store(self, opts: Mapping[str, Any], *, who: Who) -> Feedback:
        """Store one from `rft feedback`'s options (`who`: run, author, comment); InvalidInput
        names the option that is wrong."""
        raise NotImplementedError(f"{self.name} feedback is not given through the command line")

    def panel_context(self, *, run: Run, experience: Experience, query: Mapping[str, str]) -> dict[str, object]:
        """What its panel's template needs beyond the run and the item (`e`); `query`: the
        panel's GET parameters."""
        return {}

    def page_store(self, form: PageForm, *, experience: Experience, who: Who) -> Feedback:
        """Store one from its panel's posted form (`who`: run, author, comment); InvalidInput
        names the field that is wrong."""
        raise NotImplementedError(f"{self.name} feedback has no panel on the annotation page")

    def revision_values(self, fb: Feedback) -> dict[str, object]:
        """What its revision fields (`revision_template`) show of the label `fb`, pre-filled."""
        return {}

    def revision_store(self, form: PageForm, *, experience: Experience, who: Who) -> Feedback:
        """Store a person's revision of one of its labels from the revision form, which has the
        fields of the form the label was given on (its panel's by default; a kind given on the
        item's card reads the card's fields)."""
        return self.page_store(form, experience=experience, who=who)

    def page_saved(self, *, run: Run, feedback: Feedback) -> dict[str, object]:
        """What the page shows once its panel's form is saved (feedback/_saved.html's context:
        at least `message`; a late one's effect follows it where `late_note`)."""
        return {"message": f"Saved: your {self.noun(1)}"}

    @property
    def slug(self) -> str:
        """Its panel's part of the page's addresses."""
        return self.panel_slug or self.name


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
# Each kind's service by kind name: registered where it is defined (the built-in kinds' modules,
# which import this package; a kind's own module otherwise), so the kind modules need not
# import the services.
_SERVICES: Registry[Callable[..., Any]] = Registry(what="feedback service", package=__name__, builtin=())
F = TypeVar("F", bound=Callable[..., Any])


def kind_service(name: str) -> Callable[[F], F]:
    """Decorator: `fn` is the service of the kind `name`."""
    def register(fn: F) -> F:
        _SERVICES.add(str(getattr(name, "value", name)), fn)
        return fn
    return register
def kind_register(cls: type[FeedbackKind]) -> type[FeedbackKind]:
    """Class decorator: register one instance of `cls` under `cls.name` (once)."""
    if not cls.name or len(cls.name) > NAME_MAX:
        raise ValueError(f"a feedback kind's name is 1 to {NAME_MAX} characters (Feedback.kind), got {cls.name!r}")
    if cls.revisable and not cls.revision_template:
        raise ValueError(f"the {cls.name} feedback kind is revisable: it names its revision form's fields "
                         "(revision_template)")
    kind = cls()
    _REGISTRY.add(cls.name, kind)
    return cls


def kind_unregister(name: str) -> None:
    """Take a kind out again (tests that register one of their own)."""
    _REGISTRY.remove(name)
    _SERVICES.remove(name)


def kinds_load() -> None:
    _REGISTRY.load()


def kinds() -> list[FeedbackKind]:
    return _REGISTRY.entries()


def feedback_votes(feedback: Iterable[Feedback]) -> Iterator[RaterVote]:
    """The human votes of feedback rows for the kernel's fold (votes_fold): each row of a
    kind that folds, through its kind; rows of other kinds are passed over."""
    folding = {kind.name: kind for kind in kinds() if kind.folds}
    for fb in feedback:
        kind = folding.get(fb.kind)
        if kind is None:
            continue
        rater = feedback_rater(fb)
        for pk, score, scaled in kind.votes(fb):
            yield RaterVote(pk, score, scaled, rater, fb.author_id)


def kind_get(name: object) -> FeedbackKind:
    """The declaration registered as `name` (a str or a str enum); ValueError naming the
    known ones otherwise."""
    return _REGISTRY.get(name)


def kind_names(*, folds: bool | None = None, labels: bool | None = None, revisable: bool | None = None,
               api: bool | None = None, cli: bool | None = None, reviewable: bool | None = None,
               agreement: str | None = None) -> list[str]:
    """The registered kinds' names, those with the given attributes only."""
    wanted = {"folds": folds, "labels": labels, "revisable": revisable, "api": api, "cli": cli,
              "reviewable": reviewable, "agreement": agreement}
    return [k.name for k in kinds() if all(v is None or getattr(k, a) == v for a, v in wanted.items())]


def preference_kind_names() -> list[str]:
    """The kinds whose labels reach the policy's training as preference pairs (`reaches`
    "preference"): the rows a preference algorithm's batches and the DPO export's human
    choices read, each through its kind's `preferred`."""
    return [k.name for k in kinds() if k.reaches_training() == "preference"]


def kinds_that_flag() -> list[str]:
    """The kinds whose rows mark their experience as flagged (`marks_flagged`)."""
    return [k.name for k in kinds() if k.marks_flagged]


def kind_of_panel(slug: str) -> FeedbackKind:
    """The kind whose panel is at `slug` (LookupError when none is)."""
    for kind in kinds():
        if kind.panel_template and kind.slug == slug:
            return kind
    raise LookupError(f"no feedback kind has a panel at {slug!r}")


def kind_validate(name: object) -> None:
    """Feedback.kind's validator (forms, the admin, full_clean): a registered kind's name. The
    column has no choices, so a new kind needs no migration; InvalidInput names the known ones."""
    try:
        kind_get(name)
    except ValueError as exc:
        raise ValidationError(str(exc), code="unknown_kind") from None


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
    "NAME_MAX", "ExperienceId", "FeedbackKind", "KindApiIn", "KindValue", "PageForm", "Target", "Who", "kind_get",
    "kind_names", "kind_of_panel", "kind_register", "kind_service", "kind_unregister", "kind_validate", "kinds",
    "kinds_load", "kinds_that_flag", "preference_kind_names", "preference_pair", "value_of", "value_parse",
)
