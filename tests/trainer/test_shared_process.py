"""Two learners in one process, as the embedded default runs two runs' trainers (threads of
`rft_serve`). transformers' TrainingArguments resets accelerate's process-wide state when it
is built, and TRL's losses read that state: a trainer built while the other learner computed
its loss failed that step ("`AcceleratorState` object has no attribute `_mixed_precision`",
found by the demo_teach smoke). Building waits for the loss, and the step succeeds."""

from __future__ import annotations

import math
import threading
from typing import Any

from workers.algorithms import Learner, LearnerSpec, Rollout, TrainBatch
from workers.algorithms import trl_bridge as bridge


def _learner(load_model: Any, tokenizer: Any) -> Learner:
    params = bridge.TrainParams(learning_rate=1e-2, max_completion_length=8)
    return Learner(spec=LearnerSpec(algorithm="grpo", params=params, algorithm_params={"loss_type": "grpo", "beta": 0.0}),
                   model=load_model(), tokenizer=tokenizer)


def _batch(start: int = 0) -> TrainBatch:
    """Two groups of four, rewarded 0/1 alternately (a signal to learn from)."""
    return TrainBatch(usual=[Rollout(id=start + i, group_id=f"g{start}-{i // 4}", prompt_ids=[11, 12, 13],
                                     completion_ids=[20 + i, 30], reward=float(i % 2)) for i in range(8)])


def test_a_learner_built_while_another_computes_its_loss_waits_and_the_step_succeeds(
    load_model: Any, tokenizer: Any,
) -> None:
    first = _learner(load_model, tokenizer)
    inside, go_on = threading.Event(), threading.Event()
    real_loss = first.loss

    def loss_that_waits(batch: TrainBatch) -> Any:
        inside.set()
        go_on.wait(60)
        return real_loss(batch)

    first.loss = loss_that_waits  # type: ignore[method-assign]
    results: dict[str, Any] = {}
    stepping = threading.Thread(target=lambda: results.update(step=first.step(_batch())))
    stepping.start()
    assert inside.wait(60)

    built = threading.Event()

    def build() -> None:
        results["second"] = _learner(load_model, tokenizer)
        built.set()

    building = threading.Thread(target=build)
    building.start()
    assert not built.wait(3), "a TRL trainer was built while the other learner computed its loss"
    go_on.set()
    stepping.join(120)
    building.join(120)
    assert built.is_set() and math.isfinite(results["step"]["loss"])
    # And the learner built second trains too.
    assert math.isfinite(results["second"].step(_batch(30))["loss"])
