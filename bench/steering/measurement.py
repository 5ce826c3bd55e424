"""What the bench measures, off the clock: a model's expected and greedy accuracy on the demo
model's held-out problems, its sampled completions read by a rater (`Sampled`: the preferred
share, the arithmetic in any style, the untagged share), an arm's result read by one rater
(`measured`), and what a `learned` arm's reward model did at each step (`StepProbe`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import median
from bench.raters import Rating
from bench.steering.people import RaterSpec
from kernel.preferences import ANSWER

# The demo model's held-out problems the measurements read (the first `--heldout` of them).
HELDOUT = 200


def held_out_accuracy(model_dir: str, tokenizer_dir: Path, heldout: int = HELDOUT) -> tuple[float, float]:
    """(expected, greedy) accuracy on the held-out problems. Gains are measured on the
    expected accuracy (the probability of sampling the right answer, what GRPO maximises):
    greedy accuracy over a few dozen steps is mostly trajectory luck (the learn helper's
    measurement, workers.models.demo.expected_accuracy)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workers.models.demo import DemoSettings, problems_split, expected_accuracy, greedy_accuracy

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    problems = problems_split(DemoSettings())[1][:heldout]
    expected = expected_accuracy(model=model, tokenizer=tokenizer, problems=problems)
    return expected, greedy_accuracy(model=model, tokenizer=tokenizer, problems=problems)


@dataclass(frozen=True)
class Sampled:
    """What a model's sampled completions on the held-out problems show."""

    # The share the rater rates 4 or 5: how often the model does what the rater prefers.
    share: float
    # The share whose `<answer>` is right, whatever the style around it.
    arithmetic: float
    # The share with no `<answer>` at all: where arithmetic falls because answers stop coming.
    untagged: float


