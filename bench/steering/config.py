"""The arms' run configs: the product's defaults (kernel.config) but for the overrides each arm
makes, each with its reason (`arm_config`), and the lines that show them at the bench's start."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernel.config import FeedbackSettings
from kernel.reward_kinds import reward_kind_get

# The gate of the rm10 / random10 / noisy arms unless --rm-gate says otherwise: the run config's
# own default, so that the bench measures what a run that names no gate does.
RM_GATE_DEFAULT: str = FeedbackSettings.model_fields["rm_gate"].default

ARMS = ("all", "rm10", "random10", "noisy")
# `auto` (a control, not in the default arms): the automatic correctness reward
# (math_accuracy) in place of people, `auto` mode; the rewards `all` gets from its rater,
# without the annotation path. `all` and `auto` apart means the human path loses signal.
# `format` (a control too): the format reward alone, no people: what `random10` trains on
# wherever no one rated (its wait window's fallback).


@dataclass(frozen=True)
class Override:
    """One setting an arm's run takes other than the product's default (kernel.config's
    `config_validate` of a config naming only the model): its dotted path, value and why."""

    path: str
    value: object
    reason: str


def size_overrides(*, tasks: int, repeat: int, steps: int, seed: int, repeat_reason: str = "--repeat",
                   tasks_reason: str = "--tasks", steps_reason: str = "--steps") -> list[Override]:
    """The run's size as both steering benches set it (bench/steering's arms and
    bench/live_steering's people run): `repeat` samples of each of `tasks` problems a step, one
    explore step's rollouts a train step, `steps` steps over enough epochs, at `seed`. The
    reasons name where `tasks` and `repeat` come from (a flag here, a constant there)."""
    return [
        Override("repeat_times", repeat, repeat_reason),
        Override("train_batch_size", tasks * repeat, "one explore step's rollouts per train step"),
        Override("total_steps", steps, steps_reason),
        Override("epochs", 4, f"enough passes over the demo taskset for --steps at {tasks_reason} a step"),
        Override("seed", seed, "--seeds"),
    ]


def arm_config(arm: str, *, model: str, steps: int, tasks: int, repeat: int, seed: int, lr: float,
               rm_base: str | None = None, min_rm_accuracy: float = 0.75, scale_rewards: str = "batch",
               rm_kind: str = "head", min_rm_heldout_pairs: int = 0,
               rm_confidence: float = 0.95, w_auto: float = 0.2, crossval_folds: int = 4,
               pairs: bool = True, trust: bool = True, max_tokens: int = 32,
               verifier: bool = False, beta: float = 0.0,
               rm_gate: str = RM_GATE_DEFAULT, selection: str = "active") -> tuple[dict[str, object], list[Override]]:
    """The run config of `arm` and the overrides it is made of: the product's defaults
    (kernel.config) with these settings, and nothing else, set (`overrides_print` shows them at
    the bench's start; tests/test_bench_steering_config.py checks that no other setting differs)."""
    if arm not in (*ARMS, "auto", "format"):
        raise SystemExit(f"unknown arm {arm!r}")
    loop = "the bench's loop explores, rates and trains in turn in this process"
    o = [
        Override("model", model, "the demo model (workers/models/demo), its styles at a minority share"),
        Override("engine", "transformers", "rollouts sampled in this process (no vLLM server)"),
        Override("algorithm", "grpo", "the figures are GRPO's"),
        Override("mode", "sync", loop),
        Override("sync_interval", 1, loop),
        Override("explore_batch_size", tasks, "--tasks"),
        *size_overrides(tasks=tasks, repeat=repeat, steps=steps, seed=seed),
        Override("sampling.temperature", 1.0, "sampled as the measurement samples"),
        Override("sampling.max_tokens", max_tokens, "--max-tokens"),
        # Only the format reward: correctness comes from people (or the model learned from them);
        # with `verifier`, the correctness check too (a team teaching a style keeps the verifier
        # it has for what it knows; people teach what it does not).
        Override("rewards", [{"name": "math_accuracy"}, {"name": "math_format"}] if verifier else [{"name": "math_format"}],
                 "the verifier beside people (--verifier on)" if verifier else
                 "the format reward alone: whatever the run learns of correctness it learns from people"),
        Override("trainer.learning_rate", lr, "--lr"),
        Override("trainer.params.loss_type", "grpo", "GRPO's own loss, as the earlier rounds measured"),
        # Advantages scaled by the batch's reward spread, not each group's: under per-group
        # scaling a group whose members a reward model scores nearly alike (all wrong, say) gets
        # its small differences blown up to unit-size advantages, i.e. trains on the model's noise.
        Override("trainer.params.scale_rewards", scale_rewards,
                 "--scale-rewards: per-group scaling blows a reward model's small differences up to unit advantages"),
        Override("trainer.params.beta", beta, "--beta: a KL penalty toward the base model (what no reward term checks)"),
    ]
    if arm == "auto":
        return config_nested(o + [Override("rewards", [{"name": "math_accuracy"}], "the automatic correctness reward in place of people"),
                            Override("feedback.mode", "auto", "no people (a control)")])
    if arm == "format":
        return config_nested(o + [Override("feedback.mode", "auto", "no people: the format reward alone (a control)")])
    wait = [Override("feedback.wait_seconds", 3600, "the bench ends each wait window itself after the raters' turn"),
            Override("feedback.fallback", "auto", "an unrated member keeps its automatic reward")]
    overlap = Override("feedback.overlap", 1, "one rating an item")
    weights = [Override("feedback.w_auto", w_auto, "--w-auto"), Override("feedback.w_human", 1.0, "a rating at full weight")]
    if arm == "all":
        if verifier:  # people's ratings beside the verifier, weighted as in the other arms
            return config_nested(o + [Override("feedback.mode", "blend", "people's ratings beside the verifier"),
                                *weights, overlap, *wait])
        return config_nested(o + [Override("feedback.mode", "human", "every rollout rated (the ceiling)"), overlap, *wait])
    if arm == "random10":
        return config_nested(o + [Override("feedback.mode", "blend", "ratings where given, the format reward elsewhere"),
                            *weights, overlap, *wait,
                            Override("feedback.selection.random_share", 1.0, "items chosen uniformly at random"),
                            Override("feedback.selection.pairs", False, "single items")])
    # A reward model steers only once it ranks held-out pairs well on enough of them: one at
    # chance folded into rewards trains the policy on noise (the round-5 arms lost accuracy).
    learned = [
        Override("feedback.mode", "learned", "the reward model, trained on the labels, scores the rest"),
        *weights, Override("feedback.w_rm", 1.0, "the reward model's score at full weight"),
        Override("feedback.min_rm_accuracy", min_rm_accuracy, "--min-rm-accuracy"),
        Override("feedback.min_rm_heldout_pairs", min_rm_heldout_pairs, "--min-rm-heldout-pairs"),
        Override("feedback.rm_accuracy_confidence", rm_confidence, "--rm-confidence"),
        Override("feedback.rm_gate", rm_gate, "--rm-gate"),
        overlap, *wait,
        # Active selection (the reward model's least sure sibling pairs and a fifth at random)
        # is the product's default (kernel.config.SelectionRule): nothing to override, but to
        # measure against the queue in arrival order, the default before 2026-11-28.
        *([Override("feedback.selection.uncertainty", 0.0, "--selection arrival: the queue in arrival order"),
           Override("feedback.selection.random_share", 0.0, "--selection arrival: no random share")]
          if selection == "arrival" else []),
        Override("feedback.selection.pairs", pairs, "--pairs"),
        Override("reward_model.enabled", True, "the learned arms' reward model"),
        Override("reward_model.kind", rm_kind, "--rm-kind"),
        Override("reward_model.base", rm_base or model, "--rm-base"),
        Override("reward_model.retrain_every", 16, "a new version every 16 new labels (every 2-3 steps at rm10's 6 labels a step)"),
        Override("reward_model.heldout_share", 0.25, "the held-out split of a kind without folds"),
        Override("reward_model.epochs", 6, "the reward model's training as the steering rounds measured it"),
        Override("reward_model.learning_rate", 3e-4, "the reward model's training as the steering rounds measured it"),
        Override("reward_model.batch_size", 16, "the reward model's training as the steering rounds measured it"),
        Override("reward_model.max_length", 64, "the demo's prompts and --max-tokens completions fit"),
        # a kind without folds (classifier, lora) measures on the held-out prompt split
        Override("reward_model.crossval_folds", crossval_folds if reward_kind_get(rm_kind).crossval else 0,
                 "--crossval-folds (0 for a kind without folds)"),
    ]
    if arm == "rm10":
        return config_nested(o + learned)
    # noisy: trust-aware hand-out (`--trust on`): a new rater rates 3 gold items before anything
    # else, an untrusted one gets gold items only (apps.feedback.handout.lease._claim_selected).
    hand_out = [Override("feedback.trust.gold_first", 3, "--trust on: a new rater rates 3 gold items first"),
                Override("feedback.trust.untrusted_share", 0.0, "--trust on: an untrusted rater gets gold items only")]
    return config_nested(o + learned + [
        Override("feedback.rater_weighting", "gold", "reliability weights from the owner's gold items"),
        Override("feedback.gold_rate", 0.2, "gold items mixed in at 20%"), *(hand_out if trust else [])])


def config_nested(overrides: list[Override]) -> tuple[dict[str, object], list[Override]]:
    """The config the overrides make (a later one of a path replaces an earlier one), and the
    overrides as they stand, one a path (bench/live_steering's config too)."""
    last = {o.path: o for o in overrides}
    config: dict[str, object] = {}
    for o in last.values():
        *parents, leaf = o.path.split(".")
        node = config
        for key in parents:
            child = node.setdefault(key, {})
            assert isinstance(child, dict)
            node = child
        node[leaf] = o.value
    return config, list(last.values())


def overrides_print(arms: list[str], **settings: Any) -> None:
    """What the arms change of the product's defaults (kernel.config), each with its reason:
    those every arm shares once, then each arm's own."""
    made = {arm: arm_config(arm, **settings)[1] for arm in arms}
    shared = [o for o in made[arms[0]] if all(o in made[arm] for arm in arms[1:])]
    print("the arms' run configs: the product's defaults (kernel.config) but for these overrides", flush=True)
    for title, overrides in [("every arm", shared), *((arm, [o for o in made[arm] if o not in shared]) for arm in arms)]:
        print(f"  {title}:", flush=True)
        for o in overrides:
            print(f"    {o.path} = {o.value!r}  ({o.reason})", flush=True)
