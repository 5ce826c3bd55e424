"""`likelihood` on the worker: workers/reward/likelihood.py behind the kinds' interface."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from apps.rewards.ports import PreferencePair
from workers.reward.kinds import Fitted, KindScorer, RewardKindImpl, reward_kind_impl_register

if TYPE_CHECKING:
    from apps.runs.ports import RewardModelConfig
    from workers.reward.likelihood import LikelihoodScorer


class _Scorer(KindScorer):
    def __init__(self, scorer: LikelihoodScorer, batch_size: int = 32) -> None:
        self.inner, self.batch_size = scorer, batch_size

    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        return self.inner.score(prompts, completions, batch_size=self.batch_size)


@reward_kind_impl_register
class Likelihood(RewardKindImpl):
    name = "likelihood"

    def fit(self, *, cfg: RewardModelConfig, base: str, train: list[PreferencePair], heldout: list[PreferencePair],
            out: Path, seed: int) -> Fitted:
        from workers.reward.likelihood import likelihood_model_fit

        scorer, accuracy = likelihood_model_fit(base=base, train=train, heldout=heldout, out=out,
                                                max_length=cfg.max_length, answer_pattern=cfg.answer_pattern or None,
                                                l2=cfg.l2, crossval_folds=cfg.crossval_folds)
        if cfg.crossval_folds >= 2:
            # Every pair trained the published version and was held out once in the folds.
            both = train + heldout
            return Fitted(_Scorer(scorer), accuracy, both, both, calibration_score=scorer.score_out_of_fold,
                          out_of_fold=scorer)
        return Fitted(_Scorer(scorer), accuracy, train, heldout)

    def owns(self, path: Path) -> bool:
        from workers.reward.likelihood import is_likelihood_dir

        return is_likelihood_dir(path)

    def load(self, path: str, *, max_length: int, batch_size: int) -> KindScorer:
        from workers.reward.likelihood import likelihood_model_load

        return _Scorer(likelihood_model_load(path), batch_size)

    def export(self, *, source: str, out: str, scale: float, offset: float) -> Path:
        from workers.reward.likelihood import likelihood_model_export

        return likelihood_model_export(source=source, out=out, scale=scale, offset=offset)
