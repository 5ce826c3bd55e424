"""The code reward: the fraction of the task's tests the completion's code passes, run in
the sandbox (apps/rewards/sandbox.py). Scored on the `reward` queue, never in the explorer."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from kernel.rewards import RewardResult, domain_register, register, task_field
from apps.rewards.sandbox import code_extract, code_run, code_tests_normalise

log = logging.getLogger(__name__)

MAX_CODE_CHARS = 100_000
_LIMITS = {"timeout": (0.1, 300.0), "test_timeout": (0.05, 300.0), "memory_mb": (32, 16384)}


def _code_check(params: Mapping[str, object]) -> None:
    for key, (low, high) in _LIMITS.items():
        if key in params:
            value = params[key]
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
                raise ValueError(f"code_exec: {key} must be a number from {low} to {high}, got {value!r}")


@register("code_exec", where="reward", check=_code_check,
          description="fraction of the task's tests passed by the completion's code, run in a sandbox")
def code_exec(
    completion: str,
    task: object,
    *,
    timeout: float = 10.0,
    test_timeout: float = 4.0,
    memory_mb: int = 512,
    **params: object,
) -> RewardResult:
    try:
        tests = code_tests_normalise(task_field(task, "tests"))
    except ValueError as exc:
        log.warning("code_exec: task has unusable tests: %s", exc)
        tests = []
    code = code_extract(completion)
    if not tests or not code.strip() or len(code) > MAX_CODE_CHARS:
        return RewardResult(0.0, {"code_exec": 0.0})
    result = code_run(code=code, tests=tests, timeout=timeout, test_timeout=test_timeout, memory_mb=int(memory_mb))
    return RewardResult(result.fraction, {"code_exec": result.fraction})


# Tasks of this domain are scored by these terms when a run names none of its own.
# Its verifier: every test passes (code_exec's full score).
domain_register("code", terms={"code_exec": 1.0}, verifier="code_exec")
