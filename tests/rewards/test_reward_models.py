"""The reward-model scorer and the LLM judge on tiny models built here (no hub)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from workers.models.tiny import causal_lm_build, tokenizer_build
from workers.reward.scorers import (
    judge_engine,
    judge_prompt,
    judge_score_parse,
    llm_judge_scores,
    reward_model_load,
    reward_model_scores,
)

CORPUS = [f"What is {a} + {b}? <answer>{a + b}</answer> Score: {a % 10}" for a in range(20) for b in range(20)]
TASKS = [{"domain": "math", "prompt": "What is 12 + 7?", "reference": "19"}] * 3
COMPLETIONS = ["<answer>19</answer>", "I think it is <answer>18</answer> maybe", "x"]


def _classifier(out: Path, num_labels: int) -> Path:
    from transformers import AutoModelForSequenceClassification, Qwen2Config

    tokenizer = tokenizer_build(texts=CORPUS, vocab_size=300)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, num_labels=num_labels,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def scalar_rm(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(_classifier(tmp_path_factory.mktemp("rm1"), 1))


@pytest.fixture(scope="session")
def binary_rm(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(_classifier(tmp_path_factory.mktemp("rm2"), 2))


def test_a_reward_model_scores_each_completion_as_a_forward_pass_would(scalar_rm: str) -> None:
    scores = reward_model_scores(COMPLETIONS, TASKS, model=scalar_rm, batch_size=3)
    net, tokenizer = reward_model_load(scalar_rm)
    for completion, task, score in zip(COMPLETIONS, TASKS, scores, strict=True):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": task["prompt"]}, {"role": "assistant", "content": completion}], tokenize=False
        )
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        with torch.inference_mode():
            alone = net(**ids).logits[0, 0].item()
        # Padded in a batch of three, each row scores what it scores on its own.
        assert score == pytest.approx(alone, abs=1e-4)
    assert len(set(round(s, 6) for s in scores)) == 3


def test_a_reward_model_is_loaded_once_per_process(scalar_rm: str) -> None:
    reward_model_scores(COMPLETIONS[:1], TASKS[:1], model=scalar_rm)
    before = reward_model_load.cache_info()
    reward_model_scores(COMPLETIONS[1:], TASKS[1:], model=scalar_rm)
    after = reward_model_load.cache_info()
    assert after.misses == before.misses and after.hits == before.hits + 1


def test_a_classifier_reward_is_the_probability_of_the_chosen_label(binary_rm: str) -> None:
    last = reward_model_scores(COMPLETIONS, TASKS, model=binary_rm)
    first = reward_model_scores(COMPLETIONS, TASKS, model=binary_rm, label=0)
    for p1, p0 in zip(last, first, strict=True):
        assert 0.0 < p1 < 1.0 and p0 + p1 == pytest.approx(1.0, abs=1e-5)


def test_a_missing_reward_model_raises_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        reward_model_scores(COMPLETIONS[:1], TASKS[:1], model=str(tmp_path / "nowhere"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Score: 7", 0.7),
        ("**Score**: 9", 0.9),
        ("score=7.5", 0.75),
        ("Rating: 10\nThe response is right; 1 2 3", 1.0),
        ("I would give it 8/10.", 0.8),
        ("4 out of 5", 0.8),
        ("6", 0.6),
        ("Score: 15", 1.0),
        ("Score: -3", 0.0),
        ("The answer 3.5 is wrong", 0.35),
        ("no idea", None),
        ("", None),
        ("v2", None),
    ],
)
def test_the_judge_score_is_read_robustly_from_text(text: str, expected: float | None) -> None:
    got = judge_score_parse(text, scale=10)
    assert got == (None if expected is None else pytest.approx(expected))


def test_the_judge_prompt_keeps_untrusted_text_as_text() -> None:
    prompt = judge_prompt(template="Q: {prompt} A: {completion} /{scale}", completion="{prompt} {x}", task=TASKS[0],
                          scale=5)
    assert prompt == "Q: What is 12 + 7? A: {prompt} {x} /5"


@pytest.fixture(scope="session")
def judge_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny causal LM taught to answer every judge prompt with 'Score: 7'."""
    out = tmp_path_factory.mktemp("judge")
    tokenizer = tokenizer_build(texts=CORPUS, vocab_size=300)
    model = causal_lm_build(tokenizer=tokenizer, hidden_size=32, layers=1, heads=2, seed=0)
    prompts = [judge_prompt(template="Rate {completion} from 0 to {scale}.", completion=c, task=TASKS[0], scale=10)
               for c in ["<answer>19</answer>", "<answer>3</answer>", "blah", "12 + 7 = 19"]]
    from workers.reward.scorers import DEFAULT_TEMPLATE

    prompts += [judge_prompt(template=DEFAULT_TEMPLATE, completion=c, task=TASKS[0], scale=10) for c in COMPLETIONS]
    rows = []
    for p in prompts:
        head = tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        prompt_ids = tokenizer(head, add_special_tokens=False)["input_ids"]
        target = tokenizer("Score: 7", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((prompt_ids, target))
    optim = torch.optim.Adam(model.parameters(), lr=3e-3)
    torch.manual_seed(0)
    model.train()
    for _ in range(150):
        for prompt_ids, target in rows:
            ids = torch.tensor([prompt_ids + target])
            labels = torch.tensor([[-100] * len(prompt_ids) + target])
            loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
        optim.step()
        optim.zero_grad()
    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


@pytest.mark.slow
def test_the_llm_judge_reads_the_score_the_judge_model_gives(judge_model: str) -> None:
    scores = llm_judge_scores(COMPLETIONS, TASKS, model=judge_model, engine="transformers", max_tokens=8)
    assert scores == [pytest.approx(0.7)] * 3
    engine, tokenizer = judge_engine(judge_model, "transformers")
    prompt = judge_prompt(template="Rate {completion} from 0 to {scale}.", completion="blah", task=TASKS[0], scale=10)
    head = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    from workers.engines.base import SamplingSpec

    [[sample]] = engine.generate([tokenizer(head, add_special_tokens=False)["input_ids"]], n=1,
                                 sampling=SamplingSpec(temperature=0.0, max_tokens=8))
    assert sample.text.strip() == "Score: 7" and sample.finish_reason == "stop"


def _vllm_judge_scores(judge_model: str) -> tuple[list[float], Any]:
    from workers import engines

    judge_engine.cache_clear()
    engines.engine_cache_clear()
    scores = llm_judge_scores(COMPLETIONS, TASKS, model=judge_model, engine="vllm", max_tokens=8)
    engine, _ = judge_engine(judge_model, "vllm")
    return scores, engine


@pytest.mark.slow
def test_the_vllm_judge_without_vllm_judges_through_the_workers_rollout_engine(
    judge_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A reward worker where vLLM cannot be imported: engine_for falls back to the rollout
    # engines' transformers engine, through the same call the vLLM path makes.
    from workers import engines

    monkeypatch.setattr(engines, "vllm_available", lambda: False)
    scores, engine = _vllm_judge_scores(judge_model)
    assert scores == [pytest.approx(0.7)] * 3
    assert engine is engines.engine_for(engines.EngineWanted(engine="transformers", model=judge_model))
    engines.engine_cache_clear()


@pytest.mark.slow
def test_a_judge_on_another_scale_is_normalised(judge_model: str) -> None:
    assert llm_judge_scores(COMPLETIONS[:1], TASKS[:1], model=judge_model, scale=14, max_tokens=8) == [pytest.approx(0.5)]


@pytest.mark.gpu
def test_a_reward_model_on_cuda_scores_as_on_the_cpu(scalar_rm: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the reward model's GPU path runs only on a GPU host")
    reward_model_load.cache_clear()
    gpu = reward_model_scores(COMPLETIONS, TASKS, model=scalar_rm)
    net, _ = reward_model_load(scalar_rm)
    assert net.device.type == "cuda"
    net.to("cpu")  # the cached model now scores on the CPU
    try:
        cpu = reward_model_scores(COMPLETIONS, TASKS, model=scalar_rm)
    finally:
        reward_model_load.cache_clear()
    assert gpu == pytest.approx(cpu, abs=1e-3)
