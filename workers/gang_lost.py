"""GangLost: a learner gang lost a rank mid-step (its host gone, its link cut, its process
dead) or a rank did not come back to a re-formed gang in time. Apart from
workers/algorithms/gang.py (which raises it) because the train task catches it, and
the task's module is imported by every worker, torch-free ones included."""

from __future__ import annotations


class GangLost(RuntimeError):
    """A learner gang could not finish a collective, or re-form, within its timeout
    (`trainer.collective_timeout_s`), or a rank's connection broke: the message names the
    rank(s) and host(s) that stopped answering. Nothing of the step is committed; the train
    task records the reason on the run page and the step is sent again (a gang re-formed
    once the host is back)."""
