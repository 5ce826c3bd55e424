"""The run's reward model, learned from its human feedback, on the `reward` queue.

`reward_model_train` derives preference pairs from every kind of feedback
(apps.feedback.reward_model.preferences), splits them by prompt into a training and a held-out share,
fits the run's kind of reward model (`reward_model.kind`, a registry: workers/reward/kinds/):
`head` (the default: an ensemble of scalar heads on the pooled hidden states of the run's own
model), `likelihood` (the base's token log-likelihoods weighed by a Bradley-Terry model,
workers/reward/likelihood.py) or `classifier` (a scalar-head sequence classifier trained with
TRL's `RewardTrainer`, saved where `AutoModelForSequenceClassification` loads it), measures
pairwise accuracy on the held-out pairs, and publishes it as the run's next reward-model version. `reward_model_score` scores
the experiences no person rated with the newest version, in batches, each score recording
the version.

Task policy: queue `reward`, acknowledged late, idempotent. Training claims the run's
`rm_train` dispatch row (apps/runs/dispatch.py) under a lease (a second task for the same
run returns at once; a crashed one's row is free once the lease ran out), trains only when
`retrain_every` new labels arrived, soft limit 30 min. Scoring skips what the version already
scored. Database hiccups retry with backoff. torch / transformers / TRL are imported inside
the functions only (every process imports this module to know the task names).
"""

from __future__ import annotations

import logging
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from celery import Task, signals
from django.conf import settings
from django.db import InterfaceError, OperationalError

from apps.feedback.ports import PreferencePair, pair_is_heldout, pair_labels, preference_pairs_read, prompt_is_heldout
from apps.feedback.ports import rater_figures, rater_offsets, rater_weights
from apps.feedback.ports import experiences_handed_out_unbiased, rated_experiences
from apps.feedback.ports import (
    experiences_to_score,
    gold_experience_ids,
    reward_model_due,
    reward_model_latest,
    reward_model_publish,
    rm_scores_apply,
    run_label_count,
)
from apps.rewards.ports import RewardModelRow as RewardModel  # the type of the versions the ports hand out
from apps.rewards.ports import reward_model_export_begin, reward_model_get, run_current_model
from apps.runs.ports import dispatch_claim
from apps.runs.ports import reward_kind_get
from apps.runs.ports import DispatchJob, DispatchState, run_view
from apps.runs.ports import RunView as Run  # the port's view of a run, under the name this module used
from rftweb.taskkit import celery_bound_task, celery_task, on_signal
from workers.reward.kinds import KindScorer, reward_kind_impl, reward_kind_of_dir
from kernel.exceptions import ExportFailed
from workers.reward.scorers import reward_model_export, rm_text

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from workers.reward.kinds import OutOfFold

log = logging.getLogger(__name__)

# A training's lease: its task's hard time limit, past which its row is free for another.
TRAIN_LEASE_SECONDS = 1860


Scorer = Callable[[Sequence[str], Sequence[str]], list[float]]


def _base_of(run: Run) -> str:
    cfg = run.config.reward_model
    # Only some kinds' versions have weights to start from (RewardKind.warm_start).
    if cfg.warm_start and reward_kind_get(cfg.kind).warm_start:
        latest = reward_model_latest(run=run)
        if latest is not None and Path(latest.path).exists():
            return latest.path
    return run_current_model(run=run) if cfg.base == "policy" else cfg.base


def rm_texts_tokenize(tokenizer: PreTrainedTokenizerBase, prompts: list[str], completions: list[str], *, max_length: int) -> list[list[int]]:
    """Token ids of (prompt, completion) as the scorer sees them (workers.reward.scorers)."""

    out = []
    for prompt, completion in zip(prompts, completions, strict=True):
        ids = tokenizer(rm_text(tokenizer, prompt, completion), add_special_tokens=False)["input_ids"]
        out.append(list(ids)[-max_length:])
    return out


