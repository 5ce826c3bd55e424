"""Issue 46, item 1: evaluation metrics named for what they measure. The evaluator is fed a
model that answers every problem in perfect form: wrongly (accuracy 0, format share 1, the
reward its format term's 0.1) and rightly (accuracy 1). Old code reported the wrong answers as
"accuracy" 1.0 (every score above 0). The figures are recomputed here from the tasks' rows."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest
from django.test import Client

from apps.buffer.models import Task
from apps.envapi.services import api_key_create
from apps.rewards.math_rules import answers_equivalent
from apps.rewards.verify import answer_verdict
from apps.runs.metrics import metric_record
from apps.runs.models import Metric, ModelVersion, Run
from tests.factories import make_run, make_taskset, make_user

pytestmark = pytest.mark.django_db


@dataclass
class _Sample:
    text: str
    token_ids: list[int]


class _Model:
    """Answers every task with `answer(reference)` inside one tidy answer tag."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def generate(self, prompts: list[Any], *, n: int, sampling: Any) -> list[list[_Sample]]:
        return [[_Sample(f"Let me think. <answer>{self.answer(t.reference)}</answer>", [1, 2, 3])] * n
                for t in prompts]


def _evaluate(monkeypatch: pytest.MonkeyPatch, run: Run, answer: Any, version: int = 0) -> dict[str, float]:
    import workers.explore.evaluation as evaluation
    from workers.explore.evaluation import evaluate_version

    monkeypatch.setattr(evaluation, "engine_at", lambda **_: _Model(answer))
    monkeypatch.setattr(evaluation, "task_prompt", lambda engine, task: task)
    outcome = evaluate_version(run_id=run.pk, version=version, worker="test")
    assert "skipped" not in outcome and "failed" not in outcome, outcome
    step = outcome["step"]
    return dict(Metric.objects.filter(run=run, step=step, name__startswith="eval/").values_list("name", "value"))


def _math_run(**config: Any) -> Run:
    owner = make_user()
    evalset = make_taskset(6, owner=owner, name="held-out")
    # The math domain's default routes: math_accuracy + 0.1 x math_format.
    return make_run(owner=owner, taskset=make_taskset(owner=owner), rewards=[], eval_every=1,
                    eval={"taskset": evalset.pk, **config})


def _evalset(run: Run) -> int:
    assert run.cfg.eval.taskset is not None
    return run.cfg.eval.taskset


def _reference(ref: object) -> str:
    return str(ref["answer"] if isinstance(ref, dict) else ref)


def test_perfectly_formed_wrong_answers_score_accuracy_0(monkeypatch: pytest.MonkeyPatch) -> None:
    run = _math_run()
    values = _evaluate(monkeypatch, run, lambda ref: int(_reference(ref)) + 1)
    # Recomputed from the rows: the math checker finds no answer equal to its reference.
    tasks = list(Task.objects.filter(taskset_id=_evalset(run)).order_by("index"))
    expected = sum(answers_equivalent(gold=_reference(t.reference), answer=str(int(_reference(t.reference)) + 1))[0]
                   for t in tasks) / len(tasks)
    assert expected == 0.0
    assert values["eval/accuracy"] == expected
    assert values["eval/format_share"] == 1.0
    assert values["eval/reward_mean"] == pytest.approx(0.1)  # the format term alone
    assert "eval/positive_share" not in values  # the old figure is not recorded any more


def test_right_answers_score_accuracy_1(monkeypatch: pytest.MonkeyPatch) -> None:
    run = _math_run()
    values = _evaluate(monkeypatch, run, _reference)
    assert values["eval/accuracy"] == 1.0 and values["eval/format_share"] == 1.0
    assert values["eval/reward_mean"] == pytest.approx(1.1)


def test_half_right_is_half(monkeypatch: pytest.MonkeyPatch) -> None:
    run = _math_run()
    values = _evaluate(monkeypatch, run, lambda ref: _reference(ref) if int(_reference(ref)) % 4 == 0 else "x")
    tasks = Task.objects.filter(taskset_id=_evalset(run))
    right = [answer_verdict(completion=f"<answer>{_reference(t.reference)}</answer>", task=t).correct for t in tasks]
    assert all(right)
    expected = sum(1 for t in tasks if int(_reference(t.reference)) % 4 == 0) / tasks.count()
    assert values["eval/accuracy"] == pytest.approx(expected)


def test_a_domain_without_a_verifier_reports_no_accuracy() -> None:
    # K-12 answers are graded by models (a judge, a learned grader): no rule verifies them.
    verdict = answer_verdict(completion="<answer>Paris</answer>",
                             task={"domain": "k12", "reference": "Paris", "prompt": "Capital of France?"})
    assert verdict.correct is None
    # Code: every test must pass; a task without tests has nothing to verify against.
    assert answer_verdict(completion="print(1)", task={"domain": "code", "tests": None}).correct is None
    # Anything else is checked against its reference, where it has one.
    assert answer_verdict(completion="<answer>b</answer>", task={"domain": "general", "reference": "a"}).correct is False
    assert answer_verdict(completion="<answer>a</answer>", task={"domain": "general", "reference": "a"}).correct is True
    assert answer_verdict(completion="anything", task={"domain": "general"}).correct is None


