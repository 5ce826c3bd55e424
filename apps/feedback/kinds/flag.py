"""A flag: one completion marked unsafe, broken or off task and/or a reason in words. It moves
no reward and yields no pair; the pipeline's flag filter drops flagged experiences."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from apps.feedback.kinds import FeedbackKind, FeedbackPayload, KindValue, Who, kind_register
from kernel.exceptions import InvalidInput
from kernel.jsontypes import Body

if TYPE_CHECKING:
    from apps.feedback.models import Feedback

FLAGS: tuple[str, ...] = ("unsafe", "broken", "off_task")
REASON_MAX = 5000
# What an older API client's flag without flags or reason reads as.
API_FLAG_REASON = "flagged through the environment API"


@dataclass(frozen=True)
class FlagValue(KindValue):
    """{"flags": sorted subset of FLAGS, "reason": str}; at least one of the two given."""

    flags: tuple[str, ...] = ()
    reason: str = ""

    def __post_init__(self) -> None:
        flags: Sequence[object] = self.flags
        if isinstance(flags, str) or not all(isinstance(f, str) for f in flags) or not set(flags) <= set(FLAGS):
            raise InvalidInput(f"flags are a list of {', '.join(FLAGS)}", field="flags")
        reason = (self.reason or "").strip()
        if len(reason) > REASON_MAX:
            raise InvalidInput(f"a reason is at most {REASON_MAX} characters", field="reason")
        if not flags and not reason:
            raise InvalidInput(f"a flag names one of {', '.join(FLAGS)} or gives a reason", field="flags")
        object.__setattr__(self, "flags", tuple(sorted(set(flags))))
        object.__setattr__(self, "reason", reason)

    def stored(self) -> Body:
        return {"flags": list(self.flags), "reason": self.reason}

    @classmethod
    def from_stored(cls, raw: Mapping[str, Any]) -> FlagValue:
        return cls(flags=tuple(raw.get("flags") or ()), reason=raw.get("reason") or "")


@kind_register
class Flag(FeedbackKind):
    name = "flag"
    Value = FlagValue
    target = "experience"
    revisable = True
    api = True
    cli = True
    api_exclusive = ("flags", "reason")
    api_exclusive_message = "flags and reason are for flag feedback only"

    def cli_store(self, opts: Mapping[str, Any], *, who: Who) -> Feedback:
        flags = [f.strip() for f in opts["flags"].split(",") if f.strip()]
        return self.store(experience=opts["experience"], flags=flags, reason=opts["reason"], **who)

    def api_store(self, payload: FeedbackPayload, *, experience: int, who: Who) -> Feedback:
        # An older client flags without saying why; the flag still needs to read as one.
        reason = payload.reason or ("" if payload.flags else API_FLAG_REASON)
        return self.store(experience=experience, flags=payload.flags, reason=reason, **who)
