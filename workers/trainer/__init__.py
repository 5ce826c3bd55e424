"""The trainer: Celery task `workers.trainer.task.train_step(run_id, step)` on queue `train`.

Each worker process keeps the policy (and the reference model when the algorithm needs
one) resident between steps. One step:

1. under a per-run Postgres advisory lock (one trainer per run at a time; released by the
   database if the process dies), check that `step` is the run's next one;
2. claim a batch from the buffer's `TrainSource` (apps/buffer/ports.py; whole groups for
   GRPO, MIX and DPO; the staleness bound from the run's mode), plus expert experiences for
   SFT and MIX;
3. journal the step: the exact batch (tokens, logprobs, rewards, preferences) and the RNG
   state it starts from, written and fsynced;
4. one optimizer step with TRL's losses (`workers.algorithms`), none on a batch without a
   gradient (`train/skipped_no_signal`: the step is still recorded and its batch used up);
5. `TrainSource.commit`, in one transaction: `run.train_step` step-1 → step (conditional
   UPDATE: the idempotency guard), the batch's ack and the step's metrics; on any failure
   before this, `TrainSource.release`;
6. every `sync_interval` steps, publish version n through the weight sync;
7. every `RFT_TRAINER_SNAPSHOT_STEPS` steps and at the last step, a full snapshot (weights,
   optimizer, scheduler), after which the journal entries and older snapshots it covers go.

A task runs only while its run's train dispatch names it (apps/control/conductor.py) and
sets it idle when it ends. It goes on with the next step itself when that step's batch is
already there (async and offline runs, where the trainer sets the pace), for up to
`RFT_TRAIN_CHAIN_SECONDS`, moving its dispatch row on to that step so the loop does not
send it too.

A restart rebuilds the state as of the step the database says is done: the newest snapshot
at or before it, then the journaled steps after it replayed on their own batches from their
own RNG states (on CPU: the same weights and optimizer state, bit for bit). So nothing is
lost and nothing is trained twice: a crash between 3 and 5 leaves the batch leased (it
comes back to ready when the lease expires) and a journal entry for a step the database
never recorded, which a restart ignores and the step's next attempt overwrites. The journal
keeps the batch itself, not experience ids, because rewards and feedback in the buffer may
change after the step trained on them.

Why a journal and not a full state every step: weights plus Adam moments are 16 bytes per
parameter and saving them took 7% of a step on a 4M-parameter model (bench/trainer_overhead),
growing with the model; a journal entry grows with the batch only (about 1 ms).


The package, by responsibility: `task` (the Celery task and its failure policy), `step` (one
step and the chain of steps), `resident` (the resident learner, its loading, restore and idle
reaper), `journal` (the journal, snapshots and their pruning), `follower` (a learner gang's
other ranks, each a process of its own). This package re-exports nothing: importing it loads
no submodule, so `python -m workers.trainer.follower` starts before Django is set up, and
callers name the module that holds what they use. Tests that replace a function replace it in the module that calls it (e.g.
`workers.trainer.step.train_batch_claim`).
"""
