"""The `likelihood` kind of the run's learned reward model: what a causal language model (the
base) thinks of a completion, read from its token log-likelihoods and weighed by a
Bradley-Terry model fitted on the run's preference pairs.

Why not only a classifier head: on the demo task a scalar head trained with TRL's
RewardTrainer on a few hundred pairs ranks held-out pairs near chance, while ranking by the
base's own log-likelihood of the completion already orders them (bench/reward_model). The
knowledge is in the likelihoods; this kind reads it there and learns from people only how to
weigh it (a handful of weights, so a few hundred labels are plenty).

Features of one (prompt, completion), under the base, the completion tokenised as the trainer
tokenises it (the prompt through the chat template, the completion's tokens, then eos):
the sum, mean and minimum of the completion tokens' log-probabilities, the sum and mean over
the answer span (the last match of `answer_pattern`'s first group, e.g. the text inside
`<answer>…</answer>`), whether a span was found, and the token count. They are standardised
on the training completions; the model is P(chosen ≻ rejected) = σ(w · (z_chosen − z_rejected)),
L2-regularised, fitted by L-BFGS, each pair weighted by its margin. A completion's raw score is
w · z, calibrated to the human scale like any version (reward_trainer.calibration_fit).

A version's directory holds `likelihood_reward.json` (the kind, the base checkpoint it read —
pinned, so a later policy checkpoint does not change what a version means —, the feature
names, standardisation and weights) and the base's tokenizer. The features are computed by
workers/reward/logprob_features.py, which `likelihood_model_export` writes beside an exported
version with workers/reward/likelihood_hf.py so that `AutoModelForSequenceClassification` loads it. Worker-only (torch, transformers).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from apps.rewards.ports import PreferencePair
from kernel.exceptions import ExportFailed
from workers.reward.likelihood_hf import completion_logprobs
from workers.reward.logprob_features import FEATURES, features_of
from workers.weights.adapters import atomic_dir, atomic_dir_commit
from workers.reward.likelihood_hf import LikelihoodRewardConfig, LikelihoodRewardModel
from workers.reward.kinds.base_model import causal_lm_load, pad_of, rm_prompt_ids, rm_rows
from workers.reward.kinds.pair_fit import bradley_terry_fit, pair_features, pair_weights, prompt_fold
from workers.reward.trainer import pairwise_accuracy, scorer_accuracy

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

HEAD_FILE = "likelihood_reward.json"
KIND = "likelihood"
DEFAULT_ANSWER_PATTERN = r"<answer>(.*?)</answer>"

def is_likelihood_dir(path: str | Path) -> bool:
    return (Path(path) / HEAD_FILE).is_file()


def likelihood_features(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], completions: Sequence[str], *, max_length: int,
    answer_pattern: str | None = DEFAULT_ANSWER_PATTERN, batch_size: int = 32,
) -> list[list[float]]:
    """One feature vector (FEATURES) per (prompt, completion) under the model."""
    tokenised = rm_rows(tokenizer, prompts, completions, max_length=max_length, answer_pattern=answer_pattern)
    rows = [(ids, cut) for ids, cut, _ in tokenised]
    spans = [span for _, _, span in tokenised]
    pad = pad_of(tokenizer)
    out: list[list[float]] = []
    for start in range(0, len(rows), batch_size):
        chunk = completion_logprobs(model, rows[start:start + batch_size], pad)
        out.extend(features_of(lp, span) for lp, span in zip(chunk, spans[start:start + batch_size], strict=True))
    return out


@dataclass
class LikelihoodHead:
    """The fitted part of a version: standardisation and Bradley-Terry weights."""

    base: str
    mean: list[float]
    std: list[float]
    weights: list[float]
    answer_pattern: str | None
    max_length: int

    def score(self, features: Sequence[Sequence[float]]) -> list[float]:
        return [sum(w * (x - m) / s for w, x, m, s in zip(self.weights, f, self.mean, self.std, strict=True))
                for f in features]

    def save(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / HEAD_FILE).write_text(json.dumps({
            "kind": KIND, "base": self.base, "features": list(FEATURES), "mean": self.mean, "std": self.std,
            "weights": self.weights, "answer_pattern": self.answer_pattern, "max_length": self.max_length,
        }, indent=2))

    @classmethod
    def load(cls, path: Path) -> LikelihoodHead:
        data = json.loads((path / HEAD_FILE).read_text())
        if data.get("kind") != KIND or data.get("features") != list(FEATURES):
            raise ValueError(f"{path}: not a likelihood reward model of this version ({data.get('kind')!r})")
        return cls(base=data["base"], mean=data["mean"], std=data["std"], weights=data["weights"],
                   answer_pattern=data["answer_pattern"], max_length=int(data["max_length"]))


def _dot(w: Sequence[float], x: Sequence[float]) -> float:
    return sum(a * b for a, b in zip(w, x, strict=True))


def fold_weights(z: Sequence[Sequence[float]], texts: dict[tuple[str, str], int], pairs: list[PreferencePair],
                 *, folds: int, l2: float) -> dict[int, list[float]]:
    """For each fold holding pairs, the weights fitted on the other folds' pairs (a prompt's
    pairs share a fold: `prompt_fold` its prompt); none for a fold that holds every pair."""
    by_fold: dict[int, list[PreferencePair]] = {}
    for p in pairs:
        by_fold.setdefault(prompt_fold(p.prompt, folds), []).append(p)
    out: dict[int, list[float]] = {}
    for k in by_fold:
        rest = [p for f, ps in by_fold.items() if f != k for p in ps]
        if rest:
            out[k] = bradley_terry_fit([z[texts[(p.prompt, p.chosen)]] for p in rest],
                                       [z[texts[(p.prompt, p.rejected)]] for p in rest],
                                       pair_weights(rest), l2=l2)
    return out


def crossval_accuracy(z: Sequence[Sequence[float]], texts: dict[tuple[str, str], int], pairs: list[PreferencePair],
                      *, folds: int, l2: float, weights: dict[int, list[float]] | None = None) -> float | None:
    """k-fold cross-validated pairwise accuracy over prompts: each pair ranked by weights fitted
    on the other folds' pairs (`fold_weights`, or `weights` when given), weighted by its trust."""

    weights = fold_weights(z, texts, pairs, folds=folds, l2=l2) if weights is None else weights
    chosen: list[float] = []
    rejected: list[float] = []
    trust: list[float] = []
    for p in pairs:
        w = weights.get(prompt_fold(p.prompt, folds))
        if w is None:
            continue  # one fold holds every prompt: nothing was fitted without them
        chosen.append(_dot(w, z[texts[(p.prompt, p.chosen)]]))
        rejected.append(_dot(w, z[texts[(p.prompt, p.rejected)]]))
        trust.append(p.trust)
    return pairwise_accuracy(chosen, rejected, trust)


