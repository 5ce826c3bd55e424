"""The learned reward model, web side (no torch; its training and scoring run on the `reward`
queue, workers/reward/trainer.py): the preference pairs it learns from (`preferences`), and
its versions: when one is due, publishing it, its gate, which experiences it scores and the
scores folded into rewards (`versions`)."""
