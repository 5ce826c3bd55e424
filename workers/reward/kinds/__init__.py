"""Each reward-model kind on the reward worker: how a version is fitted on the run's
preference pairs, how a saved version is recognised and loaded, how it scores.

Registered under the same name as the kind's declaration (`kernel.reward_kinds`), which
says what the config must know of it; workers/reward/trainer.py fits, publishes and scores
through these entries, never comparing kind names. Adding one: a module here (see `head.py`)
listed in `_REGISTRY`'s built-ins, and its declaration. What the kinds share lives in
modules of no kind: the base as they read it (`base_model.py`), the fitting on pairs
(`pair_fit.py`) and the ensemble on frozen features that `head` and `mlp` specialise by their
feature function and member (`ensemble.py`). torch / transformers are imported inside the
kinds' functions only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from apps.rewards.ports import PreferencePair
from kernel.registry import Registry
from kernel.exceptions import ExportFailed

if TYPE_CHECKING:
    from apps.runs.ports import RewardModelConfig


class OutOfFold(Protocol):
    """A cross-validated fit: each item scored by the fold's fit that never saw its prompt
    (workers.reward.likelihood.LikelihoodScorer, workers.reward.kinds.ensemble.EnsembleFolds)."""

    def fold_fitted(self, prompt: str) -> bool: ...

    def score_out_of_fold(self, prompts: Sequence[str], completions: Sequence[str],
                          keys: Sequence[str]) -> list[float]: ...


class KindScorer:
    """A loaded version: raw scores of (prompt, completion), and where the kind has one, each
    score's spread (how far an ensemble's members disagree: the selection rule's uncertainty)."""

    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        raise NotImplementedError

    def score_spread(self, prompts: Sequence[str],
                     completions: Sequence[str]) -> tuple[list[float], list[float] | None]:
        return self.score(prompts, completions), None

    def __call__(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        return self.score(prompts, completions)


@dataclass
class Fitted:
    """A fitted version: its scorer and held-out accuracy, the pairs it trained on and was
    measured on (a cross-validated fit: all of them, both), and, cross-validated, the scorer
    that ranks each item by the fold's fit that never saw its prompt."""

    scorer: KindScorer
    accuracy: float | None
    train: list[PreferencePair]
    heldout: list[PreferencePair]
    # (prompts, completions, prompt keys) -> scores out of fold; None: not cross-validated.
    calibration_score: Callable[[Sequence[str], Sequence[str], Sequence[str]], list[float]] | None = None
    out_of_fold: OutOfFold | None = None


class RewardKindImpl:
    name: ClassVar[str]

    def fit(self, *, cfg: RewardModelConfig, base: str, train: list[PreferencePair], heldout: list[PreferencePair],
            out: Path, seed: int) -> Fitted:
        raise NotImplementedError

    def owns(self, path: Path) -> bool:
        """Whether the saved version at `path` is of this kind."""
        raise NotImplementedError

    def load(self, path: str, *, max_length: int, batch_size: int) -> KindScorer:
        raise NotImplementedError

    def export(self, *, source: str, out: str, scale: float, offset: float) -> Path:
        """The version at `source` as a directory `AutoModelForSequenceClassification`
        loads (workers.reward.scorers.reward_model_export); ExportFailed where the kind has
        no such form."""

        raise ExportFailed(f"a {self.name!r} reward-model version cannot be exported as a transformers directory yet")


# `classifier` last: any transformers directory is one, so it is the fallback of `of_dir`.
_REGISTRY: Registry[RewardKindImpl] = Registry(what="reward-model kind", package=__name__,
                                               builtin=("head", "likelihood", "mlp", "lora", "classifier"))


def reward_kind_impl_register(cls: type[RewardKindImpl]) -> type[RewardKindImpl]:
    _REGISTRY.add(cls.name, cls())
    return cls


def reward_kind_impl(name: str) -> RewardKindImpl:
    return _REGISTRY.get(name)


def reward_kind_of_dir(path: str | Path) -> RewardKindImpl:
    """The kind whose saved version `path` holds (the first that owns it, built-ins first)."""
    entries = _REGISTRY.entries()
    for entry in entries:
        if entry.owns(Path(path)):
            return entry
    return reward_kind_impl("classifier")