def out_of_fold_scores(z: Sequence[Sequence[float]], prompts: Sequence[str], *, weights: dict[int, list[float]],
                       folds: int, fallback: Sequence[float]) -> list[float]:
    """Each item scored by the weights fitted without its prompt's fold: what the reward model
    would score it had it never seen its prompt's pairs. A prompt whose fold has no fit gets
    `fallback`, the weights fitted on every pair: its fold held no pair (so neither did the
    prompt), or, with too few prompts, every pair (nothing was fitted without them)."""
    return [_dot(weights.get(prompt_fold(g, folds), fallback), x) for x, g in zip(z, prompts, strict=True)]


def likelihood_model_fit(
    *, base: str, train: list[PreferencePair], heldout: list[PreferencePair], out: Path, max_length: int,
    answer_pattern: str | None = DEFAULT_ANSWER_PATTERN, l2: float = 1e-2, crossval_folds: int = 0,
) -> tuple[LikelihoodScorer, float | None]:
    """Fit a likelihood reward model on `train` over `base`, save it to `out`; returns (the
    scorer, held-out pairwise accuracy). With `crossval_folds` >= 2 the model fits `train` +
    `heldout` and the accuracy is `crossval_accuracy` over all of them."""

    if crossval_folds >= 2:
        train = train + heldout
    model, tokenizer = causal_lm_load(base)
    got = pair_features(train, lambda prompts, completions: likelihood_features(
        model, tokenizer, prompts, completions, max_length=max_length, answer_pattern=answer_pattern))
    texts, mean, std, n = got.texts, got.mean, got.std, len(FEATURES)
    z = [[(f[i] - mean[i]) / std[i] for i in range(n)] for f in got.rows]
    weights = bradley_terry_fit(*got.sides(z, train), pair_weights(train), l2=l2)
    head = LikelihoodHead(base=base, mean=mean, std=std, weights=weights, answer_pattern=answer_pattern,
                          max_length=max_length)
    head.save(out)
    tokenizer.save_pretrained(out)
    scorer = LikelihoodScorer(head, model, tokenizer)
    accuracy = None
    if crossval_folds >= 2:
        scorer.folds = crossval_folds
        scorer.fold_weights = fold_weights(z, texts, train, folds=crossval_folds, l2=l2)
        accuracy = crossval_accuracy(z, texts, train, folds=crossval_folds, l2=l2, weights=scorer.fold_weights)
    elif heldout:
        accuracy = scorer_accuracy(scorer.score, heldout)
    return scorer, accuracy


