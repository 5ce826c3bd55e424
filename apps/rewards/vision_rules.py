"""The vision reward's rule check: tasks about a picture whose answer can be checked (a count,
a digit, a word read off the image). Pure Python like every inline rule; a vision task
without a checkable reference goes to a judge or a reward model by the run's reward spec."""

from __future__ import annotations


from apps.rewards.answers import answer_extract
from kernel.rewards import RewardResult, domain_register, reference_text, register


def _same(answer: str, reference: str) -> bool:
    a, r = " ".join(answer.split()).casefold(), " ".join(reference.split()).casefold()
    if a == r:
        return True
    try:
        # "3", "3.0" and "03" name the same count.
        return float(a) == float(r)
    except ValueError:
        return False


@register("vision_answer", description="1 when the tagged answer about the picture equals the reference "
                                        "(numbers compared as numbers), 0 otherwise or without a tag")
def vision_answer(completion: str, task: object, **params: object) -> RewardResult:
    reference = reference_text(task)
    answer = answer_extract(completion)
    ok = bool(reference) and answer is not None and _same(answer, reference)
    return RewardResult(float(ok), {"vision_answer": float(ok)})


# Tasks of this domain are scored by these terms when a run names none of its own.
domain_register("vision", terms={"vision_answer": 1.0}, verifier="vision_answer", format="math_format")