def rm_score_texts(net: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: list[str], completions: list[str], *, max_length: int,
                   batch_size: int = 64) -> list[float]:
    """One scalar score per (prompt, completion), right-padded batches on the model's device."""
    import torch

    ids = rm_texts_tokenize(tokenizer, prompts, completions, max_length=max_length)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    scores: list[float] = []
    net.eval()
    for start in range(0, len(ids), batch_size):
        chunk = ids[start:start + batch_size]
        width = max(len(x) for x in chunk)
        input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in chunk], device=net.device)
        mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in chunk], device=net.device)
        with torch.inference_mode():
            logits = net(input_ids=input_ids, attention_mask=mask).logits.float()
        scores.extend(logits[:, 0].tolist())
    return scores


def pairwise_accuracy(chosen: list[float], rejected: list[float], weights: Sequence[float] | None = None) -> float | None:
    """Share of pairs the model orders as people did; a tie counts half. `weights`: each
    pair's trust (PreferencePair.trust), so a half-trusted rater's pairs count half."""
    if not chosen:
        return None
    w = list(weights) if weights is not None else [1.0] * len(chosen)
    hits = sum(wi * (1.0 if c > r else 0.5 if c == r else 0.0) for c, r, wi in zip(chosen, rejected, w, strict=True))
    total = sum(w)
    return hits / total if total > 0 else None


def scorer_accuracy(score: Scorer,
                    pairs: Sequence[PreferencePair]) -> float | None:
    """pairwise_accuracy of a scorer's `score(prompts, completions)` on held-out pairs."""
    prompts = [p.prompt for p in pairs]
    return pairwise_accuracy(score(prompts, [p.chosen for p in pairs]), score(prompts, [p.rejected for p in pairs]),
                             [p.trust for p in pairs])


MIN_CALIBRATION_POINTS = 8


def calibration_fit(scores: list[float], humans: list[float]) -> tuple[float, float]:
    """Least-squares line from raw scores to people's rewards. Fitted on experiences the
    model did not train on, it shrinks an uninformative model toward the people's mean reward
    (slope 0 when its scores do not follow people at all), so its noise adds no spread to the
    rewards a group is normalised by. A sigmoid-like default (slope 1/4 around the mean score)
    when there are too few distinct points to fit."""
    mean_s = sum(scores) / len(scores) if scores else 0.0
    if len(scores) >= 3:
        mean_h = sum(humans) / len(humans)
        var = sum((s - mean_s) ** 2 for s in scores)
        if var > 1e-12:
            slope = sum((s - mean_s) * (h - mean_h) for s, h in zip(scores, humans, strict=True)) / var
            slope = max(0.0, slope)
            return slope, mean_h - slope * mean_s
    return 0.25, 0.5 - 0.25 * mean_s


def reward_model_fit(
    *, base: str, train: list[PreferencePair], heldout: list[PreferencePair], out: Path, epochs: int,
    learning_rate: float, batch_size: int, max_length: int, seed: int = 0,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, float | None]:
    """Train a scalar-head reward model on `train` with TRL's RewardTrainer from `base`, save
    it (and its tokenizer) to `out`; returns (model, tokenizer, held-out pairwise accuracy)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(base)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    net = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1, dtype=torch.float32)
    net.config.pad_token_id = tokenizer.pad_token_id
    chosen = rm_texts_tokenize(tokenizer, [p.prompt for p in train], [p.chosen for p in train], max_length=max_length)
    rejected = rm_texts_tokenize(tokenizer, [p.prompt for p in train], [p.rejected for p in train],
                                 max_length=max_length)
    dataset = Dataset.from_dict({"chosen_ids": chosen, "rejected_ids": rejected})
    from workers.algorithms.trl_bridge import TRL_STATE_LOCK

    with tempfile.TemporaryDirectory(prefix="rm-train-") as scratch, TRL_STATE_LOCK:
        args = RewardConfig(
            output_dir=scratch, num_train_epochs=epochs, learning_rate=learning_rate,
            per_device_train_batch_size=batch_size, max_length=max_length, seed=seed, data_seed=seed,
            bf16=False, fp16=False, gradient_checkpointing=False, use_cpu=not torch.cuda.is_available(),
            report_to=[], save_strategy="no", logging_steps=10, disable_tqdm=True, dataloader_num_workers=0,
            lr_scheduler_type="constant",
        )
        trainer = RewardTrainer(model=net, args=args, train_dataset=dataset, processing_class=tokenizer)
        trainer.train()
    net = trainer.model
    out.mkdir(parents=True, exist_ok=True)
    net.save_pretrained(out)
    tokenizer.save_pretrained(out)
    accuracy = None
    if heldout:
        prompts = [p.prompt for p in heldout]
        c = rm_score_texts(net, tokenizer, prompts, [p.chosen for p in heldout], max_length=max_length)
        r = rm_score_texts(net, tokenizer, prompts, [p.rejected for p in heldout], max_length=max_length)
        accuracy = pairwise_accuracy(c, r, [p.trust for p in heldout])
    return net, tokenizer, accuracy


def reward_model_pairs(*, run: Run, gold: set[int] | None = None) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """(training, held-out) pairs of the run's next reward model (`reward_model_pairs_read`)."""
    train, heldout, _ = reward_model_pairs_read(run=run, gold=gold)
    return train, heldout