class LikelihoodScorer:
    """A loaded likelihood reward model: `score(prompts, completions) -> raw scores`."""

    def __init__(self, head: LikelihoodHead, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
        self.head, self.model, self.tokenizer = head, model, tokenizer
        # Set by a cross-validated fit (not saved with the version): each fold's weights.
        self.folds = 0
        self.fold_weights: dict[int, list[float]] = {}

    def score(self, prompts: Sequence[str], completions: Sequence[str], *, batch_size: int = 32) -> list[float]:
        if not prompts:
            return []
        return self.head.score(self._features(prompts, completions, batch_size=batch_size))

    def fold_fitted(self, prompt: str) -> bool:
        """Whether a fit that never saw this prompt's pairs exists (crossval_accuracy ranks a
        pair only then)."""
        return prompt_fold(prompt, self.folds) in self.fold_weights if self.folds else False

    def score_out_of_fold(self, prompts: Sequence[str], completions: Sequence[str], keys: Sequence[str],
                          *, batch_size: int = 32) -> list[float]:
        """Scores as `score`, but each by the fold's weights that never saw its group's pairs
        (`out_of_fold_scores`; `keys`: the items' prompts, which their folds are of); `score`
        itself when the fit was not cross-validated."""
        if not self.fold_weights:
            return self.score(prompts, completions, batch_size=batch_size)
        if not prompts:
            return []
        head = self.head
        z = [[(x - m) / s for x, m, s in zip(f, head.mean, head.std, strict=True)]
             for f in self._features(prompts, completions, batch_size=batch_size)]
        return out_of_fold_scores(z, keys, weights=self.fold_weights, folds=self.folds, fallback=head.weights)

    def _features(self, prompts: Sequence[str], completions: Sequence[str], *, batch_size: int) -> list[list[float]]:
        return likelihood_features(self.model, self.tokenizer, prompts, completions, max_length=self.head.max_length,
                                   answer_pattern=self.head.answer_pattern, batch_size=batch_size)


def likelihood_model_load(path: str) -> LikelihoodScorer:
    head = LikelihoodHead.load(Path(path))
    model, tokenizer = causal_lm_load(head.base)
    return LikelihoodScorer(head, model, tokenizer)


def _response_template(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The token ids the chat template opens the assistant turn with (what follows the
    prompt in every training sequence); [] for a tokenizer without a template."""
    if not getattr(tokenizer, "chat_template", None):
        return []
    chat = [{"role": "user", "content": "x"}]
    opened = rm_prompt_ids(tokenizer, "x")
    closed = list(tokenizer(tokenizer.apply_chat_template(chat, add_generation_prompt=False, tokenize=False),
                            add_special_tokens=False)["input_ids"])
    return opened[len(closed):] if opened[:len(closed)] == closed else []


def likelihood_model_export(*, source: str | Path, out: str | Path, scale: float, offset: float) -> Path:
    """Write the version at `source` as a directory `AutoModelForSequenceClassification`
    loads with `trust_remote_code=True` (workers/reward/likelihood_hf.py, copied in): the pinned
    base's weights, the head and the calibration (`scale`, `offset`) in its config, the
    tokenizer. Written atomically."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source, out = Path(source), Path(out)
    head = LikelihoodHead.load(source)
    tokenizer = AutoTokenizer.from_pretrained(source)
    try:
        lm = AutoModelForCausalLM.from_pretrained(head.base, dtype=torch.float32)
    except OSError as exc:  # the pinned base checkpoint was deleted or is on another host's storage
        raise ExportFailed(f"the reward model's base {head.base} cannot be loaded: {exc}") from None
    config = LikelihoodRewardConfig(
        lm_config=lm.config.to_dict(), mean=head.mean, std=head.std, weights=head.weights,
        answer_pattern=head.answer_pattern, max_length=head.max_length, response_template=_response_template(tokenizer),
        calibration={"scale": scale, "offset": offset}, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    # auto_map in config.json, and this module copied beside the weights.
    LikelihoodRewardConfig.register_for_auto_class()
    LikelihoodRewardModel.register_for_auto_class("AutoModelForSequenceClassification")
    model = LikelihoodRewardModel(config)
    model.lm.load_state_dict(lm.state_dict())
    tmp = atomic_dir(out)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    return atomic_dir_commit(tmp, out)
