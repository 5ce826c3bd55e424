"""The local demo model: deterministic, cached by its manifest, and warmed up into the
accuracy band RFT needs (clearly above zero, clearly below perfect)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from django.core.management import CommandError, call_command

from workers.models.demo import (
    MANIFEST,
    STYLES,
    DemoResult,
    DemoSettings,
    problems_split,
    completion_text,
    demo_model_build,
    expected_accuracy,
    greedy_accuracy,
    problem_text,
    styled_completion,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

ROOT = Path(__file__).resolve().parents[2]
# Test-sized: the recipe end to end in seconds.
TINY = DemoSettings(steps=8, batch_size=16, hidden_size=32, layers=1, heads=2, vocab_size=320, heldout=20, taskset_size=10)


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory: pytest.TempPathFactory) -> DemoResult:
    """One TINY build for the tests that only read a build (each build is a child process
    that imports torch: 10-25 s on a loaded 2-core host); tests that build on purpose still do."""
    return demo_model_build(out=tmp_path_factory.mktemp("tiny-demo"), settings=TINY, progress=False, log=lambda _: None)


def test_the_same_seed_builds_byte_identical_files_and_another_seed_does_not(tmp_path: Path, tiny_build: DemoResult) -> None:
    a = tiny_build
    b = demo_model_build(out=tmp_path / "b", settings=TINY, progress=False, log=lambda _: None)
    c = demo_model_build(out=tmp_path / "c", settings=DemoSettings(**{**TINY.__dict__, "seed": 1}), progress=False, log=lambda _: None)
    assert a.built and b.built
    assert "model.safetensors" in a.files and "tokenizer.json" in a.files and "demo-taskset.jsonl" in a.files
    assert a.files == b.files
    assert a.files["model.safetensors"] != c.files["model.safetensors"]


def test_builds_from_processes_with_other_thread_settings_give_byte_identical_files(tmp_path: Path) -> None:
    """The build runs in its own pinned process: neither the caller's torch threads nor its
    OMP/MKL environment reach the weights."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        here = demo_model_build(out=tmp_path / "here", settings=TINY, progress=False, log=lambda _: None)
    finally:
        torch.set_num_threads(threads)
    code = (
        "import json, sys; from workers.models.demo import DemoSettings, demo_model_build; "
        "r = demo_model_build(out=sys.argv[1], settings=DemoSettings(**json.loads(sys.argv[2])), progress=False, "
        "log=lambda _: None); print(json.dumps(r.files))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "MKL_CBWR": "AUTO"}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "there"), json.dumps(TINY.__dict__)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == here.files
    for name, digest in here.files.items():
        assert hashlib.sha256((tmp_path / "there" / name).read_bytes()).hexdigest() == digest
    manifest = json.loads((tmp_path / "here" / MANIFEST).read_text())
    assert set(manifest["versions"]) == {"torch", "transformers", "tokenizers"}


@pytest.mark.parametrize("maker", ["demo", "tiny"])
def test_a_saved_model_s_tokenizer_reloads_with_exactly_the_model_s_vocabulary(tmp_path: Path, maker: str,
                                                                              tiny_build: DemoResult) -> None:
    """transformers reloads these tokenizers as Qwen2Tokenizer, which used to append
    `<|endoftext|>` one id past the embeddings: every id the tokenizer knows must embed."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from workers.models.tiny import tiny_model_save

    model_dir = tiny_build.out if maker == "demo" else tiny_model_save(tmp_path, hidden_size=16, layers=1, heads=2)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    assert len(tokenizer) == vocab
    assert max(tokenizer.get_vocab().values()) == vocab - 1
    assert max(tokenizer("<|endoftext|> What is 1 + 2?", add_special_tokens=False)["input_ids"]) < vocab
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[len(tokenizer) - 1, 0]])).logits
    assert logits.shape[-1] == len(tokenizer)


def test_a_second_build_with_the_same_settings_is_skipped_and_other_settings_rebuild(tmp_path: Path,
                                                                                    tiny_build: DemoResult) -> None:
    shutil.copytree(tiny_build.out, tmp_path, dirs_exist_ok=True)  # a finished build of TINY, moved here
    first = tiny_build
    started = time.monotonic()
    again = demo_model_build(out=tmp_path, settings=TINY, progress=False, log=lambda _: None)
    assert not again.built and again.files == first.files and time.monotonic() - started < 1.0
    (tmp_path / "model.safetensors").unlink()
    assert demo_model_build(out=tmp_path, settings=TINY, progress=False, log=lambda _: None).built
    other = DemoSettings(**{**TINY.__dict__, "steps": 9})
    assert demo_model_build(out=tmp_path, settings=other, progress=False, log=lambda _: None).built
    assert json.loads((tmp_path / MANIFEST).read_text())["settings"]["steps"] == 9


def test_the_demo_taskset_holds_math_tasks_with_answers_the_model_never_trained_on(tiny_build: DemoResult) -> None:
    records = [json.loads(line) for line in (tiny_build.out / "demo-taskset.jsonl").read_text().splitlines()]
    assert len(records) == TINY.taskset_size
    train, heldout, taskset = problems_split(TINY)
    assert not set(train) & set(taskset) and not set(heldout) & set(taskset)
    for record in records:
        assert record["domain"] == "math"
        a, op, b = record["prompt"].removeprefix("What is ").removesuffix("?").split(" ")
        assert int(record["answer"]) == (int(a) + int(b) if op == "+" else int(a) - int(b))


@pytest.mark.django_db
def test_the_demo_taskset_imports_as_a_taskset(tmp_path: Path, tiny_build: DemoResult) -> None:
    from apps.buffer.importers import ImportFailed
    from apps.control.demo import demo_taskset_import

    with pytest.raises(ImportFailed, match="rft_demo_model"):
        demo_taskset_import(model_dir=tmp_path)
    taskset = demo_taskset_import(model_dir=tiny_build.out)
    assert taskset.tasks.count() == TINY.taskset_size
    assert set(taskset.tasks.values_list("domain", flat=True)) == {"math"}


def test_the_command_module_loads_without_torch() -> None:
    code = (
        "import django, sys; django.setup(); "
        "import apps.cli.management.commands.rft_demo_model as m; "
        "assert 'torch' not in sys.modules, 'torch imported'; print('ok')"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "rftweb.settings", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_the_command_rejects_bad_arguments_with_a_message(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(CommandError, match="not a directory"):
        call_command("rft_demo_model", out=str(tmp_path / "file"))
    with pytest.raises(CommandError, match="--steps must be at least 1"):
        call_command("rft_demo_model", out=str(tmp_path / "m"), steps=0)


@pytest.mark.slow
def test_the_real_demo_model_answers_some_but_not_most_held_out_problems(demo_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The default `rft_demo_model` build (the session's model) lands in the band, measured
    again here from the saved files."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    call_command("rft_demo_model", out=str(demo_model_dir), quiet=True)
    assert "up to date" in capsys.readouterr().out
    manifest = json.loads((demo_model_dir / MANIFEST).read_text())
    assert manifest["settings"] == DemoSettings().__dict__
    assert 1_000_000 <= manifest["parameters"] <= 20_000_000
    tokenizer = AutoTokenizer.from_pretrained(demo_model_dir)
    model = AutoModelForCausalLM.from_pretrained(demo_model_dir, dtype=torch.float32)
    accuracy = greedy_accuracy(model=model, tokenizer=tokenizer, problems=problems_split(DemoSettings())[1])
    assert accuracy == pytest.approx(manifest["accuracy"], abs=0.011)
    assert 0.10 <= accuracy <= 0.60


@pytest.mark.parametrize("style", STYLES)
def test_the_demo_run_s_reward_scores_every_warm_up_style_as_the_bare_answer(style: str) -> None:
    """The styles are for people to prefer, not for the reward: the demo run's terms, the math
    domain's defaults and a strict format term grade the `<answer>` alone, the styled forms
    exactly as the plain one (right or wrong)."""
    from apps.rewards.scoring import rewards_inline
    from kernel.config import config_validate

    problem = (12, "+", 34)
    task = {"domain": "math", "prompt": problem_text(*problem), "reference": "46"}
    wrong = (12, "+", 35)
    for rewards in ([], [{"name": "math_accuracy"}, {"name": "math_format", "weight": 0.1}],
                    [{"name": "math_accuracy"}, {"name": "math_format", "params": {"strict": True}}]):
        terms = list(config_validate(data={"model": "m", "rewards": rewards}).rewards)
        styled = rewards_inline(terms=terms, completion=styled_completion(problem, style), task=task)
        plain = rewards_inline(terms=terms, completion=styled_completion(problem, "plain"), task=task)
        assert styled.parts == plain.parts and styled.score == plain.score
        # A wrong sum in the style scores as a wrong bare answer, below the right one.
        styled_wrong = rewards_inline(terms=terms, completion=styled_completion(wrong, style), task=task)
        assert styled_wrong == rewards_inline(terms=terms, completion=completion_text(47), task=task)
        assert styled_wrong.parts["math_accuracy"] == 0.0 and styled_wrong.score < plain.score


@pytest.mark.slow
def test_the_real_demo_model_samples_each_style_some_of_the_time(demo_model_dir: Path) -> None:
    """The warm-up shows the bare answer and each style a quarter of the time, so the model
    writes each some of the time (what the style raters of bench/steering prefer has something
    to amplify) and none most of the time. 200 held-out problems, one completion each, seeded."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench.raters import Rating, concise, correct, in_words, working

    tokenizer = AutoTokenizer.from_pretrained(demo_model_dir)
    model = AutoModelForCausalLM.from_pretrained(demo_model_dir, dtype=torch.float32).eval()
    problems = problems_split(DemoSettings())[1]
    texts = [(problem_text(*p), text) for p, text in _sampled(model, tokenizer, problems, n=1)]

    def share(rate: Rating, at_least: int) -> float:
        return sum(rate(prompt, text) >= at_least for prompt, text in texts) / len(texts)

    assert 0.1 <= share(concise, 5) <= 0.5, "the bare answer some of the time, not most"
    assert 0.1 <= share(working, 5) <= 0.5, "the working shown first, some of the time"
    assert 0.05 <= share(in_words, 5) <= 0.5, "the number in words, some of the time"
    assert share(correct, 5) >= 0.12, "and the arithmetic still right some of the time"


@pytest.mark.slow
def test_the_expected_accuracy_counts_a_right_answer_in_every_form_the_warm_up_writes(demo_model_dir: Path) -> None:
    """The demo model writes each form a quarter of the time, so the bare form's probability
    alone misses most right answers: the expected accuracy adds the four forms' (distinct
    sequences), and stays a lower bound of the share of sampled answers that are right,
    close to it (what the model writes beyond the four forms is little)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench.raters import correct

    tokenizer = AutoTokenizer.from_pretrained(demo_model_dir)
    model = AutoModelForCausalLM.from_pretrained(demo_model_dir, dtype=torch.float32).eval()
    problems = problems_split(DemoSettings())[1]
    each = {style: expected_accuracy(model=model, tokenizer=tokenizer, problems=problems, styles=(style,))
            for style in STYLES}
    every = expected_accuracy(model=model, tokenizer=tokenizer, problems=problems)
    assert every == pytest.approx(sum(each.values()), abs=1e-6)
    assert every >= 2 * each["plain"], each

    right = sum(correct(problem_text(*problem), text) == 5 for problem, text in _sampled(model, tokenizer, problems, n=4))
    sampled = right / (4 * len(problems))
    # 800 samples: a standard error of ~0.015 on the sampled share.
    assert sampled - 0.1 <= every <= sampled + 0.03, (every, sampled)


def _sampled(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, problems: list[tuple[int, str, int]], *,
             n: int) -> list[tuple[tuple[int, str, int], str]]:
    """`n` completions of each problem (temperature 1, up to 32 tokens, seeded), with their problem."""
    import torch

    from workers.models.demo import problem_encode

    prompts = [problem_encode(tokenizer, p)[0] for p in problems]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(input_ids=ids.repeat_interleave(n, 0), attention_mask=mask.repeat_interleave(n, 0),
                             max_new_tokens=32, do_sample=True, top_k=0, top_p=1.0)
    return [(problems[i // n], tokenizer.decode(row, skip_special_tokens=True))
            for i, row in enumerate(out[:, width:].tolist())]