def reward_model_pairs_read(
    *, run: Run, gold: set[int] | None = None,
) -> tuple[list[PreferencePair], list[PreferencePair], dict[int, str]]:
    """(training, held-out) pairs of the run's next reward model: every kind of feedback, each
    rater weighted by the reliability they earned when the run weights raters (an untrusted or
    unmeasured rater's pairs left out of both, a half-trusted one's counting by its trust),
    gold items left out, split by prompt; and why each label that made no pair made none."""
    cfg = run.config.reward_model
    gold = gold_experience_ids(run=run) if gold is None else gold
    figures = rater_figures(run=run)
    # Earned trust, not the fold's: a rater not yet measured teaches the reward model nothing.
    read = preference_pairs_read(run=run, rater_weights=rater_weights(run=run, figures=figures, earned=True),
                                 rater_offsets=rater_offsets(run=run, figures=figures), exclude_experience_ids=gold)
    heldout = [p for p in read.pairs if pair_is_heldout(p, share=cfg.heldout_share, seed=run.config.seed)]
    train = [p for p in read.pairs if not pair_is_heldout(p, share=cfg.heldout_share, seed=run.config.seed)]
    return train, heldout, read.unpaired


def _random_share_accuracy(heldout: list[PreferencePair], *, unbiased: set[int], score: Scorer,
                           out_of_fold: OutOfFold | None = None) -> tuple[float | None, int]:
    """(pairwise accuracy, pairs) on the held-out pairs both of whose completions only the
    random share or arrival order handed out (`unbiased`, apps.feedback.selectors): the
    estimate the selection rule's straddling pairs do not bias. Scored as the held-out accuracy
    is: by the published fit (`score`), or, cross-validated (`out_of_fold`, a LikelihoodScorer
    whose folds were fitted), each pair by the fold's fit that never saw its prompt, a pair
    whose fold has no such fit left out as crossval_accuracy leaves it."""
    pairs = [p for p in heldout if p.chosen_id in unbiased and p.rejected_id in unbiased]
    if out_of_fold is not None:
        pairs = [p for p in pairs if out_of_fold.fold_fitted(p.prompt)]
    if not pairs:
        return None, 0
    prompts = [p.prompt for p in pairs]
    if out_of_fold is not None:
        chosen = out_of_fold.score_out_of_fold(prompts, [p.chosen for p in pairs], prompts)
        rejected = out_of_fold.score_out_of_fold(prompts, [p.rejected for p in pairs], prompts)
    else:
        chosen, rejected = score(prompts, [p.chosen for p in pairs]), score(prompts, [p.rejected for p in pairs])
    return pairwise_accuracy(chosen, rejected, [p.trust for p in pairs]), len(pairs)


