"""The reward model learned inside the run, of each kind (`head`, the default: an ensemble of
scalar heads on the base's pooled hidden states; `likelihood`: the base's token
log-likelihoods weighed by a Bradley-Terry model; `classifier`: TRL's RewardTrainer) from the
run's preference pairs: held-out accuracy above chance, versions stored, scores that record
the version, and the `learned` policy that trains on them without waiting for people."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from django.contrib.auth.models import User

torch = pytest.importorskip("torch")

from apps.buffer.models import Experience
from apps.buffer.services import experience_write
from apps.feedback.kinds.pairwise import feedback_compare
from apps.feedback.kinds.ranking import feedback_rank
from apps.feedback.kinds.rating import feedback_rate
from apps.feedback.reward_model.versions import reward_model_due, reward_model_usable
from apps.rewards.models import RewardModel, RewardModelScore
from apps.runs.models import Run
from tests.factories import add_member, experience_row, make_run
from workers.reward.trainer import reward_model_score_run, reward_model_train_run
from apps.runs.ports import run_view_of


pytestmark = [pytest.mark.django_db, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _storage(settings: object, tmp_path: Path) -> None:
    settings.RFT_STORAGE_DIR = tmp_path / "storage"  # type: ignore[attr-defined]
    torch.set_num_threads(1)


def _rm_config(model: Path, **rm: object) -> dict[str, object]:
    return {"enabled": True, "base": str(model), "retrain_every": 20, "heldout_share": 0.25, "epochs": 4,
            "learning_rate": 3e-4, "batch_size": 16, "max_length": 64, **rm}


def _blend_run(owner: User, annotator: User, model: Path, *, name: str = "run", **rm: object) -> Run:
    """A run under `blend` with a reward model over `model`, `annotator` a member."""
    run = make_run(owner=owner, feedback={"mode": "blend"}, name=name, reward_model=_rm_config(model, **rm))
    add_member(run, annotator)
    return run


def _problem(rng: random.Random) -> tuple[str, str, str]:
    """A prompt, the answer people prefer (tagged) and the one they do not (bare)."""
    a, b = rng.randint(0, 99), rng.randint(0, 9)
    return f"What is {a} + {b}?", f"<answer>{a + b}</answer>", f"{a + b} is it"


def _groups(run: Run, n: int, *, seed: int, status: str = "pending", size: int = 2) -> list[list[Experience]]:
    """n groups whose first member is the preferred form and the others the other form."""
    rng = random.Random(seed)
    rows = []
    for g in range(n):
        prompt, good, bad = _problem(rng)
        for i in range(size):
            rows.append(experience_row(run, key=f"s{seed}-{g}-{i}", group=f"s{seed}-g{g}", status=status, reward=None,
                                       auto_reward=0.0, prompt_text=prompt, response_text=good if i == 0 else bad))
    ids = experience_write(experiences=rows).ids
    exps = list(Experience.objects.filter(pk__in=ids).order_by("id"))
    return [exps[i:i + size] for i in range(0, len(exps), size)]


def _compare_all(run: Run, groups: list[list[Experience]], annotator: User) -> None:
    for good, bad, *_ in groups:
        feedback_compare(run=run, author=annotator, experience=bad, other=good, winner="b")


@pytest.mark.parametrize("kind", ["head", "likelihood", "classifier"])
def test_a_reward_model_learns_a_crafted_preference_and_each_version_is_stored(
    owner: User, annotator: User, demo_model_dir: Path, kind: str,
) -> None:
    # The held-out split (crossval_folds 0; cross-validation, the default of head and
    # likelihood, has its own test below).
    run = _blend_run(owner, annotator, demo_model_dir, kind=kind, crossval_folds=0)
    assert reward_model_train_run(run=run_view_of(run)) is None  # nothing due: no labels yet
    _compare_all(run, _groups(run, 80, seed=1), annotator)
    assert reward_model_due(run=run)

    v1 = reward_model_train_run(run=run_view_of(run))
    assert v1 is not None and v1.version == 1 and v1.labels == 80
    assert v1.pairs_heldout >= 8 and v1.pairs_train + v1.pairs_heldout == 80
    assert v1.accuracy is not None and v1.accuracy >= 0.8, v1.accuracy  # chance is 0.5
    assert not reward_model_due(run=run)

    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if kind == "classifier":
        # The directory is a plain sequence classifier: transformers loads it on its own.
        net = AutoModelForSequenceClassification.from_pretrained(v1.path)
        assert net.config.num_labels == 1 and AutoTokenizer.from_pretrained(v1.path) is not None
    elif kind == "head":
        # The directory names the base checkpoint whose hidden states it reads and the
        # ensemble's heads, one weight per pooled feature each.
        import json

        heads = json.loads((Path(v1.path) / "head_reward.json").read_text())
        assert heads["kind"] == "head" and heads["base"] == str(demo_model_dir) == v1.base
        assert len(heads["heads"]) == 5 and {len(h) for h in heads["heads"]} == {len(heads["mean"])}
    else:
        # The directory names the base checkpoint it read and the fitted weights.
        import json

        head = json.loads((Path(v1.path) / "likelihood_reward.json").read_text())
        assert head["kind"] == "likelihood" and head["base"] == str(demo_model_dir) == v1.base
        assert len(head["weights"]) == len(head["features"]) and AutoTokenizer.from_pretrained(v1.path) is not None

    # Every open experience no person rated is scored by v1 (the compared ones too: a
    # comparison is no rating), each score naming v1.
    fresh = _groups(run, 6, seed=2, status="ready")
    assert reward_model_score_run(run=run_view_of(run)) == 160 + 12
    scores = {s.experience_id: s for s in RewardModelScore.objects.filter(experience__in=[e for g in fresh for e in g])}
    assert len(scores) == 12 and {s.reward_model_id for s in scores.values()} == {v1.pk}
    wins = sum(scores[good.pk].score > scores[bad.pk].score for good, bad in fresh)
    assert wins >= 5
    if kind == "head":  # each score carries how far the ensemble's heads disagree about it
        assert all(s.spread is not None and s.spread >= 0 for s in scores.values())
        assert len({round(s.spread or 0, 9) for s in scores.values()}) > 1
    assert reward_model_score_run(run=run_view_of(run)) == 0  # idempotent: nothing left for v1

    # Twenty more labels: version 2, and it scores under its own version.
    _compare_all(run, _groups(run, 20, seed=3), annotator)
    v2 = reward_model_train_run(run=run_view_of(run))
    assert v2 is not None and v2.version == 2 and v2.labels == 100 and v2.path != v1.path
    assert reward_model_score_run(run=run_view_of(run)) == 200 + 12
    assert set(RewardModel.objects.filter(run=run).values_list("version", flat=True)) == {1, 2}
    assert RewardModelScore.objects.filter(reward_model=v2, experience__in=scores).count() == 12


@pytest.mark.parametrize("kind", ["head", "likelihood"])
def test_cross_validation_holds_every_pair_out_once_and_the_version_fits_them_all(
    owner: User, annotator: User, demo_model_dir: Path, kind: str,
) -> None:
    run = _blend_run(owner, annotator, demo_model_dir, kind=kind, crossval_folds=4)
    _compare_all(run, _groups(run, 40, seed=1), annotator)
    rm = reward_model_train_run(run=run_view_of(run), force=True)
    # 40 pairs: the gate's evidence is all 40 (a 0.25 split would give it about 10).
    assert rm is not None and rm.pairs_heldout == rm.pairs_train == 40
    assert rm.accuracy is not None and rm.accuracy >= 0.8, rm.accuracy  # chance is 0.5


def test_a_cross_validated_version_is_calibrated_by_fits_that_never_saw_the_rated_groups(
    owner: User, annotator: User, demo_model_dir: Path,
) -> None:
    """Stars given at random to two forms of each answer: the version fitted on every pair
    finds a pattern in its own training labels, and a calibration on its in-sample scores
    would spread that noise over every learned reward. Cross-validated, each rated item is
    scored by the fold's fit that never saw its group, and the calibration stays flatter.
    Random stars can line up with a pattern by chance: nine draws; at most one may be
    steeper, and most must be much flatter."""
    from statistics import median, pstdev

    from workers.reward.trainer import calibration_fit, reward_scorer_load

    ratios = []
    draws = [(6, 11), (12, 11), (22, 21)] + [(100 + k, 200 + k) for k in range(6)]
    for draw, (groups_seed, stars_seed) in enumerate(draws):
        run = _blend_run(owner, annotator, demo_model_dir, name=f"random stars {draw}", kind="likelihood",
                         crossval_folds=4)
        rng = random.Random(stars_seed)
        for group in _groups(run, 40, seed=groups_seed):
            for e in group:
                feedback_rate(run=run, author=annotator, experience=e, score=rng.randint(1, 5))
        rm = reward_model_train_run(run=run_view_of(run), force=True)
        assert rm is not None and rm.pairs_train > 10
        rated = list(Experience.objects.filter(run=run, human_reward__isnull=False)
                     .values_list("prompt_text", "response_text", "human_reward"))
        scores = reward_scorer_load(rm.path, max_length=64)([r[0] for r in rated], [r[1] for r in rated])
        in_sample = calibration_fit(scores, [float(r[2] or 0.0) for r in rated])[0]
        # The spread each calibration gives the version's scores, on people's 0..1 scale.
        spread_in_sample = in_sample * pstdev(scores)
        assert spread_in_sample > 0, "in-sample scores follow their own random labels"
        ratios.append(rm.scale * pstdev(scores) / spread_in_sample)
    # 0 where the out-of-fold slope is not positive. The figures move with the demo model's
    # build (its float sums differ between CPUs): on one build the first three draws gave
    # 0.49 / 0 / 0, on another 0.58 / 0.65 / 0.32, and all nine 0.58 0.65 0.32 0 0 0.70 0.52 0 0.
    assert sum(r >= 1 for r in ratios) <= 1, ratios
    assert median(ratios) < 0.5, ratios


def test_learned_mode_trains_unrated_groups_on_reward_model_scores_without_waiting(
    owner: User, annotator: User, demo_model_dir: Path,
) -> None:
    # The reward model's base is the policy's own checkpoint (version 0: the run's model).
    run = make_run(owner=owner, model=str(demo_model_dir),
                   feedback={"mode": "learned", "w_auto": 0.5, "w_rm": 1.0, "w_human": 1.0,
                             "min_rm_accuracy": 0.7, "min_rm_heldout_pairs": 8, "wait_seconds": 3600},
                   reward_model=_rm_config(demo_model_dir, base="policy"))
    add_member(run, annotator)
    _compare_all(run, _groups(run, 80, seed=1), annotator)
    # Until a reward model is good enough, learned waits like blend: a new group stays pending.
    waiting = _groups(run, 1, seed=9, size=4)[0]
    assert reward_model_usable(run=run) is None
    assert {e.status for e in _fresh(waiting)} == {"pending"}

    rm = reward_model_train_run(run=run_view_of(run))
    assert rm is not None and reward_model_usable(run=run) == rm and rm.base == str(demo_model_dir)

    # A new group: one member rated by a person, the rest by no one.
    group = _groups(run, 1, seed=10, size=4)[0]
    feedback_rate(run=run, author=annotator, experience=group[1], score=5)
    reward_model_score_run(run=run_view_of(run))
    group = _fresh(group)
    assert {e.status for e in group} == {"ready"}  # nobody waited for the three unrated members
    rated, unrated = group[1], [group[0], group[2], group[3]]
    assert rated.reward == pytest.approx(0.5 * 0.0 + 1.0 * 1.0)  # blend of auto and the person's 5
    for e in unrated:
        s = RewardModelScore.objects.get(experience=e, reward_model=rm).score
        assert e.reward == pytest.approx(0.5 * 0.0 + 1.0 * rm.calibrated(s))
    # The preferred form (member 0) gets the higher learned reward than its bare siblings.
    assert group[0].reward is not None and group[2].reward is not None and group[3].reward is not None
    assert group[0].reward > max(group[2].reward, group[3].reward)
    # The group that waited while no reward model was good enough trains now too.
    assert {e.status for e in _fresh(waiting)} == {"ready"}


def _fresh(exps: list[Experience]) -> list[Experience]:
    return list(Experience.objects.filter(pk__in=[e.pk for e in exps]).order_by("id"))


def test_the_preference_export_trains_a_reward_model_with_trl(
    owner: User, annotator: User, demo_model_dir: Path, tmp_path: Path,
) -> None:
    """`rft export --format preferences` writes TRL's conversational preference rows, which
    RewardTrainer takes as they are."""
    import json

    from datasets import load_dataset
    from django.core.management import call_command
    from trl import RewardConfig, RewardTrainer

    run = make_run(owner=owner, feedback={"mode": "blend"})
    add_member(run, annotator)
    groups = _groups(run, 6, seed=4, size=3)
    _compare_all(run, groups[:3], annotator)
    for good, bad, worse in groups[3:]:
        feedback_rank(run=run, author=annotator, group_id=good.group_id, order=[good.pk, bad.pk, worse.pk])
    out = tmp_path / "prefs.jsonl"
    call_command("rft", "export", str(run.pk), "--format", "preferences", "--out", str(out))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 + 3 * 3
    assert all(r["chosen"][0]["content"].startswith("<answer>") for r in rows[:3])
    dataset = load_dataset("json", data_files=str(out), split="train")
    args = RewardConfig(output_dir=str(tmp_path / "rm"), max_steps=2, per_device_train_batch_size=4, report_to=[],
                        save_strategy="no", bf16=False, use_cpu=True, disable_tqdm=True, dataset_num_proc=None)
    trainer = RewardTrainer(model=str(demo_model_dir), args=args, train_dataset=dataset)
    result = trainer.train()
    assert result.global_step == 2


# A preference no verifier has: Anna prefers answers that say "certainly", right or wrong,
# whatever their form. The words around it are drawn alike for both sides.
_FORMS = ["<answer>{s}</answer>", "The sum is {s}.", "{a} plus {b} makes {s}. <answer>{s}</answer>",
          "Adding them gives {s}", "I think it is {s}.", "{s}", "First {a}, then add {b}: {s}."]


def _worded(rng: random.Random, a: int, b: int, *, word: str | None) -> str:
    words = rng.choice(_FORMS).format(a=a, b=b, s=a + b + rng.choice([0, 0, 1, -1])).split(" ")
    if word:
        words.insert(rng.randint(0, len(words)), word)
    return " ".join(words)


def test_a_reward_model_over_the_demo_model_learns_a_preference_for_a_word_on_prompts_it_never_saw(
    owner: User, annotator: User, demo_model_dir: Path,
) -> None:
    """The default kind (`head`) over the run's own model, from 60 of Anna's choices: held-out
    pairs (by prompt) ranked above 0.8, and so are pairs of 40 prompts no label touched."""
    from workers.reward.trainer import pairwise_accuracy, reward_scorer_load

    run = make_run(owner=owner, feedback={"mode": "blend"},
                   reward_model={"enabled": True, "base": str(demo_model_dir), "retrain_every": 20,
                                 "heldout_share": 0.25, "max_length": 64})
    assert run.cfg.reward_model.kind == "head"  # the default
    add_member(run, annotator)
    rng = random.Random(5)
    rows = []
    for g in range(60):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        for i, word in enumerate(("certainly", None)):
            rows.append(experience_row(run, key=f"w{g}-{i}", group=f"w{g}", status="pending", reward=None,
                                       auto_reward=0.0, prompt_text=f"What is {a} + {b}?",
                                       response_text=_worded(rng, a, b, word=word)))
    exps = list(Experience.objects.filter(pk__in=experience_write(experiences=rows).ids).order_by("id"))
    for worded, plain in zip(exps[::2], exps[1::2], strict=True):
        feedback_compare(run=run, author=annotator, experience=plain, other=worded, winner="b")

    rm = reward_model_train_run(run=run_view_of(run))
    assert rm is not None and rm.labels == 60 and rm.pairs_heldout >= 8
    assert rm.accuracy is not None and rm.accuracy > 0.8, rm.accuracy  # chance is 0.5

    fresh = random.Random(6)
    prompts, worded_answers, plain_answers = [], [], []
    for _ in range(40):
        a, b = fresh.randint(100, 199), fresh.randint(0, 99)
        prompts.append(f"What is {a} + {b}?")
        worded_answers.append(_worded(fresh, a, b, word="certainly"))
        plain_answers.append(_worded(fresh, a, b, word=None))
    score = reward_scorer_load(rm.path, max_length=64)
    accuracy = pairwise_accuracy(score(prompts, worded_answers), score(prompts, plain_answers))
    assert accuracy is not None and accuracy > 0.8, accuracy


def test_a_version_records_the_labels_of_the_pairs_it_trained_on(
    owner: User, annotator: User, demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 62, item 3: what the ledger reads. Through the real training path, the version
    records as trained on exactly the labels of the pairs its fit was handed (captured around
    the kind's own fit), as held out the labels of its held-out prompts, and a lone rating as
    lone; and the split agrees with the labels' prompts, computed here on their own."""
    from apps.feedback.models import Feedback
    from apps.feedback.reward_model.preferences import prompt_is_heldout
    from workers.reward.kinds import Fitted, reward_kind_impl

    run = _blend_run(owner, annotator, demo_model_dir, kind="head", crossval_folds=0)
    groups = _groups(run, 24, seed=1)
    _compare_all(run, groups, annotator)
    lone = feedback_rate(run=run, author=annotator, experience=_groups(run, 1, seed=9)[0][0], score=4)
    impl = reward_kind_impl("head")
    fit = impl.fit
    handed: list[Fitted] = []

    def capture(**kwargs: object) -> Fitted:
        fitted = fit(**kwargs)  # type: ignore[arg-type]
        handed.append(fitted)
        return fitted

    monkeypatch.setattr(impl, "fit", capture)
    rm = reward_model_train_run(run=run_view_of(run), force=True)
    assert rm is not None and len(handed) == 1
    (fitted,) = handed
    assert rm.trained_on == sorted({pk for p in fitted.train for pk in p.feedback_ids})
    assert rm.held_out == sorted({pk for p in fitted.heldout for pk in p.feedback_ids})
    assert rm.unpaired == {"lone": [lone.pk]}
    share, seed = run.cfg.reward_model.heldout_share, run.cfg.seed
    prompts = dict(Experience.objects.filter(run=run).values_list("pk", "prompt_text"))
    held = {f.pk: prompt_is_heldout(prompts[f.experience_id or 0], share=share, seed=seed)
            for f in Feedback.objects.filter(run=run, kind="pairwise")}
    assert rm.trained_on == sorted(pk for pk, out in held.items() if not out)
    assert rm.held_out == sorted(pk for pk, out in held.items() if out)
    assert rm.trained_on and rm.held_out and len(rm.trained_on) == rm.pairs_train
