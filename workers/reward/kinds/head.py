"""`head`, the default kind: an ensemble of linear scalar heads on the pooled hidden states
of the run's own model (its base, or the policy's checkpoint), the base frozen.

Features of one (prompt, completion), tokenised as the trainer tokenises it (the prompt
through the chat template, the completion's tokens, then eos), pooled over the completion's
tokens: the token embeddings' mean and maximum (which words it uses: a house word, a format's
markers), the last hidden layer's mean and its state at the last token (what the model makes of
the answer in context), and the log of the token count (its length). They are standardised on
the training completions. (On a crafted preference for completions containing one word, 45
pairs over the demo model: 0.82-0.84 held-out pairwise accuracy with the last layer alone,
1.00 with the embeddings' pools beside it.) Each of `ensemble` heads is fitted with the Bradley-Terry loss
(P(chosen ≻ rejected) = σ(w · (z_chosen − z_rejected)), L2 `l2`, L-BFGS, each pair weighted by
its margin and trust) on its own bootstrap sample of the pairs. A completion's raw score is the
heads' mean, its spread their standard deviation: where the heads disagree, a label teaches
the most (the selection rule's uncertainty).

Why this and not TRL's RewardTrainer from the start: with tens of labels a whole network
(the `classifier` kind) overfits or learns nothing, while a few thousand head weights on
features the model already has learn a style (a word, a format, a length) from that many
pairs, in seconds on a CPU. The base is pinned in the version's `head_reward.json`, so a
later policy checkpoint does not change what a version means.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from workers.reward.kinds import reward_kind_impl_register
from workers.reward.kinds.base_model import rm_chunks, rm_rows
from workers.reward.kinds.ensemble import Ensemble, EnsembleKind, Rows
from workers.reward.kinds.pair_fit import bootstrap_weights, bradley_terry_fit

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

HEAD_FILE = "head_reward.json"
KIND = "head"
POOLING = "embedding-mean+embedding-max+mean+last+log-length"


def hidden_features(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str],
                    completions: Sequence[str], *, max_length: int, batch_size: int = 32) -> list[list[float]]:
    """One pooled feature vector per (prompt, completion), over the completion's tokens: the
    token embeddings' mean and maximum (which words it uses), the last hidden layer's mean
    and its state at the last token (what the model makes of it in context), and the log of
    its token count (its length)."""
    import torch

    rows = rm_rows(tokenizer, prompts, completions, max_length=max_length)
    backbone = getattr(model, "base_model", model)
    out: list[list[float]] = []
    for chunk, input_ids, mask in rm_chunks(rows, tokenizer=tokenizer, device=model.device, batch_size=batch_size):
        with torch.inference_mode():
            result = backbone(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
            embedded = result.hidden_states[0].float()
            # The backbone's output is after its final norm; a model without one gives its last layer.
            last = getattr(result, "last_hidden_state", None)
            hidden = (last if last is not None else result.hidden_states[-1]).float()
            for row, (ids, cut, _) in enumerate(chunk):
                cut = min(cut, len(ids) - 1)
                words = embedded[row, cut:len(ids)]
                pooled = torch.cat([words.mean(0), words.max(0).values, hidden[row, cut:len(ids)].mean(0),
                                    hidden[row, len(ids) - 1],
                                    torch.tensor([math.log1p(len(ids) - cut)], device=hidden.device)])
                out.append(pooled.cpu().tolist())
    return out


class HeadEnsemble(Ensemble[list[float]]):
    """The heads: one weight per standardised feature each; a head's score is w · z."""

    FILE = HEAD_FILE
    KIND = KIND
    NOUN = "a head"
    POOLING = POOLING
    MEMBERS_KEY = "heads"

    def member_scores(self, z: Rows, members: Sequence[list[float]]) -> torch.Tensor:
        import torch

        return torch.tensor(z, dtype=torch.float64) @ torch.tensor(members, dtype=torch.float64).T

    def members_mean(self, z: Rows, members: Sequence[list[float]]) -> list[float]:
        return [sum(sum(w * x for w, x in zip(h, row, strict=True)) for h in members) / len(members) for row in z]

    @classmethod
    def member_load(cls, raw: object) -> list[float]:
        return cast("list[float]", raw)


@reward_kind_impl_register
class Head(EnsembleKind[list[float]]):
    name = "head"

    def ensemble_type(self) -> type[HeadEnsemble]:
        return HeadEnsemble

    def features(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str],
                 completions: Sequence[str], *, ensemble: Ensemble[list[float]],
                 batch_size: int = 32) -> list[list[float]]:
        return hidden_features(model, tokenizer, prompts, completions, max_length=ensemble.max_length,
                               batch_size=batch_size)

    def members_fit(self, chosen: Rows, rejected: Rows, weight: list[float], *, count: int, l2: float,
                    seed: int) -> list[list[float]]:
        """`count` Bradley-Terry heads (L-BFGS, L2 `l2`), each on its bootstrap sample."""
        out = []
        for counts in bootstrap_weights(len(chosen), heads=count, seed=seed):
            keep = [i for i, c in enumerate(counts) if c > 0]
            out.append(bradley_terry_fit([chosen[i] for i in keep], [rejected[i] for i in keep],
                                         [weight[i] * counts[i] for i in keep], l2=l2))
        return out