def reward_model_train_run(*, run: Run, force: bool = False) -> RewardModel | None:
    """Train and publish the run's next reward-model version if one is due (or `force`).
    None when nothing was due or no pair can be learned from."""
    if not force and not reward_model_due(run=run):
        return None
    cfg = run.config.reward_model
    labels = run_label_count(run=run)
    gold = gold_experience_ids(run=run)
    train, heldout, unpaired = reward_model_pairs_read(run=run, gold=gold)
    unbiased = experiences_handed_out_unbiased(run=run)  # read with the pairs
    if not train:
        log.info("reward model of run %s: no training pairs yet (%d labels)", run.id, labels)
        return None
    base = _base_of(run)
    latest = reward_model_latest(run=run)
    number = (latest.version if latest is not None else 0) + 1
    out = Path(settings.RFT_STORAGE_DIR) / "runs" / str(run.id) / "reward_models" / f"v{number}-{int(time.time())}"
    started = time.monotonic()
    rng = random.Random(run.config.seed + number)
    rng.shuffle(train)
    fitted = reward_kind_impl(cfg.kind).fit(cfg=cfg, base=base, train=train, heldout=heldout, out=out,
                                            seed=run.config.seed + number)
    train, heldout, accuracy = fitted.train, fitted.heldout, fitted.accuracy
    score: Scorer = fitted.scorer
    calibration_score, out_of_fold = fitted.calibration_score, fitted.out_of_fold
    # Put raw scores on the human scale with the experiences people rated in the held-out
    # prompts (scores of what it trained on are overconfident); all rated ones while too few.
    # Cross-validated, no prompt is held out of the published fit, but each has a fold's fit
    # that never saw it: every rated experience is scored by that one.
    rated_all = rated_experiences(run=run, exclude=gold, limit=2048)
    if calibration_score is not None:
        rated = rated_all[:512]
        scores = calibration_score([r[0] for r in rated], [r[1] for r in rated], [r[0] for r in rated])
    else:
        rated = [r for r in rated_all if prompt_is_heldout(r[0], share=cfg.heldout_share, seed=run.config.seed)][:512]
        if len(rated) < MIN_CALIBRATION_POINTS:
            rated = rated_all[:512]
        scores = score([r[0] for r in rated], [r[1] for r in rated])
    scale, offset = calibration_fit(scores, [float(r[2] or 0.0) for r in rated])
    accuracy_random, pairs_random = _random_share_accuracy(
        heldout, unbiased=unbiased, score=score, out_of_fold=out_of_fold)
    rm = reward_model_publish(
        run=run, path=str(out), base=base, accuracy=accuracy, pairs_train=len(train), pairs_heldout=len(heldout),
        labels=labels, seconds=time.monotonic() - started, scale=scale, offset=offset,
        accuracy_random=accuracy_random, pairs_random=pairs_random,
        # What the fit trained on and held out (a cross-validated one: every pair, both).
        pair_labels=pair_labels(train=train, heldout=heldout, unpaired=unpaired),
    )
    log.info("run %s reward model v%d: %d train / %d held-out pairs, accuracy %s (random share %s on %d), %.1fs",
             run.id, rm.version, len(train), len(heldout), accuracy, accuracy_random, pairs_random, rm.seconds)
    return rm


def reward_scorer_load(path: str, *, max_length: int, batch_size: int = 64) -> KindScorer:
    """The scorer of a published version, whichever kind its directory holds (called as
    `scorer(prompts, completions)`; `scorer.score_spread` adds each score's spread)."""
    return reward_kind_of_dir(path).load(path, max_length=max_length, batch_size=batch_size)


def reward_model_score_run(*, run: Run, limit: int | None = None) -> int:
    """Score, with the newest version, every open experience no person rated that it has not
    scored, in batches; fold the scores under `learned`. Returns how many were scored."""
    rm = reward_model_latest(run=run)
    if rm is None:
        return 0
    cfg = run.config.reward_model
    score = reward_scorer_load(rm.path, max_length=cfg.max_length, batch_size=cfg.score_batch_size)
    done = 0
    while limit is None or done < limit:
        batch = list(experiences_to_score(run=run, rm=rm, limit=cfg.score_batch_size))
        if not batch:
            break
        scores, spreads = score.score_spread([e.prompt_text for e in batch], [e.response_text for e in batch])
        rm_scores_apply(run=run, rm=rm, scores={e.pk: s for e, s in zip(batch, scores, strict=True)},
                        spreads=None if spreads is None else dict(zip([e.pk for e in batch], spreads, strict=True)))
        done += len(batch)
    return done


