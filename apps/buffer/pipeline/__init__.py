"""Data pipelines over the buffer: clean, filter, prioritize, synthesize.

A run's config lists operators per stage, in order (`pipeline.on_write`, `on_import`,
`on_claim`, each a list of `{name, params}`); see `registry` for the names and `core` for
what an operator is. Rows an operator removes are kept with status "filtered" and their
`filter_reason`, and are never trained. What each operator did is recorded as run metrics
named `pipeline/<stage>/<operator>/<reason>`.
"""

from apps.buffer.pipeline.apply import (
    PipelineSession,
    experience_priorities_refresh,
    pipeline_apply_on_claim,
    pipeline_apply_on_write,
    pipeline_import_session,
    pipeline_metrics_flush,
    task_priorities_refresh,
)
from kernel.operators import (
    STAGES,
    operator_get,
    operator_names,
    params_check,
    register,
    stage_check,
)

# A sensible write pipeline for GRPO runs (what bench/pipeline measures): tidy text and
# mask truncated responses, drop bad rewards, exact duplicates across groups and groups
# without reward spread, and put informative groups first.
DEFAULT_ON_WRITE: list[dict[str, object]] = [
    {"name": "clean"},
    {"name": "reward_invalid"},
    {"name": "length_bounds", "params": {"min_tokens": 1}},
    {"name": "dedup_exact", "params": {"scope": "run"}},
    {"name": "reward_variance"},
    {"name": "priority_reward_variance"},
]

__all__ = [
    "DEFAULT_ON_WRITE",
    "STAGES",
    "PipelineSession",
    "experience_priorities_refresh",
    "operator_get",
    "operator_names",
    "params_check",
    "pipeline_apply_on_claim",
    "pipeline_apply_on_write",
    "pipeline_import_session",
    "pipeline_metrics_flush",
    "register",
    "stage_check",
    "task_priorities_refresh",
]
