"""Exploring: the run's tasks sampled into scored experiences (`explorer`), OpenAI-style chat
and generation on the same resident engines (`chat`), held-out evaluation (`evaluation`),
blind comparisons' answers (`blind`) and taskset paraphrases (`synthesize`). Celery tasks on
the `rollout` queue; importing these modules loads no torch."""
