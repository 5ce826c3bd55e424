"""Starting points for the new-run form: the common runs, each a partial config over the
schema's defaults (the form shows them; nothing is created until the person submits), and
"copy from run N" (another run's config, which the person may read).

Each preset names no model: the person names theirs (a local directory or a hub id), and
the model check says what that directory lacks before the run is made. Every preset
validates with a model named (tests/dashboard/test_run_form.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from apps.runs.models import Run
from apps.runs.selectors import runs_visible_to


@dataclass(frozen=True)
class Preset:
    slug: str
    title: str
    summary: str
    config: dict[str, object] = field(default_factory=dict)


PRESETS: tuple[Preset, ...] = (
    Preset(
        "grpo-math", "GRPO on a math taskset",
        "8 completions a task, scored by math-verify (answer and format); no people needed.",
        {"algorithm": "grpo", "mode": "sync", "repeat_times": 8, "explore_batch_size": 8, "train_batch_size": 64,
         "total_steps": 200, "sampling": {"temperature": 1.0, "max_tokens": 256},
         "rewards": [{"name": "math_accuracy", "weight": 1.0, "domains": ["math"]},
                     {"name": "math_format", "weight": 0.1, "domains": ["math"]}],
         "trainer": {"learning_rate": 1e-6, "params": {"loss_type": "dapo"}}, "feedback": {"mode": "auto"}},
    ),
    Preset(
        "dpo-preferences", "DPO from preferences",
        "Two completions a task; people choose the better one (A/B, ratings), DPO trains on their choices.",
        {"algorithm": "dpo", "mode": "sync", "repeat_times": 2, "explore_batch_size": 8, "train_batch_size": 16,
         "total_steps": 100, "sampling": {"temperature": 0.9, "max_tokens": 256},
         "trainer": {"learning_rate": 5e-7, "params": {"beta": 0.1}},
         "feedback": {"mode": "human", "wait_seconds": 1800, "fallback": "drop", "selection": {"pairs": True}}},
    ),
    Preset(
        "sft-corrections", "SFT from corrections",
        "The model answers, people correct its answers on the annotation page, SFT trains on the corrections.",
        {"algorithm": "sft", "mode": "async", "max_staleness": 4, "repeat_times": 1, "explore_batch_size": 8,
         "train_batch_size": 8, "total_steps": 50, "sampling": {"temperature": 0.7, "max_tokens": 256},
         "trainer": {"learning_rate": 2e-5}},
    ),
    Preset(
        "openai-agents", "Agents over the OpenAI endpoint",
        "Your agent is the explorer: it calls the run's OpenAI-compatible endpoint and finishes sessions with "
        "a reward; GRPO trains on the sessions of a task as a group.",
        {"algorithm": "grpo", "mode": "train", "engine": "transformers", "repeat_times": 4, "train_batch_size": 16,
         "total_steps": 100, "sync_interval": 1, "sampling": {"temperature": 1.0, "max_tokens": 256},
         "trainer": {"learning_rate": 1e-5, "params": {"loss_type": "grpo"}}},
    ),
    Preset(
        "human-preference", "The human-preference setup",
        "People rate pairs of siblings chosen where the learned reward model is least sure; once it is accurate "
        "enough it rewards what nobody rated. Gold items measure the raters.",
        {"algorithm": "grpo", "mode": "sync", "repeat_times": 4, "explore_batch_size": 8, "train_batch_size": 32,
         "total_steps": 100, "sampling": {"temperature": 1.0, "max_tokens": 256},
         "rewards": [{"name": "exact_match", "weight": 1.0}],
         "reward_model": {"enabled": True, "kind": "head", "retrain_every": 20, "crossval_folds": 5},
         "feedback": {"mode": "learned", "w_auto": 0.5, "w_human": 0.5, "w_rm": 1.0, "wait_seconds": 600,
                      "rater_weighting": "gold", "gold_rate": 0.1,
                      "selection": {"uncertainty": 1.0, "random_share": 0.2, "pairs": True}}},
    ),
)


def preset_get(slug: str) -> Preset | None:
    return next((p for p in PRESETS if p.slug == slug), None)


@dataclass(frozen=True)
class RunCopy:
    run: Run
    config: dict[str, object]
    name: str
    taskset_id: int | None


def run_copy_source(*, user: AbstractBaseUser | AnonymousUser, run_id: str) -> RunCopy | None:
    """Run `run_id`'s config to start the form from, if `user` may see that run."""
    if not run_id.strip().isdigit():
        return None
    run = runs_visible_to(user=user).filter(pk=int(run_id)).first()
    if run is None:
        return None
    return RunCopy(run=run, config=dict(run.config), name=f"{run.name} (copy)", taskset_id=run.taskset_id)
