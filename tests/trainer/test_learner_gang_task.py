"""A run whose trainer config asks for two learner processes: the train task starts the
gang itself (its own process as rank 0, one follower over gloo) and the version it
publishes after a step holds the same weights as a one-process run trained on the same
batch, for GRPO and SFT (FSDP2 over gloo; a published version is the whole model). What a
gang cannot run is refused in the run config (tests/trainer/test_learner_gang_config.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch

from apps.buffer.services import experience_write
from apps.runs.models import Metric, ModelVersion
from tests.factories import experience_row
from tests.trainer.conftest import running_run
from workers.trainer import journal as trainer_journal, resident as trainer_resident, step as step_module, task as trainer_task
from apps.runs.ports import run_view_of

if TYPE_CHECKING:
    from workers.trainer.step import StepOutcome

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(autouse=True)
def _storage(settings: Any, tmp_path: Path) -> Any:
    settings.RFT_STORAGE_DIR = tmp_path / "storage"
    trainer_resident.RESIDENTS.clear()
    yield settings.RFT_STORAGE_DIR
    for run_id in list(trainer_resident.RESIDENTS):
        trainer_resident.resident_drop(run_id)


def _fill(run: Any, *, expert: bool, tag: str = "", version: int = 0) -> None:
    """Three groups of four (uneven over two processes), one prompt length (TRL's forward
    takes positions from 0 whatever the left padding), varied completions and rewards."""
    g = torch.Generator().manual_seed(5)
    rows = []
    for gi in range(3):
        prompt = torch.randint(10, 200, (4,), generator=g).tolist()
        for j in range(4):
            completion = torch.randint(10, 200, (2 + (j * 5 + gi) % 6,), generator=g).tolist()
            rows.append(experience_row(run, key=f"{tag}g{gi}-{j}", group=f"{tag}g{gi}", token_ids=prompt + completion,
                                       prompt_length=4, logprobs=[-0.7] * len(completion),
                                       reward=float((j * 7 + gi) % 3), is_expert=expert, model_version=version))
    experience_write(experiences=rows)


# The one-process weights after step 1 by (algorithm, LoRA settings): the same batch and seed
# give the same weights, so each is trained once a module and read by every test that compares.
_ONE_PROCESS: dict[tuple[str, str], dict[str, torch.Tensor]] = {}


def _trained(owner: Any, model_dir: Path, *, algorithm: str, processes: int, hosts: int = 1,
             lora: dict[str, Any] | None = None) -> dict[str, torch.Tensor]:
    key = (algorithm, repr(lora))
    if processes == 1 and key in _ONE_PROCESS:
        return _ONE_PROCESS[key]
    weights = _trained_now(owner, model_dir, algorithm=algorithm, processes=processes, hosts=hosts, lora=lora)
    if processes == 1:
        _ONE_PROCESS[key] = weights
    return weights


def _trained_now(owner: Any, model_dir: Path, *, algorithm: str, processes: int, hosts: int,
                 lora: dict[str, Any] | None) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    from workers.weights.adapters import ADAPTER_WEIGHTS

    trainer = {"learning_rate": 1e-2, "loss_type": "grpo" if algorithm == "grpo" else "dapo", "processes": processes,
               "hosts": hosts, **({"lora": lora} if lora else {})}
    run = running_run(owner, model_dir, algorithm=algorithm, train_batch_size=12, total_steps=5, trainer=trainer)
    _fill(run, expert=algorithm == "sft")
    # A batch for step 2, fresh enough for it: the run goes on (a finished one's gang ends).
    _fill(run, expert=algorithm == "sft", tag="b", version=1)
    out = trainer_task.train_step.apply(args=(run.pk, 1)).get()
    assert out["status"] == "trained", out
    if processes > 1:
        res = trainer_resident.RESIDENTS[run.pk]
        assert res.gang is not None and len(res.gang.followers) == processes // hosts - 1
        assert all(p.poll() is None for p in res.gang.followers), "a follower process ended"
        assert Metric.objects.get(run=run, step=1, name="learner_processes").value == processes
        _rank0_holds_its_rows_only(res.gang)
    version = ModelVersion.objects.get(run=run, number=1)
    return load_file(str(Path(version.checkpoint) / (ADAPTER_WEIGHTS if lora else "model.safetensors")))


def _rank0_holds_its_rows_only(gang: Any) -> None:
    """Rank 0 built its learner on its shards (the run's model) and holds its rows only of
    every weight of the policy and the reference model; the version's whole weights it
    gathered went when the next step began, or go now (the skeleton stays on the meta device)."""
    assert gang.rank0_sharded, "rank 0 loaded the whole model"
    models = [gang.learner.model, *([gang.learner.ref_model] if gang.learner.ref_model is not None else [])]
    for model in models:
        for name, p in model.named_parameters():
            rows = p.shape[0]
            assert p.to_local().shape[0] <= -(-rows // gang.world), f"rank 0 holds all of {name}"
    gang.whole_release()
    assert all(p.device.type == "meta" for p in gang.whole.parameters())


@pytest.mark.parametrize("algorithm", ["grpo", "sft"])
def test_two_learner_processes_started_by_the_train_task_publish_the_one_process_weights(
    owner: Any, tiny_model_dir: Path, algorithm: str
) -> None:
    from safetensors.torch import load_file

    from apps.runs.models import Run

    torch.set_num_threads(1)
    one = _trained(owner, tiny_model_dir, algorithm=algorithm, processes=1)
    two = _trained(owner, tiny_model_dir, algorithm=algorithm, processes=2)
    before = load_file(str(tiny_model_dir / "model.safetensors"))
    assert one.keys() == two.keys()
    assert any(not torch.equal(before[k], one[k]) for k in one), "the step changed nothing"
    for name in one:
        # Two partial gradient sums then the all-reduce: float noise only (Adam's first
        # step moves a weight by up to lr on a near-zero gradient, hence this bound).
        torch.testing.assert_close(two[name], one[name], atol=1e-4, rtol=1e-3)
    # The gang lives between steps (its run has steps left), and a stopped run's gang ends
    # with a train task sent before the stop (a stopped run gets no new one: the idle
    # reaper's case), refused before its step whether or not the stop took its dispatch back.
    # Checked on this test's gang: a gang of its own cost a follower's start (issue 50).
    run_id, gang = next((pk, res.gang) for pk, res in trainer_resident.RESIDENTS.items() if res.gang is not None)
    followers = list(gang.followers)  # close() empties the list
    assert followers and all(p.poll() is None for p in followers), "the gang should live between steps"
    Run.objects.filter(pk=run_id).update(status=Run.Status.STOPPED)  # as run_transition's stop does
    assert trainer_task.train_step.apply(args=(run_id, 2)).get()["status"] in ("superseded", "not running")
    assert _followers_end(followers, within=60), "a stopped run's follower outlived it"
    assert run_id not in trainer_resident.RESIDENTS


def test_two_hosts_over_loopback_with_their_own_storage_make_the_one_process_lora_update(
    owner: Any, tiny_model_dir: Path, settings: Any, tmp_path: Path
) -> None:
    """trainer.hosts: 2 with one process each, a LoRA run: the train task is rank 0 on its
    host, and a second "host" (`python -m workers.trainer.follower join`, its own
    storage root) joins the gang over 127.0.0.1 at RFT_LEARNER_PORT (with
    RFT_TRAINER_CPU_MMAP_THRESHOLD set there only). Every rank, rank 0 included, builds the
    frozen base on its shards and a fresh adapter from the run's seed: the adapter rank 0
    publishes is the one-process adapter, and the joined host ends cleanly with the run's
    gang. (A LoRA run on two processes of one host was a test of its own until 2026-11-26:
    its ranks run the same code as a joined host's, started by rank 0 instead of `join`, and
    the follower path is the full-weight test's above; issue 50.)"""
    from tests.servers import ROOT, free_port, spawn, stop

    torch.set_num_threads(1)
    lora = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]}
    one = _trained(owner, tiny_model_dir, algorithm="grpo", processes=1, lora=lora)
    settings.RFT_LEARNER_PORT = free_port()
    # The other host's rank returns freed memory as a worker so set does (its allocator tuned,
    # the heap trimmed after each block's backward): the same update.
    env = {**os.environ, "RFT_STORAGE_DIR": str(tmp_path / "host1-storage"), "PYTHONPATH": str(ROOT),
           "OMP_NUM_THREADS": "1", "RFT_TRAINER_CPU_MMAP_THRESHOLD": str(1 << 20)}
    # Started first: it waits for rank 0's store (as the compose file's learner-ranks service does).
    host1 = spawn([sys.executable, "-m", "workers.trainer.follower", "join", "127.0.0.1",
                   str(settings.RFT_LEARNER_PORT), "1"], env=env, log=tmp_path / "host1.log")
    try:
        two = _trained(owner, tiny_model_dir, algorithm="grpo", processes=2, hosts=2, lora=lora)
        gang = next(res.gang for res in trainer_resident.RESIDENTS.values() if res.gang is not None)
        assert gang.plan.hosts == 2 and gang.followers_started == [], "rank 1 is the other host's, not a follower here"
        assert one.keys() == two.keys() and one
        for name in one:
            torch.testing.assert_close(two[name], one[name], atol=1e-4, rtol=1e-3)
        for run_id in list(trainer_resident.RESIDENTS):
            trainer_resident.resident_drop(run_id)  # rank 0 closes the gang: the other host's rank ends
        assert host1.wait(timeout=60) == 0, (tmp_path / "host1.log").read_text()[-3000:]
    finally:
        stop(host1)


