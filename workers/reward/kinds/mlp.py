"""`mlp`: an ensemble of small two-layer networks on the pooled hidden states of every layer
of the run's own model (its base, or the policy's checkpoint), the base frozen.

Features of one (prompt, completion), tokenised as `head` tokenises it, pooled over the
completion's tokens: each hidden layer's mean (the embeddings, every block's output, the
final state after the model's norm), the embeddings' maximum (which words it uses), the final
state at the last token, the log of the token count, and the base's log-likelihood statistics
of the completion (the `likelihood` kind's: sum, mean, least, and over the answer span,
`reward_model.answer_pattern`: what the base knows of a right answer); standardised on the
training completions. A network's score is v · z + w₂ · tanh(W₁ z + b₁): the linear part is `head`'s
(on more layers), the hidden units learn what no weighted sum of the features can, such as
a preference for one of two forms but not both, or a form only on a right answer. Each of
`ensemble` networks is fitted with the Bradley-Terry loss (each pair weighted by its margin
and trust, L2 `l2` on every weight, Adam, full batch) on its own bootstrap sample of the
pairs; the score is their mean, the spread their standard deviation. With
`crossval_folds`, each fold of prompts gets its own networks fitted without it, and the
held-out accuracy is out of fold, as `head`'s.

Why not the base fine-tuned with LoRA (TRL's RewardTrainer, the `classifier` kind on a
whole network): from the 100-200 pairs a run collects, a whole network overfits (bench/
README.md's "Steering: the rounds": 0.60-0.67 against the head's 0.69-0.75 on the same 150 pairs), while
a few tens of thousands of weights on features the base already computes fit in a second
or two on a CPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, cast

from workers.reward.kinds import reward_kind_impl_register
from workers.reward.kinds.base_model import rm_chunks, rm_rows
from workers.reward.kinds.ensemble import Ensemble, EnsembleKind, Rows
from workers.reward.kinds.pair_fit import bootstrap_weights
from workers.reward.logprob_features import features_of

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from apps.runs.ports import RewardModelConfig

MLP_FILE = "mlp_reward.json"
KIND = "mlp"
POOLING = "layer-means+embedding-max+last+log-length+likelihood"
# Hidden units per network, and the optimiser's full-batch steps.
HIDDEN = 32
STEPS = 300


def layer_features(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str],
                   completions: Sequence[str], *, max_length: int, answer_pattern: str | None = None,
                   batch_size: int = 32) -> list[list[float]]:
    """One pooled feature vector per (prompt, completion), over the completion's tokens: every
    hidden layer's mean, the embeddings' maximum, the final state at the last token, the log
    of the token count, and the base's log-likelihood statistics of the completion (the
    `likelihood` kind's: sum, mean, least, over the answer span; what the base knows of a
    right answer)."""
    import torch

    rows = rm_rows(tokenizer, prompts, completions, max_length=max_length, answer_pattern=answer_pattern)
    out: list[list[float]] = []
    for chunk, input_ids, mask in rm_chunks(rows, tokenizer=tokenizer, device=model.device, batch_size=batch_size):
        with torch.inference_mode():
            result = model(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
            layers = [h.float() for h in result.hidden_states]  # the last one after the model's final norm
            token_lp = torch.log_softmax(result.logits.float()[:, :-1], -1).gather(2, input_ids[:, 1:, None])[..., 0]
            for row, (ids, cut, span) in enumerate(chunk):
                cut = min(cut, len(ids) - 1)
                where = slice(cut, len(ids))
                pooled = [h[row, where].mean(0) for h in layers]
                pooled += [layers[0][row, where].max(0).values, layers[-1][row, len(ids) - 1],
                           torch.tensor([math.log1p(len(ids) - cut)], device=layers[0].device)]
                # Position t of token_lp is the log-probability of token t + 1.
                lp = token_lp[row, max(cut, 1) - 1:len(ids) - 1].tolist()
                pooled.append(torch.tensor(features_of(lp, span), device=layers[0].device))
                out.append(torch.cat(pooled).cpu().tolist())
    return out


@dataclass
class Net:
    """One network's weights: score(z) = v · z + w2 · tanh(w1 z + b1)."""

    w1: list[list[float]]
    b1: list[float]
    w2: list[float]
    v: list[float]

    @classmethod
    def from_stored(cls, raw: object) -> Net:
        stored = cast("dict[str, list[float]]", raw)
        return cls(w1=cast("list[list[float]]", stored["w1"]), b1=stored["b1"], w2=stored["w2"], v=stored["v"])