# The reward queue's task policy (the module docstring); each task adds its name and limits.
_REWARD_TASK: dict[str, object] = {
    "acks_late": True, "reject_on_worker_lost": True, "autoretry_for": (OperationalError, InterfaceError),
    "retry_backoff": True, "max_retries": 5, "ignore_result": True,
}


@celery_task(name="workers.reward.trainer.reward_model_train", soft_time_limit=1800, time_limit=1860, **_REWARD_TASK)
def reward_model_train(run_id: int) -> dict[str, int | float | bool | None]:
    run = run_view(run_id)
    if run is None or not run.config.reward_model.enabled:
        return {"version": None}
    hold = dispatch_claim(run_id=run_id, job=DispatchJob.RM_TRAIN, state=DispatchState.RUNNING,
                          lease_seconds=TRAIN_LEASE_SECONDS)
    if hold is None:
        return {"version": None, "busy": True}
    try:
        rm = reward_model_train_run(run=run)
    finally:
        hold.end()
    if rm is not None:
        reward_model_score.delay(run_id)
    return {"version": rm.version if rm else None, "accuracy": rm.accuracy if rm else None}


@celery_task(name="workers.reward.trainer.reward_model_score", soft_time_limit=600, time_limit=660, **_REWARD_TASK)
def reward_model_score(run_id: int) -> dict[str, int]:
    run = run_view(run_id)
    if run is None:
        return {"scored": 0}
    return {"scored": reward_model_score_run(run=run)}




@celery_bound_task(name="workers.reward.trainer.reward_model_export_zip", soft_time_limit=1800, time_limit=1860,
                   **_REWARD_TASK)
def reward_model_export_zip(self: Task, rm_id: int) -> dict[str, str | int | bool | None]:
    """Pack a version as the web download (apps/rewards/rm_download.py): the directory
    `rft reward-model` writes, zipped beside the version. Idempotent (a zip that is there is
    complete: it is renamed into place); one packing at a time per version (its dispatch
    row); a failure is kept for the page to show."""
    rm = reward_model_get(rm_id)
    if rm is None:
        return {"zip": None}
    target, hold = reward_model_export_begin(rm=rm, task_id=self.request.id)
    if hold is None:
        return {"zip": None, "busy": True}
    error = ""
    try:
        if not target.is_file():
            reward_model_zip_write(rm=rm, target=target)
        return {"zip": str(target), "bytes": target.stat().st_size}
    except (ValueError, OSError) as exc:  # ExportFailed (a ValueError): the base or the files are gone
        log.warning("reward model v%d of run %s: export failed: %s", rm.version, rm.run_id, exc)
        error = str(exc)[:500] or type(exc).__name__
        return {"zip": None, "error": str(exc)}
    finally:
        hold.end(error=error)


def reward_model_zip_write(*, rm: RewardModel, target: Path) -> Path:
    """Export `rm` (workers.reward.scorers.reward_model_export) into a temporary directory
    and zip it, stored (weights do not compress), under a temporary name renamed into place."""
    import os
    import zipfile

    if not Path(rm.path).is_dir():  # before writing anything beside it
        raise ExportFailed(f"{rm.path} is not a saved reward model directory (is the run's storage mounted here?)")
    with tempfile.TemporaryDirectory(prefix="rm-export-", dir=target.parent) as tmp:
        out = reward_model_export(source=rm.path, out=str(Path(tmp) / "model"), scale=rm.scale, offset=rm.offset)
        partial = Path(tmp) / "export.zip"
        with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_STORED) as archive:
            for file in sorted(p for p in out.rglob("*") if p.is_file()):
                archive.write(file, arcname=str(file.relative_to(out)))
        os.replace(partial, target)
    return target


@on_signal(signals.worker_ready)
def _import_the_reward_models_at_start(sender: object = None, **_: object) -> None:
    """As a train worker does (workers/trainer/task.py): a worker serving the reward queue
    imports torch and transformers as it starts rather than inside its first training, where
    the time counted against the label that made the version due (bench/rm_latency, load 45:
    148 s to the first version's first score, 35 s to the next ones')."""
    queues = {q.name for q in getattr(getattr(sender, "task_consumer", None), "queues", [])}
    if "reward" in queues:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401  (their lazy modules too)
