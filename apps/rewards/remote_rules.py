"""Scorers that need a model: registered here so run configs can name and validate them,
implemented in `workers/reward/scorers.py` and evaluated only by workers on queue `reward`
(the web side never loads torch or transformers)."""

from __future__ import annotations

from collections.abc import Mapping

from kernel.rewards import RewardFn, RewardResult, register

JUDGE_ENGINES = ("transformers", "vllm")


def _worker_only(name: str) -> RewardFn:
    def fn(completion: str, task: object, **params: object) -> RewardResult:
        raise RuntimeError(f"reward {name!r} is scored by workers.reward.scoring on queue 'reward', not inline")

    fn.__name__ = name
    return fn


def _model_param(name: str, params: Mapping[str, object], *, required: bool) -> None:
    model = params.get("model")
    if model is None and not required:
        return
    if not isinstance(model, str) or not model.strip():
        raise ValueError(f"{name} needs params.model: a hub id or a local path of the model")


def _reward_model_check(params: Mapping[str, object]) -> None:
    _model_param("reward_model", params, required=True)
    label = params.get("label")
    if label is not None and (not isinstance(label, int) or isinstance(label, bool) or label < 0):
        raise ValueError("reward_model: label must be a class index (0, 1, …)")
    max_length = params.get("max_length", 1024)
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 8:
        raise ValueError("reward_model: max_length must be an integer of at least 8")


def _judge_check(params: Mapping[str, object]) -> None:
    # Without params.model the judge is the run's own current model.
    _model_param("llm_judge", params, required=False)
    engine = params.get("engine", "transformers")
    if engine not in JUDGE_ENGINES:
        raise ValueError(f"llm_judge: engine must be one of {', '.join(JUDGE_ENGINES)}, got {engine!r}")
    template = params.get("template")
    if template is not None:
        if not isinstance(template, str) or "{completion}" not in template:
            raise ValueError("llm_judge: template must be text containing {completion}")
    scale = params.get("scale", 10)
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or scale <= 0:
        raise ValueError("llm_judge: scale must be a positive number (the top of the judge's score range)")


register("reward_model", where="reward", check=_reward_model_check,
         description="a sequence-classification reward model's score of prompt + completion")(_worker_only("reward_model"))
register("llm_judge", where="reward", check=_judge_check,
         description="an LLM judge's 0..scale score of the completion, read from its text, scaled to 0..1")(
    _worker_only("llm_judge"))
