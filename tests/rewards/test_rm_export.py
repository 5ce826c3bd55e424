"""An exported reward-model version loads where any reward model does
(`AutoModelForSequenceClassification`) and scores as the run's reward model did: the
`likelihood` kind through its own model class (trust_remote_code), the `classifier` kind as
it is. Doors: the `rft reward-model` command; its refusals are CLI errors."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from django.core.management import CommandError, call_command

from apps.rewards.pairs import PreferencePair
from apps.rewards.models import RewardModel
from tests.factories import make_run
from workers.reward.likelihood import likelihood_model_fit


PROBLEMS = [(a, b) for a in range(2, 9) for b in range(1, 6)]


def _pairs() -> list[PreferencePair]:
    # People preferred the tagged right answer over a bare wrong one.
    return [PreferencePair(prompt=f"What is {a} + {b}?", chosen=f"<answer>{a + b}</answer>", rejected=f"{a + b + 3}",
                           chosen_id=2 * i, rejected_id=2 * i + 1, group_id=f"g{i}", kind="rating", margin=1.0)
            for i, (a, b) in enumerate(PROBLEMS)]


@pytest.fixture(scope="module")
def demo_base(demo_model_dir: Path) -> Path:
    return demo_model_dir


@pytest.fixture(scope="module")
def likelihood_version(demo_base: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    out = tmp_path_factory.mktemp("rm") / "v1"
    scorer, _ = likelihood_model_fit(base=str(demo_base), train=_pairs(), heldout=[], out=out, max_length=64)
    return out, scorer


def _chat_ids(tokenizer: object, prompt: str, completion: str) -> list[int]:
    """The sequence a user of the exported model builds: the whole exchange through the chat template."""
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
    return list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False))  # type: ignore[attr-defined]


@pytest.mark.slow
def test_an_exported_likelihood_reward_model_scores_as_the_run_did(likelihood_version: tuple[Path, object],
                                                                    tmp_path: Path) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from workers.reward.scorers import reward_model_export

    source, scorer = likelihood_version
    out = reward_model_export(source=str(source), out=str(tmp_path / "export"), scale=0.25, offset=0.5)
    model = AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    assert model.config.calibration == {"scale": 0.25, "offset": 0.5}

    prompts = ["What is 3 + 4?", "What is 6 + 2?", "What is 5 + 5?"]
    completions = ["<answer>7</answer>", "8 maybe", "<answer>11</answer>"]
    expected = scorer.score(prompts, completions)  # type: ignore[attr-defined]
    got = [float(model(input_ids=torch.tensor([_chat_ids(tokenizer, p, c)])).logits[0, 0])
           for p, c in zip(prompts, completions, strict=True)]
    assert got == pytest.approx(expected, abs=1e-4)
    # It learnt what people preferred, and the export keeps the order.
    assert got[0] > got[1]

    # A padded batch with the completion marked gives the same scores.
    rows = [_chat_ids(tokenizer, p, c) for p, c in zip(prompts, completions, strict=True)]
    prompt_lengths = [len(_chat_ids(tokenizer, p, "")) - 1 for p in prompts]  # the empty answer's eos aside
    width = max(map(len, rows))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    marks = torch.tensor([[0] * n + [1] * (len(r) - n) + [0] * (width - len(r)) for r, n in zip(rows, prompt_lengths, strict=True)])
    batch = model(input_ids=ids, attention_mask=mask, completion_mask=marks).logits[:, 0].tolist()
    assert batch == pytest.approx(expected, abs=1e-4)


@pytest.mark.slow
def test_an_input_without_an_assistant_turn_is_refused_naming_completion_mask(likelihood_version: tuple[Path, object],
                                                                             tmp_path: Path) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from workers.reward.scorers import reward_model_export

    out = reward_model_export(source=str(likelihood_version[0]), out=str(tmp_path / "export"), scale=1.0, offset=0.5)
    model = AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=True)
    ids = AutoTokenizer.from_pretrained(out, trust_remote_code=True)("just text", add_special_tokens=False)["input_ids"]
    with pytest.raises(ValueError, match="completion_mask"):
        model(input_ids=torch.tensor([ids]))


@pytest.mark.slow
@pytest.mark.django_db
def test_the_cli_exports_a_runs_reward_model_version(likelihood_version: tuple[Path, object], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from transformers import AutoModelForSequenceClassification

    run = make_run()
    RewardModel.objects.create(run=run, version=1, path=str(likelihood_version[0]), base="demo", scale=0.5, offset=0.4,
                               accuracy=0.9, pairs_heldout=20, accuracy_random=0.8, pairs_random=5)
    call_command("rft", "reward-model", str(run.pk), "--out", str(tmp_path / "rm"))
    said = capsys.readouterr().out
    # Both accuracies, so whoever ships it knows how far the held-out figure is to be trusted.
    assert "reward model v1" in said and "held-out accuracy 0.900 on 20 pairs" in said
    assert "on the random share 0.800 on 5" in said
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm", trust_remote_code=True)
    assert model.config.calibration == {"scale": 0.5, "offset": 0.4}


@pytest.mark.django_db
def test_the_cli_refuses_a_run_without_a_reward_model_and_an_unknown_version(tmp_path: Path) -> None:
    run = make_run()
    with pytest.raises(CommandError, match="no reward model yet"):
        call_command("rft", "reward-model", str(run.pk), "--out", str(tmp_path / "rm"))
    RewardModel.objects.create(run=run, version=1, path=str(tmp_path / "gone"), base="demo")
    with pytest.raises(CommandError, match="no reward model version 7"):
        call_command("rft", "reward-model", str(run.pk), "--version", "7", "--out", str(tmp_path / "rm"))
    with pytest.raises(CommandError, match="not a saved reward model directory"):
        call_command("rft", "reward-model", str(run.pk), "--out", str(tmp_path / "rm"))
    with pytest.raises(CommandError, match="no run 999999"):
        call_command("rft", "reward-model", "999999", "--out", str(tmp_path / "rm"))
    assert not (tmp_path / "rm").exists()


@pytest.mark.slow
@pytest.mark.django_db
def test_a_version_whose_base_is_gone_is_refused_naming_the_base(likelihood_version: tuple[Path, object],
                                                                  tmp_path: Path) -> None:
    import json
    import shutil

    moved = tmp_path / "v1"
    shutil.copytree(likelihood_version[0], moved)
    head = json.loads((moved / "likelihood_reward.json").read_text())
    head["base"] = str(tmp_path / "deleted-checkpoint")
    (moved / "likelihood_reward.json").write_text(json.dumps(head))
    run = make_run()
    RewardModel.objects.create(run=run, version=1, path=str(moved), base="demo")
    with pytest.raises(CommandError, match="deleted-checkpoint cannot be loaded"):
        call_command("rft", "reward-model", str(run.pk), "--out", str(tmp_path / "rm"))
    assert not (tmp_path / "rm").exists()


def test_a_head_version_is_refused_naming_its_kind(tmp_path: Path) -> None:
    """The default kind has no transformers form yet: its export says so instead of failing
    somewhere inside transformers."""
    from kernel.exceptions import ExportFailed
    from workers.reward.scorers import reward_model_export

    version = tmp_path / "v1"
    version.mkdir()
    (version / "head_reward.json").write_text("{}")
    with pytest.raises(ExportFailed, match="'head' reward-model version cannot be exported"):
        reward_model_export(source=str(version), out=str(tmp_path / "out"), scale=1.0, offset=0.5)
