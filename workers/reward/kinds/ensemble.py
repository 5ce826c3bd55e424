"""An ensemble reward-model kind on frozen features of the base: what `head` and `mlp` share.

A kind of this shape gives its feature function (`EnsembleKind.features`: one row per
(prompt, completion), pooled from the frozen base) and its member's fit (`members_fit`: each
member on its own bootstrap sample of the pairs, weighted by margin and trust), and its
`Ensemble` subclass gives how a member scores standardised features and how it is written.
The rest is here, once: the features of the pairs' texts, their standardisation, the fit of
the version and, cross-validated (`crossval_folds`), of each fold of prompts without its
pairs and the out-of-fold accuracy; the saved version (one JSON file beside the base's
tokenizer, the base pinned) and its loading; the scorer (a score is the members' mean, its
spread their standard deviation: where the members disagree, a label teaches the most); and
the folds' scorer, which ranks each item as a version that never saw its prompt would (what
reward_trainer's calibration and random-share accuracy read).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Generic, Self, TypeVar

from apps.rewards.ports import PreferencePair
from workers.reward.kinds import Fitted, KindScorer, RewardKindImpl
from workers.reward.kinds.base_model import causal_lm_load
from workers.reward.kinds.pair_fit import pair_features, pair_weights, prompt_fold
from workers.reward.trainer import pairwise_accuracy, scorer_accuracy

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from apps.runs.ports import RewardModelConfig

M = TypeVar("M")
# Standardised feature rows, one per item.
Rows = Sequence[Sequence[float]]


@dataclass
class Ensemble(Generic[M]):
    """A fitted version: the base it reads (pinned), the features' standardisation and the
    members. Subclasses name their file and pooling and say how a member scores."""

    base: str
    mean: list[float]
    std: list[float]
    members: list[M]
    max_length: int
    answer_pattern: str | None = None

    FILE: ClassVar[str]  # the version's JSON file
    KIND: ClassVar[str]
    NOUN: ClassVar[str]  # "a head", in the refusal of another kind's or pooling's file
    POOLING: ClassVar[str]  # the features' pooling: a version of another is refused
    MEMBERS_KEY: ClassVar[str]  # the members' key in the file
    READS_ANSWER: ClassVar[bool] = False  # the file keeps `answer_pattern`

    def standardise(self, features: Rows) -> list[list[float]]:
        return [[(x - m) / s for x, m, s in zip(f, self.mean, self.std, strict=True)] for f in features]

    def member_scores(self, z: Rows, members: Sequence[M]) -> torch.Tensor:
        """(items, members), float64: each member's score of each standardised row."""
        raise NotImplementedError

    def members_mean(self, z: Rows, members: Sequence[M]) -> list[float]:
        """Each standardised row's score by `members` (their mean)."""
        return [float(x) for x in self.member_scores(z, members).mean(1)]

    def score_spread(self, features: Rows, members: Sequence[M] | None = None) -> tuple[list[float], list[float]]:
        if not features:
            return [], []
        per = self.member_scores(self.standardise(features), members or self.members)
        spread = per.std(1, unbiased=False) if per.shape[1] > 1 else per[:, 0] * 0
        return per.mean(1).tolist(), spread.tolist()

    def member_dump(self, member: M) -> object:
        return member

    @classmethod
    def member_load(cls, raw: object) -> M:
        raise NotImplementedError

    def save(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        data: dict[str, object] = {
            "kind": self.KIND, "base": self.base, "pooling": self.POOLING, "mean": self.mean, "std": self.std,
            self.MEMBERS_KEY: [self.member_dump(m) for m in self.members], "max_length": self.max_length,
        }
        if self.READS_ANSWER:
            data["answer_pattern"] = self.answer_pattern
        (out / self.FILE).write_text(json.dumps(data))

    @classmethod
    def load(cls, path: Path) -> Self:
        data = json.loads((path / cls.FILE).read_text())
        if data.get("kind") != cls.KIND or data.get("pooling") != cls.POOLING:
            raise ValueError(f"{path}: not {cls.NOUN} reward model of this version ({data.get('kind')!r})")
        return cls(base=data["base"], mean=data["mean"], std=data["std"],
                   members=[cls.member_load(m) for m in data[cls.MEMBERS_KEY]], max_length=int(data["max_length"]),
                   answer_pattern=data.get("answer_pattern"))


class EnsembleScorer(KindScorer, Generic[M]):
    def __init__(self, kind: EnsembleKind[M], ensemble: Ensemble[M], model: PreTrainedModel,
                 tokenizer: PreTrainedTokenizerBase, *, batch_size: int = 32) -> None:
        self.kind, self.ensemble, self.model, self.tokenizer = kind, ensemble, model, tokenizer
        self.batch_size = batch_size

    def features(self, prompts: Sequence[str], completions: Sequence[str]) -> list[list[float]]:
        return self.kind.features(self.model, self.tokenizer, prompts, completions, ensemble=self.ensemble,
                                  batch_size=self.batch_size)

    def score_spread(self, prompts: Sequence[str],
                     completions: Sequence[str]) -> tuple[list[float], list[float] | None]:
        if not prompts:
            return [], []
        return self.ensemble.score_spread(self.features(prompts, completions))

    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        return self.score_spread(prompts, completions)[0]


class EnsembleFolds(Generic[M]):
    """A cross-validated fit's folds: for each fold of prompts (`prompt_fold`), the members
    fitted on the other folds' pairs."""

    def __init__(self, scorer: EnsembleScorer[M], *, folds: int, fold_members: dict[int, list[M]]) -> None:
        self.scorer, self.folds, self.fold_members = scorer, folds, fold_members

    def fold_fitted(self, prompt: str) -> bool:
        return prompt_fold(prompt, self.folds) in self.fold_members

    def score_out_of_fold(self, prompts: Sequence[str], completions: Sequence[str], keys: Sequence[str]) -> list[float]:
        """Each item scored by the members of its prompt's fold (`keys`: the items' prompts); by
        the published ones where that fold has none (its prompts were in no pair)."""
        if not prompts:
            return []
        ensemble = self.scorer.ensemble
        z = ensemble.standardise(self.scorer.features(prompts, completions))
        return [ensemble.members_mean([row], self.fold_members.get(prompt_fold(key, self.folds), ensemble.members))[0]
                for row, key in zip(z, keys, strict=True)]


class EnsembleKind(RewardKindImpl, Generic[M]):
    """A reward-model kind that is an ensemble on frozen features of the base (module docstring)."""

    def ensemble_type(self) -> type[Ensemble[M]]:
        raise NotImplementedError

    def features(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str],
                 completions: Sequence[str], *, ensemble: Ensemble[M], batch_size: int = 32) -> list[list[float]]:
        """One pooled feature row per (prompt, completion), as `ensemble` reads them (its
        `max_length`, its `answer_pattern` where the kind reads one)."""
        raise NotImplementedError

    def members_fit(self, chosen: Rows, rejected: Rows, weight: list[float], *, count: int, l2: float,
                    seed: int) -> list[M]:
        """`count` members, each on its bootstrap sample of the pairs given."""
        raise NotImplementedError

    def answer_pattern(self, cfg: RewardModelConfig) -> str | None:
        """The answer span its features read (`reward_model.answer_pattern`); none by default."""
        return None

    def ensemble_fit(self, *, base: str, train: list[PreferencePair], max_length: int, count: int, l2: float,
                     seed: int, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, folds: int = 0,
                     answer_pattern: str | None = None) -> tuple[Ensemble[M], dict[int, list[M]], float | None]:
        """Fit the ensemble on `train` (features once, each member on its bootstrap sample); with
        `folds` >= 2 each fold's members too, fitted without its prompts' pairs, and the
        out-of-fold pairwise accuracy: (ensemble, fold members, accuracy); ({}, None) without."""
        shell = self.ensemble_type()(base=base, mean=[], std=[], members=[], max_length=max_length,
                                     answer_pattern=answer_pattern)
        got = pair_features(train, lambda prompts, completions: self.features(model, tokenizer, prompts, completions,
                                                                             ensemble=shell))
        ensemble = replace(shell, mean=got.mean, std=got.std)
        chosen, rejected = got.sides(ensemble.standardise(got.rows), train)
        weight = pair_weights(train)
        ensemble.members = self.members_fit(chosen, rejected, weight, count=count, l2=l2, seed=seed)
        if folds < 2:
            return ensemble, {}, None
        fold_of = [prompt_fold(p.prompt, folds) for p in train]
        fold_members: dict[int, list[M]] = {}
        for k in sorted(set(fold_of)):
            rest = [i for i, f in enumerate(fold_of) if f != k]
            if rest:
                fold_members[k] = self.members_fit([chosen[i] for i in rest], [rejected[i] for i in rest],
                                                   [weight[i] for i in rest], count=count, l2=l2, seed=seed + 1 + k)
        ranked = [i for i, k in enumerate(fold_of) if k in fold_members]  # one fold holding every prompt: none

        def oof(rows: Rows) -> list[float]:
            return [ensemble.members_mean([rows[i]], fold_members[fold_of[i]])[0] for i in ranked]

        accuracy = pairwise_accuracy(oof(chosen), oof(rejected), [train[i].trust for i in ranked])
        return ensemble, fold_members, accuracy

    def fit(self, *, cfg: RewardModelConfig, base: str, train: list[PreferencePair], heldout: list[PreferencePair],
            out: Path, seed: int) -> Fitted:
        model, tokenizer = causal_lm_load(base)
        folds = cfg.crossval_folds
        if folds >= 2:
            train = train + heldout  # every pair trains the version and is held out once in the folds
        ensemble, fold_members, accuracy = self.ensemble_fit(
            base=base, train=train, max_length=cfg.max_length, count=cfg.ensemble, l2=cfg.l2, seed=seed, model=model,
            tokenizer=tokenizer, folds=folds, answer_pattern=self.answer_pattern(cfg))
        ensemble.save(out)
        tokenizer.save_pretrained(out)
        scorer = EnsembleScorer(self, ensemble, model, tokenizer)
        if folds >= 2:
            oof = EnsembleFolds(scorer, folds=folds, fold_members=fold_members)
            return Fitted(scorer, accuracy, train, train, calibration_score=oof.score_out_of_fold, out_of_fold=oof)
        if heldout:
            accuracy = scorer_accuracy(scorer.score, heldout)
        return Fitted(scorer, accuracy, train, heldout)

    def owns(self, path: Path) -> bool:
        return (path / self.ensemble_type().FILE).is_file()

    def load(self, path: str, *, max_length: int, batch_size: int) -> KindScorer:
        ensemble = self.ensemble_type().load(Path(path))
        model, tokenizer = causal_lm_load(ensemble.base)
        return EnsembleScorer(self, ensemble, model, tokenizer, batch_size=batch_size)
