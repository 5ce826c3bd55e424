"""How well the run's learned reward model ranks held-out pairs, by kind, base and labels.

The reward model of `learned` runs, of each kind (`reward_model.kind`): `likelihood`
(workers/reward/likelihood.py `likelihood_model_fit`: the base's token log-likelihoods weighed by a
Bradley-Terry model) and `classifier` (workers/reward/trainer.py `reward_model_fit`: TRL
RewardTrainer) — the same calls the `reward` worker makes — is fitted on preference pairs
made the way the run makes them from ratings: the steering bench's scripted rater rates each
sampled completion of the demo taskset 5 when its `<answer>` is right and 1 when it is wrong,
whole groups at a time (the selection rule hands out groups as blocks), and every rated
member of a group is preferred over each lower-rated one. Held-out pairs come from prompts
the model never saw (a separate set of groups), as `pair_is_heldout` splits them in a run.

Completions are sampled from the demo model (the policy of the steering bench) at
temperature 1, 8 per prompt, as the explorer samples them. Bases compared:
- `policy`: the demo model itself (the default base of the demo's reward model);
- `judge`: the same recipe warmed up until it solves 90% of the held-out problems (a
  stronger model as the reward model's base, as deployments pick a larger judge). It brings
  its own knowledge of right answers, which the steering bench's premise (correctness comes
  from people only) does not allow; it is here to tell "the base does not know" from "a scalar
  head on the last token cannot read what the base knows".

Each base's ranking by its own log-likelihood of the completion is printed beside it: what
the base knows. Measured 2026-11 (seeds 0 and 1, load 12-16): trained reward models 0.41-0.46
(policy) and 0.44 (judge) at 200 labels; at 800 labels (seed 0, 4 epochs) 0.55 (policy, lr 1e-4)
and 0.61 (judge, lr 3e-4); log-likelihood rankings 0.66-0.69 (policy) and 0.97-0.98 (judge); a linear probe of the
judge's hidden states at each of the last 8 positions 0.47-0.53. The knowledge is in the
token likelihoods, not where a sequence classifier's head reads it.

The `likelihood` kind reads it there. Measured 2026-11-22 (seeds 0 and 1, load 6.3-7.1):
base policy 0.685 / 0.658 at 100 labels, 0.686 / 0.659 at 200, 0.686 / 0.659 at 400 (what the
demo model itself knows: its own log-likelihood ranking is 0.688 / 0.658); base judge 0.983 /
0.983 at 100 and 200 labels, 0.983 / 0.980 at 400; 2-5 s per fit. The target is met with the
judge base only; over the policy base no kind gets past what the policy knows.

    python -m bench reward_model [--labels 100,200,400] [--bases policy,judge] [--seeds 0,1]
                                 [--kinds likelihood,classifier,head,mlp]
                                 [--rater SPEC | --raters generated:N [--raters-start 0]] [--max-tokens 12]
                                 [--problems N] [--heldout-groups 96]

Any registered kind is fitted as the reward worker fits it (`workers/reward/kinds`, no folds: the
held-out groups are the split; `--epochs`: the passes of the kinds that train the base, `lora`).
Each fit's line gives its wall and CPU seconds. Measured 2026-11-26 on the drawn family
(`--raters generated:8 --labels 200 --bases policy --max-tokens 32`, seeds 0 / 1, load 0.3-19),
held-out accuracy median and mixed-preference mean, CPU s per fit: `head` 0.797 / 0.807 and
0.755 / 0.752, 4-7 s; `mlp` 0.825 / 0.834 and 0.792 / 0.783, 6-11 s; `lora` 0.813 / 0.833 and
0.792 / 0.784, 24-35 s (bench/README.md). `--rater` / `--raters generated:N` label the same completions by
another preference (bench/steering's, or the drawn family of bench.raters, issue 47) in place of
the correctness rater: the training labels carry the preference's own noise, the held-out pairs
are the preference itself; over a family the summary gives each kind's median over the
preferences and the mixed ones' (style with correctness) mean apart.

Target (issue 16): held-out pairwise accuracy >= 0.85 at the labels a `rm10` steering arm
collects (about 200). The last line prints it.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import DEMO_DIR, ROOT, setup_django

JUDGE_DIR = Path(os.environ.get("BENCH_JUDGE_DIR", str(ROOT / ".cache" / "demo-judge")))
GROUP = 8
HELDOUT_GROUPS = 96
ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")


def judge_settings() -> Any:
    from workers.models.demo import DemoSettings

    # A judge of arithmetic: bare answers only (styles would only lengthen its long warm-up).
    return DemoSettings(target_accuracy=0.9, steps=3000, styled=0.0)


def rollouts(model_dir: Path, *, seed: int, max_tokens: int = 12, problems: int | None = None) -> list[dict[str, Any]]:
    """GROUP completions per taskset problem (the first `problems` of them; all by default),
    sampled at temperature 1, labelled as the scripted rater labels them (5 right, 1 wrong;
    `rated` relabels them by another rater)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workers.models.demo import DemoSettings, problem_encode, problems_split, answer_of, problem_text

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    taskset = problems_split(DemoSettings())[2][:problems]
    out: list[dict[str, Any]] = []
    for start in range(0, len(taskset), 32):
        chunk = taskset[start:start + 32]
        prompts = [problem_encode(tokenizer, p)[0] for p in chunk]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.no_grad():
            gen = model.generate(input_ids=ids.repeat_interleave(GROUP, 0), attention_mask=mask.repeat_interleave(GROUP, 0),
                                 max_new_tokens=max_tokens, do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
        for i, row in enumerate(gen[:, width:].tolist()):
            problem = chunk[i // GROUP]
            text = tokenizer.decode(row, skip_special_tokens=True)
            found = ANSWER.search(text)
            right = bool(found and int(found.group(1)) == answer_of(*problem))
            out.append({"group": f"g{start + i // GROUP}", "prompt": problem_text(*problem), "completion": text,
                        "score": 5 if right else 1})
    return out


def rated(rows: list[dict[str, Any]], rating: Any, *, noise: float = 0.0, seed: int = 0) -> list[dict[str, Any]]:
    """The rows rated by `rating` (prompt, completion) -> 1..5, each rating replaced by a random
    one with probability `noise` (a drawn preference's own noise: the training labels)."""
    rng = random.Random(seed)
    out = []
    for r in rows:
        score = rating(r["prompt"], r["completion"])
        if noise and rng.random() < noise:
            score = rng.randint(1, 5)
        out.append({**r, "score": score})
    return out


def kind_fit(kind: str, *, base: str, train: list[Any], heldout: list[Any], seed: int, epochs: int = 6) -> float | None:
    """A registered kind's fit as the reward worker makes it (workers/reward/kinds), held-out
    accuracy on `heldout` (no folds: the bench's held-out groups are the split). `epochs`: the
    passes of the kinds that train the base (`lora`), bench/steering's 6 by default."""
    from kernel.config import RewardModelConfig
    from workers.reward.kinds import reward_kind_impl

    cfg = RewardModelConfig(enabled=True, kind=kind, base=base, max_length=64, crossval_folds=0, epochs=epochs)
    with tempfile.TemporaryDirectory(prefix="rm-bench-") as tmp:
        return reward_kind_impl(kind).fit(cfg=cfg, base=base, train=train, heldout=heldout, out=Path(tmp),
                                          seed=seed).accuracy


def rating_pairs(rows: list[dict[str, Any]]) -> list[Any]:
    """Within each group, every higher-rated member over every lower-rated one (as
    apps.feedback.reward_model.preferences pairs ratings)."""
    from apps.rewards.pairs import PreferencePair

    pairs = []
    by_group: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for i, r in enumerate(rows):
        by_group.setdefault(r["group"], []).append((i, r))
    for group, members in by_group.items():
        for i, a in members:
            for j, b in members:
                if a["score"] > b["score"]:
                    pairs.append(PreferencePair(prompt=a["prompt"], chosen=a["completion"], rejected=b["completion"],
                                                chosen_id=i, rejected_id=j, group_id=group, kind="rating",
                                                margin=(a["score"] - b["score"]) / 4))
    return pairs


def likelihood_accuracy(base: Path, rows: list[dict[str, Any]], groups: set[str]) -> float:
    """Held-out pairwise accuracy of ranking by the base's own log-likelihood of the
    completion: what the base knows about right answers, whether or not a scalar head on its
    last token can read it (a diagnostic, not a reward model)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workers.reward.scorers import rm_text

    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    loglik: dict[int, float] = {}
    for i, r in enumerate(rows):
        if r["group"] not in groups:
            continue
        ids = tokenizer(rm_text(tokenizer, r["prompt"], r["completion"]), add_special_tokens=False,
                        return_tensors="pt")["input_ids"]
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": r["prompt"]}], tokenize=False,
                                               add_generation_prompt=True)
        start = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        with torch.no_grad():
            logits = model(ids).logits[0, :-1]
        token_lp = torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None])[:, 0]
        loglik[i] = float(token_lp[start - 1:].sum())
    hits = total = 0.0
    for p in rating_pairs(rows):
        if p.group_id not in groups:
            continue
        total += 1
        c, r_ = loglik[p.chosen_id], loglik[p.rejected_id]
        hits += 1.0 if c > r_ else 0.5 if c == r_ else 0.0
    return hits / total if total else float("nan")


def _fit(kind: str, *, base: str, train: list[Any], heldout: list[Any], seed: int, args: argparse.Namespace) -> float:
    from workers.reward.likelihood import likelihood_model_fit
    from workers.reward.trainer import reward_model_fit

    with tempfile.TemporaryDirectory(prefix="rm-bench-") as tmp:
        if kind == "likelihood":
            _, acc = likelihood_model_fit(base=base, train=train, heldout=heldout, out=Path(tmp), max_length=64)
        elif kind == "classifier":
            _, _, acc = reward_model_fit(base=base, train=train, heldout=heldout, out=Path(tmp), epochs=args.epochs,
                                         learning_rate=args.lr, batch_size=16, max_length=64, seed=seed)
        else:
            acc = kind_fit(kind, base=base, train=train, heldout=heldout, seed=seed, epochs=args.epochs)
    return acc if acc is not None else float("nan")


def _preferences(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[tuple[str, Any, float, bool]]:
    """(name, rating, noise, mixes correctness in) per preference the labels come from: the
    correctness rater by default, --rater's, or --raters generated:N's drawn ones."""
    from bench.raters import GeneratedRater, correct, preference_family, rater_load

    if args.raters:
        count = args.raters.removeprefix("generated:")
        if not args.raters.startswith("generated:") or not count.isdigit():
            parser.error(f"--raters {args.raters!r}: expected generated:N")
        return [(f"generated:{p.seed}", p, p.noise, p.mixed)
                for p in preference_family(int(count), start=args.raters_start)]
    if args.rater is None:
        return [("correct", correct, 0.0, True)]
    try:
        rating = rater_load(args.rater)
    except ValueError as exc:
        parser.error(str(exc))
    drawn = rating if isinstance(rating, GeneratedRater) else None
    return [(args.rater, rating, drawn.noise if drawn else 0.0, bool(drawn and drawn.mixed))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--labels", default="100,200,400")
    parser.add_argument("--bases", default="policy,judge")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--kinds", default="likelihood,classifier",
                        help="reward-model kinds (reward_model.kind): likelihood, classifier, head, mlp, ...")
    parser.add_argument("--rater", default=None,
                        help="label by this rater (bench/steering's --rater: MODULE:FUNCTION or generated:SEED) in "
                             "place of the correctness rater")
    parser.add_argument("--raters", default=None, metavar="generated:N",
                        help="label by each of N drawn preferences (bench.raters.preference_family) in turn")
    parser.add_argument("--raters-start", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=12,
                        help="sampled completion length (the styled answers a drawn preference reads take up to ~25)")
    # The measurement samples every taskset problem and holds 96 groups out; a smoke test
    # samples and holds out a few (each fit's held-out features were most of its time).
    parser.add_argument("--problems", type=int, default=None,
                        help="sample only the taskset's first N problems (default: all 256)")
    parser.add_argument("--heldout-groups", type=int, default=HELDOUT_GROUPS,
                        help=f"held-out groups (prompts) the accuracy is read on (default {HELDOUT_GROUPS})")
    args = parser.parse_args()
    most = max(int(x) for x in args.labels.split(","))
    if args.problems is not None and args.heldout_groups + -(-most // GROUP) > args.problems:
        parser.error(f"--problems {args.problems}: fewer than the {args.heldout_groups} held-out groups and the "
                     f"{-(-most // GROUP)} groups {most} labels take")
    preferences = _preferences(parser, args)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    setup_django(migrate=False)
    import logging

    import torch

    from workers.models.demo import demo_model_build

    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    policy = demo_model_build(out=DEMO_DIR, progress=False, log=lambda _: None).out
    bases = {"policy": policy}
    if "judge" in args.bases.split(","):
        built = demo_model_build(out=JUDGE_DIR, settings=judge_settings(), progress=False, log=print)
        print(f"judge base: greedy accuracy {built.accuracy:.3f}", flush=True)
        bases["judge"] = built.out
    kinds = args.kinds.split(",")
    # (kind/base, preference, labels, seed, accuracy, train pairs)
    results: list[tuple[str, str, int, int, float, int]] = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        sampled = rollouts(policy, seed=seed, max_tokens=args.max_tokens, problems=args.problems)
        groups = sorted({r["group"] for r in sampled})
        random.Random(seed).shuffle(groups)
        heldout_groups = set(groups[:args.heldout_groups])
        for pref, rating, noise, mixed in preferences:
            # Held out: the preference itself; trained on: its labels as a person gives them (its noise).
            rows = rated(sampled, rating)
            labelled = rated(sampled, rating, noise=noise, seed=seed)
            heldout = rating_pairs([r for r in rows if r["group"] in heldout_groups])
            liked = sum(r["score"] >= 4 for r in rows) / len(rows)
            print(f"seed {seed} {pref}{' (mixed)' if mixed else ''}: {len(rows)} completions, {liked:.3f} rated 4-5, "
                  f"{len(heldout)} held-out pairs, noise {noise:g}", flush=True)
            if len(preferences) == 1 and "likelihood" in kinds:
                for name in args.bases.split(","):
                    print(f"  base {name:<7} ranking by its own completion log-likelihood (diagnostic): held-out "
                          f"accuracy {likelihood_accuracy(bases[name], rows, heldout_groups):.3f}", flush=True)
            for labels in [int(x) for x in args.labels.split(",")]:
                train_groups = set(groups[args.heldout_groups:args.heldout_groups + labels // GROUP])
                train = rating_pairs([r for r in labelled if r["group"] in train_groups])
                random.Random(seed).shuffle(train)
                for name in args.bases.split(","):
                    for kind in kinds:
                        started, cpu = time.perf_counter(), time.process_time()
                        acc = _fit(kind, base=str(bases[name]), train=train, heldout=heldout, seed=seed, args=args) \
                            if train and heldout else float("nan")
                        results.append((f"{kind}/{name}", pref, labels, seed, acc, len(train)))
                        print(f"  {kind:<10} base {name:<7} labels {labels:4d}  train pairs {len(train):4d}  held-out "
                              f"accuracy {acc:.3f}  {time.perf_counter() - started:5.0f} s ({time.process_time() - cpu:4.0f} cpu s)  "
                              f"load {os.getloadavg()[0]:.1f}", flush=True)
    _summary(results, kinds=kinds, bases=args.bases.split(","), labels=[int(x) for x in args.labels.split(",")],
             mixed={p for p, _, _, m in preferences if m}, family=len(preferences) > 1)


def _summary(results: list[tuple[str, str, int, int, float, int]], *, kinds: list[str], bases: list[str],
             labels: list[int], mixed: set[str], family: bool) -> None:
    """Per kind/base and label count: the held-out accuracy's mean over seeds (and, over a
    family, its median over preferences, the mixed ones' and the others' apart); the verdict
    line at the first count of at least 200 labels (a rm10 arm's, about 180)."""
    print()
    names = [f"{kind}/{name}" for kind in kinds for name in bases]

    def accs(name: str, lab: int, prefs: set[str] | None = None) -> list[float]:
        return [a for n, p, la, _, a, _ in results if n == name and la == lab and (prefs is None or p in prefs)
                and not math.isnan(a)]

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else float("nan")

    prefs = sorted({p for _, p, _, _, _, _ in results})
    for name in names:
        for lab in labels:
            every = accs(name, lab)
            line = (f"{name:<18} labels {lab:4d}: held-out accuracy mean {mean(every):.3f} (min {min(every, default=0):.3f}, "
                    f"max {max(every, default=0):.3f}, {len(every)} fits)")
            if family:
                per = {p: mean(accs(name, lab, {p})) for p in prefs if accs(name, lab, {p})}
                mix = [v for p, v in per.items() if p in mixed]
                style = [v for p, v in per.items() if p not in mixed]
                line += (f"; median over preferences {statistics.median(per.values()):.3f}, mixed {mean(mix):.3f} "
                         f"({len(mix)}), style only {mean(style):.3f} ({len(style)}): "
                         + " ".join(f"{p.removeprefix('generated:')}={v:.2f}" for p, v in per.items()))
            print(line)
    first = min((x for x in labels if x >= 200), default=max(labels))
    for name in names:
        print(f"reward model {name}: held-out pairwise accuracy at {first} labels {mean(accs(name, first)):.3f}"
              + (f", on the mixed preferences {mean(accs(name, first, mixed)):.3f}" if family else ""))
    best = max(names, key=lambda n: mean(accs(n, first)))
    print(f"reward model held-out pairwise accuracy at {first} labels: {mean(accs(best, first)):.3f} with {best} "
          f"(kind/base; target >= 0.85); load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