def test_a_host_on_other_code_is_refused_naming_what_differs_and_nothing_else() -> None:
    """A host whose checkout or libraries differ from rank 0's would fail inside a collective
    with an error about tensor sizes: `join` compares the fingerprint rank 0 put in the
    gang's spec with its own (`code_check`) and refuses naming each difference with both
    sides, and nothing that agrees. (`join` itself, its message and exit status, is the next
    test's: a subprocess of its own here cost a torch import; issue 50.)"""
    from workers.algorithms.gang import GangUnsupported, code_check, code_fingerprint

    mine = code_fingerprint()
    other = {**mine, "sources": "0123456789abcdef", "torch": "2.99.0"}
    code_check({"code": mine}, where="host 1")  # the same code: no refusal
    with pytest.raises(GangUnsupported) as refused:
        code_check({"code": other}, where="host 1")
    why = str(refused.value)
    assert "host 1 runs other code than rank 0" in why
    assert f"sources {mine['sources']} here, 0123456789abcdef at rank 0" in why
    assert f"torch {mine['torch']} here, 2.99.0 at rank 0" in why
    assert "transformers" not in why and "trl" not in why  # what agrees is not named


def _step_that_fails(owner: Any, model_dir: Path, *, processes: int, hosts: int) -> tuple[Any, StepOutcome, float]:
    """A train step of a two-process run whose other rank will not join: (the run after it,
    the task's answer, its seconds)."""
    import time

    from apps.runs.models import Run

    run = running_run(owner, model_dir, train_batch_size=12, total_steps=5,
                      trainer={"learning_rate": 1e-2, "loss_type": "grpo", "processes": processes, "hosts": hosts})
    _fill(run, expert=False)
    started = time.monotonic()
    out = trainer_task.train_step.apply(args=(run.pk, 1)).get()
    return Run.objects.get(pk=run.pk), out, time.monotonic() - started