def test_best_by_names_the_metric_in_the_summary_and_the_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """The best version is chosen by `eval.best_by` (here a preference share); the summary
    names it and shows every evaluation series start -> end -> best, equal to the rows."""
    from apps.runs.services import run_transition

    run = _math_run(preferences=["concise"], best_by="preference/concise")
    owner = run.owner
    run_transition(run=run, action="start", actor=owner)
    series = {  # step: (accuracy, reward_mean, concise share)
        1: (0.2, 0.3, 0.1), 2: (0.6, 0.7, 0.4), 3: (0.4, 0.5, 0.9),
    }
    for step, (acc, reward, concise) in series.items():
        ModelVersion.objects.create(run=run, number=step, checkpoint=f"/x/v{step}", train_step=step)
        metric_record(run=run, step=step, values={"eval/accuracy": acc, "eval/reward_mean": reward,
                                                  "eval/format_share": 1.0, "eval/preference/concise": concise,
                                                  "eval/version": float(step)})
    Run.objects.filter(pk=run.pk).update(current_version=3, train_step=3)
    run.refresh_from_db()
    run_transition(run=run, action="finish")
    client = Client()
    client.force_login(owner)
    html = client.get(f"/runs/{run.pk}/").content.decode()
    # Computed from the rows: the version whose concise share is highest.
    rows = dict(Metric.objects.filter(run=run, name="eval/preference/concise").values_list("step", "value"))
    best_step = max(rows, key=lambda s: rows[s])
    assert best_step == 3
    assert 'data-version="3" data-chosen-by="eval/preference/concise"' in html
    assert "chosen by eval/preference/concise (eval.best_by)" in html
    for name in ("eval/accuracy", "eval/reward_mean", "eval/format_share", "eval/preference/concise"):
        values = list(Metric.objects.filter(run=run, name=name).order_by("step").values_list("value", flat=True))
        row = html.split(f'<tr data-metric="{name}"', 1)[1].split("</tr>", 1)[0]
        cells = [c.split(">", 1)[1] for c in row.split('<td class="num"')[1:]]
        start, end, _change, best = (c.split("</td>")[0] for c in cells[:4])
        assert (start, end, best) == (f"{values[0]:.3f}", f"{values[-1]:.3f}", f"{max(values):.3f}"), name
    assert "preference share: concise" in html and "accuracy (the domain&#x27;s verifier)" in html
    # The API says the same.
    _, token = api_key_create(name="k", runs=[run], actions=["read"], created_by=owner)
    body = Client().get(f"/api/v1/runs/{run.pk}/evaluation", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert (body["best_version"], body["best_by"]) == (3, "eval/preference/concise")
    got = {s["name"]: (s["start"], s["end"], s["best"]) for s in body["series"]}
    assert got["eval/accuracy"] == (0.2, 0.4, 0.6) and got["eval/preference/concise"] == (0.1, 0.9, 0.9)


def test_best_by_must_be_an_evaluated_series() -> None:
    from kernel.config import ConfigInvalid, config_validate
    from tests.factories import base_config

    with pytest.raises(ConfigInvalid) as exc:
        config_validate(data=base_config(eval={"best_by": "preference/concise"}))
    assert "eval.best_by" in exc.value.errors and "eval.preferences" in exc.value.errors["eval.best_by"]
    with pytest.raises(ConfigInvalid) as exc:
        config_validate(data=base_config(eval={"best_by": "loss"}))
    assert "accuracy, reward_mean, format_share" in exc.value.errors["eval.best_by"]


def test_old_accuracy_rows_read_as_the_share_scoring_above_0() -> None:
    """Migration runs/0009 renamed the stored `eval/accuracy` rows (the share scoring above 0)."""
    from importlib import import_module

    from django.apps import apps as django_apps

    run = make_run()
    metric_record(run=run, step=1, values={"eval/accuracy": 0.96})
    import_module("apps.runs.migrations.0009_eval_positive_share").rename(django_apps, None)
    assert dict(Metric.objects.filter(run=run).values_list("name", "value")) == {"eval/positive_share": 0.96}
    from kernel.eval_series import metric_label

    assert metric_label("eval/positive_share") == "share scoring above 0 (older evaluations)"


def test_the_new_run_form_offers_the_evaluation_series_to_choose_the_best_version(tmp_path: Any) -> None:
    """A select of the series (each registered preference's share among them); a choice that
    names a preference the run does not measure is a field error, one it measures is kept."""
    from kernel.preferences import preference_names
    from workers.models.tiny import tiny_model_save

    owner = make_user("owner")
    client = Client()
    client.force_login(owner)
    html = client.get("/runs/new/").content.decode()
    select = html.split('name="eval.best_by"', 1)[1].split("</select>", 1)[0]
    offered = re.findall(r'<option value="([^"]*)"', select)
    assert offered == ["", "accuracy", "reward_mean", "format_share", *(f"preference/{n}" for n in preference_names())]
    folder = tiny_model_save(tmp_path / "tiny", hidden_size=16, layers=1, heads=2)
    evalset = make_taskset(owner=owner, name="held-out")
    form = {"name": "best", "model": str(folder), "taskset_id": str(make_taskset(owner=owner).pk),
            "rewards": "- name: exact_match", "eval_every": "1", "eval.taskset": str(evalset.pk),
            "eval.best_by": "preference/concise"}
    response = client.post("/runs/new/", form)
    assert response.status_code == 400 and "a preference must be one of eval.preferences" in response.content.decode()
    response = client.post("/runs/new/", {**form, "eval.preferences": "[concise]"})
    assert response.status_code == 302, response.content.decode()[-2000:]
    assert Run.objects.get(name="best").cfg.eval.best_by == "preference/concise"
