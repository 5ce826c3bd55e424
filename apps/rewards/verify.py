"""Is an answer right, and is it well formed: the task domain's verifier and format check,
apart from the reward (which mixes them: math's format term lifts a wrong but tidy answer
above 0). The held-out evaluation reports their shares as `eval/accuracy` and
`eval/format_share` (workers/explore/evaluation.py).

A domain's verifier is the reward it registered as such (kernel.rewards.domain_register):
math → math_accuracy (equivalence with the reference through math-verify), code → code_exec
(every test passes in the sandbox), vision → vision_answer. A task of a domain with no
registered route is checked by exact_match against its reference. K-12 registers none: its
graders are models (a judge, a learned grader), not checks. An answer counts as right only at
the verifier's full score; a task with nothing to check against (no reference, no tests) has
no verdict, and neither has a domain without a verifier: accuracy is over the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernel.rewards import domain_routes, reference_text, reward_get, task_field
from apps.rewards.scoring import task_domain

# The check of tasks whose domain registered no route (what scores them, too).
FALLBACK_VERIFIER = "exact_match"
# The rewards whose verdict needs the task's tests rather than its reference.
_NEEDS_TESTS = frozenset({"code_exec"})


@dataclass(frozen=True)
class Verdict:
    """One answer's verdict: right (None: nothing verifies it) and well formed (None: the
    domain has no format check)."""

    correct: bool | None
    well_formed: bool | None


def _full_score(name: str, completion: str, task: object) -> bool:
    result = reward_get(name).fn(completion, task)
    return float(result.score) >= 1.0


def _checkable(name: str, task: object) -> bool:
    if name in _NEEDS_TESTS:
        return bool(task_field(task, "tests"))
    return bool(reference_text(task).strip())


def domain_verifier(domain: str) -> str | None:
    """The reward that verifies answers of `domain`, None where none does."""
    route = domain_routes().get(domain)
    return FALLBACK_VERIFIER if route is None else route.verifier


def answer_verdict(*, completion: str, task: object) -> Verdict:
    """The verdict of the domain's verifier and format check on one answer. A check that
    raises on untrusted text counts the answer wrong (or ill formed), as the rewards do."""
    domain = task_domain(task)
    verifier = domain_verifier(domain)
    route = domain_routes().get(domain)
    correct: bool | None = None
    if verifier is not None and _checkable(verifier, task):
        try:
            correct = _full_score(verifier, completion, task)
        except Exception:
            correct = False
    well_formed: bool | None = None
    if route is not None and route.format is not None:
        try:
            well_formed = _full_score(route.format, completion, task)
        except Exception:
            well_formed = False
    return Verdict(correct=correct, well_formed=well_formed)