def held_out_samples(model_dir: str, tokenizer_dir: Path, *, max_tokens: int, seed: int,
             samples: int = 4, heldout: int = HELDOUT) -> list[tuple[str, str]]:
    """(prompt, completion) for `samples` completions sampled per held-out problem
    (temperature 1, seeded): drawn once per model and read by every rater (`samples_rated`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workers.models.demo import DemoSettings, problem_encode, problems_split

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    problems = [p for p in problems_split(DemoSettings())[1][:heldout] for _ in range(samples)]
    torch.manual_seed(seed)
    out: list[tuple[str, str]] = []
    for start in range(0, len(problems), 200):
        chunk = problems[start:start + 200]
        prompts = [problem_encode(tokenizer, p)[0] for p in chunk]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.no_grad():
            generated = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=True,
                                       temperature=1.0, top_k=0, top_p=1.0)
        for prompt_ids, row in zip(prompts, generated[:, width:].tolist(), strict=True):
            out.append((tokenizer.decode(prompt_ids, skip_special_tokens=True),
                        tokenizer.decode(row, skip_special_tokens=True)))
    return out


def samples_rated(samples: list[tuple[str, str]], rating: Rating) -> Sampled:
    """The preferred share (rated 4 or 5), arithmetic accuracy and untagged share of `samples`.
    The expected accuracy counts the warm-up's four forms word for word, so a run that learns a
    form of its own would read as losing arithmetic there; this reads the answer in any style."""
    from bench.raters import correct as right

    liked = sum(1 for prompt, completion in samples if rating(prompt, completion) >= 4)
    rightly = sum(1 for prompt, completion in samples if right(prompt, completion) == 5)
    untagged = sum(1 for _, completion in samples if ANSWER.search(completion) is None)
    n = max(1, len(samples))
    return Sampled(share=liked / n, arithmetic=rightly / n, untagged=untagged / n)


@dataclass(frozen=True)
class StepProbe:
    """What one step of a `learned` arm did with its reward model, read from the rows the
    trainer is about to take (after the wait window's end): whether the gate let the reward
    model in and why, how many groups' advantages carry its scores, how large those are beside
    the format reward inside a group, and where the step's labels went."""

    version: int | None  # the newest reward-model version (None: none trained yet)
    accuracy: float | None  # its held-out (out-of-fold) pairwise accuracy
    heldout: int  # on how many held-out pairs
    bound: float | None  # the gate's lower bound of that accuracy
    open: bool  # the gate let a version score rewards this step
    weight: float  # the share of its calibrated score a reward carries (feedback.rm_gate evidence; 1 under bound)
    slope: float | None  # the calibration's slope (raw score -> the human scale) of the version in use
    groups: int
    rm_groups: int  # groups with at least one member rewarded by the reward model
    signal_groups: int  # groups whose reward-model rewards differ by >= SIGNAL (its signal reaches the advantages)
    rm_sd: float | None  # median over rm groups of the within-group sd of w_rm x calibrated score
    format_sd: float  # median over groups of the within-group sd of w_auto x format reward (all members)
    batch_sd: float  # the sd of every reward in the batch (the advantages' divisor under batch scaling)
    labels: dict[str, int]  # this step's ratings by hand-out source (rule, random, gold, arrival...)
    pairs_apart: int  # sibling pairs rated this step with different ratings (what teaches the reward model)
    pairs_alike: int  # sibling pairs rated alike


# A group's reward-model rewards differing by less than this (an eighth of the human scale,
# half a rating step) do not move its advantages beyond the format reward's and the noise.
SIGNAL = 0.125


def _sd(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return float((sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5)  # float ** float is Any in typeshed


def step_probe(run: Any, *, after_assignment: int) -> tuple[StepProbe, int]:
    """The probe of the step about to train, and the newest assignment id (the next step's
    labels are the assignments after it)."""
    from collections import defaultdict

    from apps.buffer.models import Experience
    from apps.feedback.reward_model.versions import (reward_model_latest, reward_model_lower_bound, reward_model_usable,
                                       reward_model_weight, rm_reward_score)
    from apps.feedback.models import Assignment
    from apps.rewards.models import RewardModel, RewardModelScore
    from kernel.fold import reward_learned

    feedback_cfg = run.cfg.feedback
    latest = reward_model_latest(run=run)
    usable = reward_model_usable(run=run)
    rows = list(Experience.objects.filter(run=run, is_expert=False, status=Experience.Status.READY)
                .values("pk", "group_id", "reward", "auto_reward", "human_reward"))
    weight = reward_model_weight(run=run, rm=usable) if usable is not None else 0.0
    # A group folds when a usable version first scores it (before people rate, by the version
    # then newest), so a member's reward may come from any version: each is checked.
    versions = {rm.pk: rm for rm in RewardModel.objects.filter(run=run)}
    weights = {pk: reward_model_weight(run=run, rm=rm) for pk, rm in versions.items()}
    scored: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for exp_id, rm_id, score in RewardModelScore.objects.filter(
            experience_id__in=[r["pk"] for r in rows]).values_list("experience_id", "reward_model_id", "score"):
        scored[exp_id].append((rm_id, score))
    groups: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        groups[row["group_id"]].append(row)
    rm_groups = signal_groups = pairs_apart = pairs_alike = 0
    rm_sds: list[float] = []
    format_sds: list[float] = []
    for members in groups.values():
        rm_parts = []
        for m in members:
            if m["human_reward"] is not None or m["reward"] is None:
                continue
            for rm_id, score in scored.get(m["pk"], []):
                part = rm_reward_score(rm=versions[rm_id], score=score, weight=weights[rm_id])
                # Rewarded by the reward model: its reward is the learned fold of this score.
                if abs(m["reward"] - reward_learned(feedback_cfg=feedback_cfg, auto=m["auto_reward"], rm=part)) < 1e-6:
                    rm_parts.append(feedback_cfg.w_rm * part)
                    break
        if rm_parts:
            rm_groups += 1
            rm_sds.append(_sd(rm_parts))
            signal_groups += max(rm_parts) - min(rm_parts) >= SIGNAL
        format_sds.append(_sd([feedback_cfg.w_auto * (m["auto_reward"] or 0.0) for m in members]))
        rated = [m["human_reward"] for m in members if m["human_reward"] is not None]
        for i, a in enumerate(rated):
            for b in rated[i + 1:]:
                if abs(a - b) > 1e-9:
                    pairs_apart += 1
                else:
                    pairs_alike += 1
    done = list(Assignment.objects.filter(run=run, pk__gt=after_assignment).values_list("pk", "source", "status"))
    labels: dict[str, int] = defaultdict(int)
    for _, source, status in done:
        if status == Assignment.Status.DONE:
            labels[source] += 1
    probe = StepProbe(
        version=latest.version if latest else None, accuracy=latest.accuracy if latest else None,
        heldout=latest.pairs_heldout if latest else 0,
        bound=reward_model_lower_bound(run=run, rm=latest) if latest else None, open=usable is not None, weight=weight,
        slope=usable.scale if usable else None, groups=len(groups), rm_groups=rm_groups, signal_groups=signal_groups,
        rm_sd=median(rm_sds) if rm_sds else None, format_sd=median(format_sds),
        batch_sd=_sd([r["reward"] for r in rows if r["reward"] is not None]), labels=dict(labels),
        pairs_apart=pairs_apart, pairs_alike=pairs_alike)
    return probe, max([after_assignment] + [pk for pk, _, _ in done])


def probe_line(p: StepProbe) -> str:
    gate = "-" if p.version is None else (
        f"v{p.version} {p.accuracy or 0:.2f}/{p.heldout} lb {p.bound or 0:.2f} "
        + (f"OPEN x{p.weight:.2f}" if p.open else "shut"))
    rm_sd = "-" if p.rm_sd is None else f"{p.rm_sd:.3f}"
    slope = "-" if p.slope is None else f"{p.slope:.2f}"
    budget = " ".join(f"{k} {v}" for k, v in sorted(p.labels.items())) or "none"
    return (f"gate {gate}  slope {slope}  groups rm {p.rm_groups}/{p.groups} signal {p.signal_groups}  "
            f"sd rm {rm_sd} format {p.format_sd:.3f} batch {p.batch_sd:.3f}  labels {budget}  "
            f"pairs apart {p.pairs_apart} alike {p.pairs_alike}")


def mean(values: list[float]) -> float:
    """The mean, NaN for none (a table's cell where no run gave the figure)."""
    return sum(values) / len(values) if values else float("nan")


def measured(raw: dict[str, Any], rater: RaterSpec, base: Sampled) -> dict[str, Any]:
    """An arm's result read by one rater: its preferred share, arithmetic and untagged share
    over the arm's final samples, against the base's for the same rater and seed."""
    after = samples_rated(raw["samples"], rater.rating)
    return {**raw, "rater": rater.name, "share": after.share, "share_gain": after.share - base.share,
            "arithmetic": after.arithmetic, "arithmetic_gain": after.arithmetic - base.arithmetic,
            "untagged": after.untagged}
