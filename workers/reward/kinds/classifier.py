"""`classifier` on the worker: a scalar-head sequence classifier trained whole with TRL's
RewardTrainer (workers.reward.trainer.reward_model_fit)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from apps.rewards.ports import PreferencePair
from workers.reward.kinds import Fitted, KindScorer, RewardKindImpl, reward_kind_impl_register
from workers.weights.adapters import model_export
from workers.reward.scorers import reward_model_load
from workers.reward.trainer import reward_model_fit, rm_score_texts

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from apps.runs.ports import RewardModelConfig


class _Scorer(KindScorer):
    def __init__(self, net: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, max_length: int,
                 batch_size: int = 64) -> None:
        self.net, self.tokenizer, self.max_length, self.batch_size = net, tokenizer, max_length, batch_size

    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        return rm_score_texts(self.net, self.tokenizer, list(prompts), list(completions), max_length=self.max_length,
                              batch_size=self.batch_size)


@reward_kind_impl_register
class Classifier(RewardKindImpl):
    name = "classifier"

    def fit(self, *, cfg: RewardModelConfig, base: str, train: list[PreferencePair], heldout: list[PreferencePair],
            out: Path, seed: int) -> Fitted:
        net, tokenizer, accuracy = reward_model_fit(
            base=base, train=train, heldout=heldout, out=out, epochs=cfg.epochs, learning_rate=cfg.learning_rate,
            batch_size=cfg.batch_size, max_length=cfg.max_length, seed=seed,
        )
        return Fitted(_Scorer(net, tokenizer, max_length=cfg.max_length), accuracy, train, heldout)

    def owns(self, path: Path) -> bool:
        return (path / "config.json").is_file()

    def load(self, path: str, *, max_length: int, batch_size: int) -> KindScorer:
        net, tokenizer = reward_model_load(path)
        return _Scorer(net, tokenizer, max_length=max_length, batch_size=batch_size)

    def export(self, *, source: str, out: str, scale: float, offset: float) -> Path:
        return model_export(source=source, out=out, merged=False)