def test_a_host_on_other_code_fails_the_runs_step_at_once_naming_what_differs(
    owner: Any, tiny_model_dir: Path, settings: Any, tmp_path: Path
) -> None:
    """The other host's `join` refuses a gang on other code (above); rank 0, waiting for
    it, fails the step with that reason as soon as it refuses, not when the gang's timeout
    (the train task's time limit) has passed, and the run says why."""
    import shutil

    from apps.runs.models import Run
    from tests.servers import ROOT, free_port, spawn, stop

    settings.RFT_LEARNER_PORT = free_port()
    settings.RFT_TRAIN_TIME_LIMIT = 600  # the gang's timeout: what rank 0 waited out before
    # The other host's checkout: this one with a file changed.
    other = tmp_path / "other-checkout"
    for part in ("kernel", "apps", "workers", "rftweb"):
        shutil.copytree(ROOT / part, other / part, ignore=shutil.ignore_patterns("__pycache__"))
    with (other / "workers" / "algorithms" / "batch.py").open("a") as f:
        f.write("\n# A line rank 0's checkout does not have.\n")
    host1 = spawn([sys.executable, "-m", "workers.trainer.follower", "join", "127.0.0.1",
                   str(settings.RFT_LEARNER_PORT), "1"], cwd=other,
                  env={**os.environ, "PYTHONPATH": str(other)}, log=tmp_path / "host1.log")
    try:
        run, out, seconds = _step_that_fails(owner, tiny_model_dir, processes=2, hosts=2)
        assert host1.wait(timeout=60) == 1, (tmp_path / "host1.log").read_text()[-3000:]
    finally:
        stop(host1)
    assert out["status"] == "failed", out
    assert "host 1 runs other code than rank 0" in out["error"] and "sources" in out["error"], out
    # `join` stops with the message on stderr (exit status 1 above), not a traceback.
    joined = (tmp_path / "host1.log").read_text(errors="replace")
    assert "at rank 0" in joined and "host 1 runs other code than rank 0" in joined, joined[-3000:]
    assert "Traceback" not in joined, joined[-3000:]
    assert seconds < 120, f"rank 0 waited {seconds:.0f} s for a host that had refused"
    assert run.status == Run.Status.FAILED and "host 1 runs other code than rank 0" in run.error