def nets_scores(nets: Sequence[Net], z: torch.Tensor) -> torch.Tensor:
    """(items, nets): each network's score of each standardised feature row."""
    import torch

    cols = []
    for net in nets:
        w1, b1 = torch.tensor(net.w1, dtype=z.dtype), torch.tensor(net.b1, dtype=z.dtype)
        w2, v = torch.tensor(net.w2, dtype=z.dtype), torch.tensor(net.v, dtype=z.dtype)
        cols.append(z @ v + torch.tanh(z @ w1.T + b1) @ w2)
    return torch.stack(cols, 1)


def net_fit(chosen: Rows, rejected: Rows, weight: list[float], *, l2: float,
            seed: int, hidden: int = HIDDEN, steps: int = STEPS) -> Net:
    """One network maximising Σ weight · log σ(s(chosen) − s(rejected)) − l2 · |weights|²
    (the weights normalised to sum 1, as `head`'s Bradley-Terry fit)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    c, r = torch.tensor(chosen, dtype=torch.float32), torch.tensor(rejected, dtype=torch.float32)
    wt = torch.tensor(weight, dtype=torch.float32)
    wt = wt / wt.sum().clamp_min(1e-12)
    d = c.shape[1]
    w1 = (torch.randn(hidden, d, generator=g) / math.sqrt(d)).requires_grad_()
    b1 = torch.zeros(hidden, requires_grad=True)
    w2 = (torch.randn(hidden, generator=g) / math.sqrt(hidden)).requires_grad_()
    v = torch.zeros(d, requires_grad=True)
    params = [w1, b1, w2, v]
    optimizer = torch.optim.Adam(params, lr=1e-2)

    def score(x: torch.Tensor) -> torch.Tensor:
        return x @ v + torch.tanh(x @ w1.T + b1) @ w2

    for _ in range(steps):
        optimizer.zero_grad()
        loss = -(wt * torch.nn.functional.logsigmoid(score(c) - score(r))).sum()
        loss = loss + l2 * sum((p * p).sum() for p in (w1, w2, v))
        loss.backward()
        optimizer.step()
    return Net(w1=w1.detach().tolist(), b1=b1.detach().tolist(), w2=w2.detach().tolist(), v=v.detach().tolist())


class MlpEnsemble(Ensemble[Net]):
    """The networks; features are standardised in float32, as the networks were fitted."""

    FILE = MLP_FILE
    KIND = KIND
    NOUN = "an mlp"
    POOLING = POOLING
    MEMBERS_KEY = "nets"
    READS_ANSWER = True

    def standardise(self, features: Rows) -> list[list[float]]:
        import torch

        x = torch.tensor(features, dtype=torch.float32)
        standardised: list[list[float]] = ((x - torch.tensor(self.mean)) / torch.tensor(self.std)).tolist()
        return standardised

    def member_scores(self, z: Rows, members: Sequence[Net]) -> torch.Tensor:
        import torch

        return nets_scores(members, torch.tensor(z, dtype=torch.float32)).double()

    def member_dump(self, member: Net) -> object:
        return asdict(member)

    @classmethod
    def member_load(cls, raw: object) -> Net:
        return Net.from_stored(raw)


@reward_kind_impl_register
class Mlp(EnsembleKind[Net]):
    name = "mlp"

    def ensemble_type(self) -> type[MlpEnsemble]:
        return MlpEnsemble

    def features(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str],
                 completions: Sequence[str], *, ensemble: Ensemble[Net], batch_size: int = 32) -> list[list[float]]:
        return layer_features(model, tokenizer, prompts, completions, max_length=ensemble.max_length,
                              answer_pattern=ensemble.answer_pattern, batch_size=batch_size)

    def members_fit(self, chosen: Rows, rejected: Rows, weight: list[float], *, count: int, l2: float,
                    seed: int) -> list[Net]:
        """`count` networks, each on its bootstrap sample of the pairs given."""
        out = []
        for i, counts in enumerate(bootstrap_weights(len(chosen), heads=count, seed=seed)):
            keep = [k for k, n in enumerate(counts) if n > 0]
            out.append(net_fit([chosen[k] for k in keep], [rejected[k] for k in keep],
                               [weight[k] * counts[k] for k in keep], l2=l2, seed=seed * 1000 + i))
        return out

    def answer_pattern(self, cfg: RewardModelConfig) -> str | None:
        return cfg.answer_pattern or None