def test_a_follower_that_cannot_start_fails_the_runs_step_at_once_with_its_reason(
    owner: Any, tiny_model_dir: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower rank 0 starts on its own host stops before it joins (here a setting it
    cannot read): the step fails with the follower's reason at once, not at the gang's
    timeout with a rendezvous error."""
    from apps.runs.models import Run

    settings.RFT_TRAIN_TIME_LIMIT = 600
    # Read by the follower's Django settings only: this process's are loaded already.
    monkeypatch.setenv("RFT_TRAINER_CPU_MMAP_THRESHOLD", "plenty")
    run, out, seconds = _step_that_fails(owner, tiny_model_dir, processes=2, hosts=1)
    assert out["status"] == "failed", out
    assert "rank 1 could not start" in out["error"] and "RFT_TRAINER_CPU_MMAP_THRESHOLD" in out["error"], out
    assert seconds < 120, f"rank 0 waited {seconds:.0f} s for a follower that had stopped"
    assert run.status == Run.Status.FAILED


@pytest.fixture
def one_process_grpo_weights(owner: Any, tiny_model_dir: Path) -> dict[str, torch.Tensor]:
    """The one-process GRPO weights after step 1, trained before any conductor is up: a
    conductor advances every running run, so with one alive it could send this run's step 1
    first, between the batch's rows and the task run here, and the task run here would then
    be refused as superseded (what CI saw under load). The run is stopped after, so the
    conductor started next leaves it alone."""
    from apps.runs.models import Run

    torch.set_num_threads(1)
    weights = _trained(owner, tiny_model_dir, algorithm="grpo", processes=1)
    Run.objects.filter(status=Run.Status.RUNNING).update(status=Run.Status.STOPPED)
    for run_id in list(trainer_resident.RESIDENTS):
        trainer_resident.resident_drop(run_id)
    return weights


def test_a_celery_train_worker_runs_a_two_process_run_to_the_one_process_weights(
    owner: Any, tiny_model_dir: Path, one_process_grpo_weights: dict[str, torch.Tensor], own_celery_workers: Any
) -> None:
    """The same through a real train worker (a prefork child starts the follower) and the
    conductor, from `start` to a finished run. (one_process_grpo_weights comes before
    own_celery_workers: pytest sets fixtures up in the order they are asked for.)"""
    from safetensors.torch import load_file

    from apps.runs.models import Run
    from apps.runs.services import run_transition
    from tests.factories import make_run, make_taskset
    from tests.trainer.test_modes import drive

    torch.set_num_threads(1)
    one = one_process_grpo_weights
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), model=str(tiny_model_dir), mode="train",
                   train_batch_size=12, repeat_times=4, explore_batch_size=2, total_steps=1,
                   trainer={"learning_rate": 1e-2, "loss_type": "grpo", "processes": 2})
    _fill(run, expert=False)
    run_transition(run=run, action="start", actor=owner)
    run = drive(run, lambda r: r.status == Run.Status.FINISHED, explorer=None, timeout=600)
    assert Metric.objects.get(run=run, step=1, name="learner_processes").value == 2
    two = load_file(str(Path(ModelVersion.objects.get(run=run, number=1).checkpoint) / "model.safetensors"))
    for name in one:
        torch.testing.assert_close(two[name], one[name], atol=1e-4, rtol=1e-3)


def _gang_spy(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every learner gang the train task starts (the resident may be gone by the time it returns)."""
    started: list[Any] = []
    real = trainer_resident.gang_start

    def spy(**kwargs: Any) -> Any:
        gang = real(**kwargs)
        if gang is not None:  # None: a one-process run's
            started.append(gang)
        return gang

    monkeypatch.setattr("workers.trainer.resident.gang_start", spy)
    return started


def _followers_end(processes: list[Any], *, within: float) -> bool:
    """Whether every process has ended within `within` seconds: a bound that returns as soon as
    they have, sized for a loaded host (a follower's exit tears torch down), not a quiet one."""
    import time

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if all(p.poll() is not None for p in processes):
            return True
        time.sleep(0.2)
    return False


def _two_process_run_after_step_one(
    owner: Any, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, *, total_steps: int,
    trainer: dict[str, Any] | None = None,
) -> tuple[Any, list[Any], list[Any]]:
    """A running two-process GRPO run that has trained step 1 through the train task (with a
    batch for step 2 waiting when it has steps left): the run, its gang's followers, and
    every gang the train task starts (this one first, later ones appended as they start)."""
    torch.set_num_threads(1)
    started = _gang_spy(monkeypatch)
    run = running_run(owner, tiny_model_dir, train_batch_size=12, total_steps=total_steps,
                      trainer={"learning_rate": 1e-2, "loss_type": "grpo", "processes": 2, **(trainer or {})})
    _fill(run, expert=False)
    if total_steps > 1:
        _fill(run, expert=False, tag="b", version=1)  # a batch for step 2: the run goes on after step 1
    assert trainer_task.train_step.apply(args=(run.pk, 1)).get()["status"] == "trained"
    return run, [p for gang in started for p in gang.followers_started], started


def _two_steps(owner: Any, model_dir: Path, settings: Any, monkeypatch: pytest.MonkeyPatch, *,
               processes: tuple[int, int]) -> dict[str, torch.Tensor]:
    """Step 1 with `processes[0]` learner processes (a snapshot after it), the resident gone
    as a restarted worker would have it (a learner gang's by the idle reaper, below), then
    step 2 with `processes[1]`: version 2."""
    from safetensors.torch import load_file

    from apps.runs.models import Run

    settings.RFT_TRAINER_SNAPSHOT_STEPS = 1
    settings.RFT_TRAIN_CHAIN_SECONDS = 0
    trainer = {"learning_rate": 1e-2, "loss_type": "dapo", "processes": processes[0]}
    run = running_run(owner, model_dir, train_batch_size=12, total_steps=5, trainer=trainer)
    _fill(run, expert=False)
    _fill(run, expert=False, tag="b", version=1)
    started = _gang_spy(monkeypatch)
    assert step_module.trainer_step(run_id=run.pk, step=1)["status"] == "trained"
    snapshot = trainer_journal.state_dir(run.pk, 1)
    if processes[0] > 1:
        assert (snapshot / "dcp" / ".metadata").exists() and len(list((snapshot / "dcp").glob("*.distcp"))) == processes[0]
        # A run with steps left that gets no train task (paused, stopped, its buffer used up):
        # the worker's idle reaper frees its policy and ends the followers after
        # RFT_TRAINER_IDLE_SECONDS (1 s here; this was a test of its own, a gang started
        # for it alone: issue 50).
        followers = [p for gang in started for p in gang.followers_started]
        assert followers
        assert _followers_end(followers, within=90), "the idle reaper did not end the followers"
        assert run.pk not in trainer_resident.RESIDENTS
    trainer_resident.resident_drop(run.pk)  # the one-process resident (or none: the reaper's pass may have come)
    Run.objects.filter(pk=run.pk).update(config={**run.config, "trainer": {**trainer, "processes": processes[1]}})
    assert step_module.trainer_step(run_id=run.pk, step=2)["status"] == "trained"
    return load_file(str(Path(ModelVersion.objects.get(run=run, number=2).checkpoint) / "model.safetensors"))


def test_a_sharded_snapshot_two_processes_wrote_resumes_in_one_process_to_the_one_process_weights(
    owner: Any, tiny_model_dir: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer's snapshot of a two-process run is sharded (each rank its file); a worker
    that restarts the run in one process loads it and trains step 2 as if nothing changed.
    The two-process run's gang, idle once step 1 is in, ends by the idle reaper."""
    torch.set_num_threads(1)
    # Set before any resident loads: the reaper a load starts sleeps a quarter of this between passes.
    settings.RFT_TRAINER_IDLE_SECONDS = 1.0
    one = _two_steps(owner, tiny_model_dir, settings, monkeypatch, processes=(1, 1))
    resumed = _two_steps(owner, tiny_model_dir, settings, monkeypatch, processes=(2, 1))
    for name in one:
        torch.testing.assert_close(resumed[name], one[name], atol=1e-4, rtol=1e-3)


def test_the_idle_reaper_leaves_a_resident_a_task_is_using(owner: Any, tiny_model_dir: Path) -> None:
    run = running_run(owner, tiny_model_dir, total_steps=5)
    res = trainer_resident.resident_for(run_view_of(run))
    res.used -= 100
    with trainer_resident.resident_busy(run.pk):
        assert trainer_resident.residents_reap(idle_seconds=10) == []
    # The task's end restarts the idle clock.
    assert trainer_resident.residents_reap(idle_seconds=10) == []
    res.used -= 100
    assert trainer_resident.residents_reap(idle_seconds=10) == [run.pk]
    assert run.pk not in trainer_resident.RESIDENTS


def test_a_resident_whose_run_ended_with_steps_left_goes_at_the_reapers_next_pass(
    owner: Any, tiny_model_dir: Path
) -> None:
    """A run that finishes on a used-up buffer, or is stopped, gets no further train task to
    drop its policy: the reaper asks which of its residents' runs have ended and drops those
    at once, not after RFT_TRAINER_IDLE_SECONDS; a running run's resident stays."""
    from apps.runs.models import Run

    for pk in list(trainer_resident.RESIDENTS):  # this test counts residents exactly: none left by others
        trainer_resident.resident_drop(pk)
    ended = running_run(owner, tiny_model_dir, total_steps=5)
    going = running_run(owner, tiny_model_dir, total_steps=5)
    trainer_resident.resident_for(run_view_of(ended))
    trainer_resident.resident_for(run_view_of(going))
    # No conductor may run here: it finishes a train-mode run with no batch (CI once saw both
    # finished by the module-wide one an earlier test had left running).
    assert trainer_resident.residents_ended() == set(), list(Run.objects.values_list("pk", "status", "error"))
    Run.objects.filter(pk=ended.pk).update(status=Run.Status.FINISHED)
    assert trainer_resident.residents_ended() == {ended.pk}
    assert trainer_resident.residents_reap(idle_seconds=600, ended=trainer_resident.residents_ended()) == [ended.pk]
    assert ended.pk not in trainer_resident.RESIDENTS and going.pk in trainer_resident.RESIDENTS
    trainer_resident.resident_drop(going.pk)


def test_loading_a_resident_never_evicts_one_a_train_task_is_using(
    owner: Any, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded pool's threads share the residents: a new run's policy evicts the least
    recently used idle one, not one that another thread is stepping."""
    monkeypatch.setattr("workers.trainer.resident._MAX_RESIDENT_RUNS", 1)
    busy, idle, new = (running_run(owner, tiny_model_dir, total_steps=5) for _ in range(3))
    with trainer_resident.resident_busy(busy.pk):
        using = trainer_resident.resident_for(run_view_of(busy))
        trainer_resident.resident_for(run_view_of(idle))
        assert set(trainer_resident.RESIDENTS) == {busy.pk, idle.pk}  # over the cap: the busy one stays
        assert trainer_resident.RESIDENTS[busy.pk] is using
        trainer_resident.resident_for(run_view_of(new))
        assert set(trainer_resident.RESIDENTS) == {busy.pk, new.pk}
    trainer_resident.resident_for(run_view_of(idle))  # none busy now: back to the cap, least recently used first
    assert set(trainer_resident.RESIDENTS) == {idle.pk}
    trainer_resident.resident_drop(idle.pk)


# Three gangs start (each a follower importing torch, transformers and Django): 16 min at load 40.
@pytest.mark.timeout(1800)
def test_a_rank_killed_mid_step_fails_the_step_commits_nothing_and_the_run_resumes_using_every_experience_once(
    owner: Any, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """Step 2 of a two-process run: once the follower has the batch and is inside its update,
    it is killed (SIGKILL, as a dead host). Rank 0's collective fails, the step raises and
    records nothing (the run stays at step 1, its batch goes back to the buffer unused); the
    step sent again starts a new gang from the last committed step, and the run finishes
    with every experience used exactly once."""
    import signal

    from apps.runs.models import Run
    from tests.run_invariants import django_sql, experiences_used_once
    from workers.algorithms.learner import Learner

    settings.RFT_TRAIN_CHAIN_SECONDS = 0  # one step a call: step 2 is the one the kill meets
    run, followers, started = _two_process_run_after_step_one(owner, tiny_model_dir, monkeypatch, total_steps=3)
    _fill(run, expert=False, tag="c", version=2)  # step 3's batch
    assert len(followers) == 1 and followers[0].poll() is None
    real_step = Learner.step
    killed: list[int] = []

    def step_after_killing_the_follower(self: Learner, batch: Any, *, shard: Any = None) -> dict[str, float]:
        if shard is not None and not killed:
            # Rank 0 is here once the follower holds the step's batch: it is mid-step.
            followers[0].send_signal(signal.SIGKILL)
            followers[0].wait(timeout=30)
            killed.append(followers[0].pid)
        return real_step(self, batch, shard=shard)

    monkeypatch.setattr(Learner, "step", step_after_killing_the_follower)
    with pytest.raises(Exception):
        step_module.trainer_step(run_id=run.pk, step=2)
    assert killed, "the follower was not killed mid-step"
    run.refresh_from_db()
    assert run.train_step == 1, "the failed step was committed"
    assert not Metric.objects.filter(run=run, step=2).exists()
    assert run.pk not in trainer_resident.RESIDENTS, "the broken gang's weights were kept"
    assert django_sql("SELECT count(*) FROM buffer_experience WHERE run_id = %s AND status = 'consumed'", [run.pk]) == [(12,)]

    monkeypatch.setattr(Learner, "step", real_step)
    for step in (2, 3):  # sent again by the loop: a new gang (a new follower) resumes the run
        assert step_module.trainer_step(run_id=run.pk, step=step)["status"] == "trained"
    run.refresh_from_db()
    assert (run.status, run.train_step) == (Run.Status.FINISHED, 3)
    assert Metric.objects.get(run=run, step=2, name="learner_processes").value == 2
    experiences_used_once(django_sql, run.pk, steps=3, batch=12)
    # The run has no step left: the last gang's followers exit and the resident goes (was a
    # test of its own, a gang started for it alone; issue 50).
    last = [p for gang in started[1:] for p in gang.followers_started]
    assert last and _followers_end(last, within=60), "a follower outlived its finished run"
    assert run.pk not in trainer_resident.RESIDENTS


def _train_task(run_id: int, step: int) -> StepOutcome:
    """The train task as the loop sends it: under the id the run's train dispatch names where
    a step it ended sent the next one already (another id would be refused as superseded)."""
    from apps.runs.models import Dispatch

    sent = Dispatch.objects.filter(run_id=run_id, job="train", state="sent").values_list("task_id", flat=True).first()
    out: StepOutcome = trainer_task.train_step.apply(args=(run_id, step), task_id=sent or None).get()
    return out


# Two gangs start (each a follower importing torch, transformers and Django), and one step
# waits out the collective timeout.
@pytest.mark.timeout(1200)
def test_a_rank_that_stops_answering_mid_step_fails_the_step_within_the_collective_timeout_naming_it(
    owner: Any, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """Step 2 of a two-process run with trainer.collective_timeout_s 30: once the follower
    holds the batch it is stopped (SIGSTOP: its connections stay open and nothing resets
    them, as when its host is lost or its link cut, where a killed process's reset fails the
    collective at once). Rank 0's collective waits out the timeout; the train task answers
    "gang lost" within the timeout plus the heartbeat watch, naming rank 1 and its host; the
    run keeps running with the reason on its page, nothing of step 2 is committed and its
    batch is back in the buffer; the step sent again trains on a new gang, and the run ends
    with every experience used once."""
    import signal
    import time

    from apps.runs.models import Run, TaskFailure
    from tests.run_invariants import django_sql, experiences_used_once
    from workers.algorithms.gang import SILENT_S
    from workers.algorithms.learner import Learner

    from tests.servers import free_port

    timeout_s = 30.0
    settings.RFT_TRAIN_CHAIN_SECONDS = 0  # one step a call: step 2 is the one the stop meets
    # A fixed port, as another host's ranks need: the re-formed gang binds it again.
    settings.RFT_LEARNER_PORT = free_port()
    run, followers, _ = _two_process_run_after_step_one(owner, tiny_model_dir, monkeypatch, total_steps=3,
                                                        trainer={"collective_timeout_s": timeout_s})
    _fill(run, expert=False, tag="c", version=2)  # step 3's batch
    real_step = Learner.step
    stopped: list[float] = []

    def step_after_stopping_the_follower(self: Learner, batch: Any, *, shard: Any = None) -> dict[str, float]:
        if shard is not None and not stopped:
            # Rank 0 is here once the follower holds the step's batch: it is mid-step.
            followers[0].send_signal(signal.SIGSTOP)
            stopped.append(time.monotonic())
        return real_step(self, batch, shard=shard)

    monkeypatch.setattr(Learner, "step", step_after_stopping_the_follower)
    try:
        out = _train_task(run.pk, 2)
        detect_s = time.monotonic() - stopped[0]
    finally:
        if followers[0].poll() is None:
            followers[0].send_signal(signal.SIGCONT)
    assert out["status"] == "gang lost", out
    assert "rank 1 (host 0, 127.0.0.1) stopped answering during a step" in out["error"], out
    assert "trainer.collective_timeout_s = 30 s" in out["error"], out
    # It waited for the timeout (no reset came) and not much longer: the stated bound.
    assert timeout_s * 0.9 <= detect_s <= timeout_s + SILENT_S + 30, detect_s
    run.refresh_from_db()
    assert (run.status, run.train_step) == (Run.Status.RUNNING, 1), "the run failed, or the step was committed"
    assert not Metric.objects.filter(run=run, step=2).exists()
    assert django_sql("SELECT count(*) FROM buffer_experience WHERE run_id = %s AND status = 'consumed'", [run.pk]) == [(12,)]
    assert django_sql("SELECT count(*) FROM buffer_experience WHERE run_id = %s AND status = 'leased'", [run.pk]) == [(0,)]
    shown = TaskFailure.objects.get(run=run)
    assert (shown.task, shown.step) == ("learner gang", 2) and "rank 1 (host 0, 127.0.0.1)" in shown.message
    assert _followers_end(followers, within=60), "the stopped follower outlived its broken gang"

    monkeypatch.setattr(Learner, "step", real_step)
    recovered = time.monotonic()
    for step in (2, 3):  # sent again by the loop: a new gang resumes the run
        assert _train_task(run.pk, step)["status"] == "trained"
        if step == 2:
            recover_s = time.monotonic() - recovered
    run.refresh_from_db()
    assert (run.status, run.train_step) == (Run.Status.FINISHED, 3)
    experiences_used_once(django_sql, run.pk, steps=3, batch=12)
    print(f"rank stopped mid-step: failed after {detect_s:.1f} s (timeout {timeout_s:.0f} s), step 2 trained on a"
          f" new gang {recover_s:.1f} s after; load average {os.getloadavg()[0]:.1f}")
