"""The rollout engines: one interface, the same answers, logprobs a forward pass agrees with,
and weights that change in a running engine."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from workers.engines import RolloutEngine, Sample, SamplingSpec, prompt_ids

GREEDY = SamplingSpec(temperature=0.0, max_tokens=12)
PROBLEMS = [f"What is {a} {op} {b}?" for a, op, b in [(12, "+", 7), (45, "-", 3), (99, "+", 9), (3, "-", 8), (60, "+", 0), (27, "-", 9)]]


def _prompts(engine: Any) -> list[list[int]]:
    return [prompt_ids(engine.tokenizer, text=p) for p in PROBLEMS]


def forward_logprobs(model_dir: Path, prompt: list[int], response: list[int]) -> list[float]:
    """Logprobs of `response` after `prompt` from one plain transformers forward pass."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(response)[:, None])[:, 0].tolist()


def assert_well_formed(result: list[list[Sample]], *, prompts: int, n: int, max_tokens: int) -> None:
    assert len(result) == prompts
    for group in result:
        assert len(group) == n
        for sample in group:
            assert isinstance(sample, Sample)
            assert 1 <= len(sample.token_ids) <= max_tokens
            assert len(sample.logprobs) == len(sample.token_ids)
            assert all(isinstance(t, int) for t in sample.token_ids)
            assert all(lp <= 0.0 for lp in sample.logprobs)
            assert sample.finish_reason in ("stop", "length")
            assert isinstance(sample.text, str)


def test_prompt_ids_render_text_as_one_user_turn_of_the_chat_template(hf_engine: Any) -> None:
    tok = hf_engine.tokenizer
    as_text = prompt_ids(tok, text="What is 1 + 1?")
    as_messages = prompt_ids(tok, messages=[{"role": "user", "content": "What is 1 + 1?"}])
    assert as_text == as_messages
    assert tok.decode(as_text).startswith("<|user|>What is 1 + 1?") and tok.decode(as_text).endswith("<|assistant|>")
    with pytest.raises(ValueError, match="exactly one"):
        prompt_ids(tok, text="a", messages=[{"role": "user", "content": "b"}])


def test_sampling_overrides_name_unknown_parameters() -> None:
    spec = SamplingSpec(temperature=0.7)
    assert spec.with_overrides({"max_tokens": 5}).max_tokens == 5
    with pytest.raises(ValueError, match="bogus"):
        spec.with_overrides({"bogus": 1})
    with pytest.raises(ValueError, match="temperature"):
        spec.with_overrides({"temperature": -1.0})


def test_a_vanishing_temperature_samples_as_greedy_instead_of_failing(hf_engine: Any) -> None:
    """temperature=1e-300 divided the logits into inf and the sampler raised on NaN
    probabilities (a 502 from the OpenAI endpoint); under vLLM's threshold it is greedy."""
    assert SamplingSpec(temperature=1e-300).greedy and SamplingSpec(temperature=9e-6).greedy
    assert not SamplingSpec(temperature=1e-4).greedy
    prompts = _prompts(hf_engine)[:2]
    tiny = hf_engine.generate(prompts, n=2, sampling=SamplingSpec(temperature=1e-300, max_tokens=6, seed=1))
    greedy = hf_engine.generate(prompts, n=2, sampling=SamplingSpec(temperature=0.0, max_tokens=6))
    assert [[s.token_ids for s in g] for g in tiny] == [[s.token_ids for s in g] for g in greedy]


def test_the_transformers_engine_returns_n_samples_per_prompt_with_one_logprob_per_token(hf_engine: Any) -> None:
    assert isinstance(hf_engine, RolloutEngine)
    sampling = SamplingSpec(temperature=1.0, max_tokens=6, seed=3)
    result = hf_engine.generate(_prompts(hf_engine)[:3], n=4, sampling=sampling)
    assert_well_formed(result, prompts=3, n=4, max_tokens=6)
    # max_tokens=6 is too short for "<answer>NN</answer>": some samples must have been cut.
    assert any(s.finish_reason == "length" for group in result for s in group)


def test_a_grpo_step_of_16_prompts_times_8_samples_is_one_generate_call(hf_engine: Any) -> None:
    """The default rows per call hold a step of bench/learning (16 × 8): each extra call pays
    generate's per-token Python overhead again (stock TRL generates the step in one call)."""
    calls: list[int] = []
    model = hf_engine.model
    original = model.generate

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(int(kwargs["input_ids"].shape[0]) * int(kwargs.get("num_return_sequences", 1)))
        return original(*args, **kwargs)

    prompts = (_prompts(hf_engine) * 3)[:16]
    model.generate = counting
    try:
        result = hf_engine.generate(prompts, n=8, sampling=SamplingSpec(temperature=1.0, max_tokens=4, seed=0))
    finally:
        del model.generate
    assert calls == [128]
    assert_well_formed(result, prompts=16, n=8, max_tokens=4)


def _assert_logprobs_match_a_forward_pass(engine: Any, model_dir: Path, *, prompts: int, sampling: SamplingSpec) -> None:
    """Every sampled token's logprob is the one a transformers forward pass gives it."""
    chosen = _prompts(engine)[:prompts]
    for prompt, group in zip(chosen, engine.generate(chosen, n=2, sampling=sampling)):
        for sample in group:
            expected = forward_logprobs(model_dir, prompt, sample.token_ids)
            assert sample.logprobs == pytest.approx(expected, abs=1e-4)


def test_the_transformers_engine_logprobs_match_a_forward_pass(hf_engine: Any, demo_model_dir: Path) -> None:
    _assert_logprobs_match_a_forward_pass(hf_engine, demo_model_dir, prompts=2,
                                          sampling=SamplingSpec(temperature=1.0, max_tokens=10, seed=0))


@pytest.mark.vllm
def test_both_engines_return_the_same_structure(hf_engine: Any, vllm_engine: Any) -> None:
    sampling = SamplingSpec(temperature=1.0, max_tokens=8, seed=1)
    for engine in (hf_engine, vllm_engine):
        assert isinstance(engine, RolloutEngine)
        assert_well_formed(engine.generate(_prompts(engine), n=3, sampling=sampling), prompts=len(PROBLEMS), n=3, max_tokens=8)
    # Greedy with n > 1 (which vLLM refuses natively) gives n copies of one answer.
    for engine in (hf_engine, vllm_engine):
        group = engine.generate(_prompts(engine)[:1], n=2, sampling=GREEDY)[0]
        assert group[0] == group[1]


@pytest.mark.vllm
def test_greedy_outputs_of_vllm_and_transformers_agree(hf_engine: Any, vllm_engine: Any) -> None:
    prompts = _prompts(hf_engine)
    # Room for the demo model's longest style (the working first, ~25 tokens) to reach its tag.
    greedy = SamplingSpec(temperature=0.0, max_tokens=32)
    from_vllm = vllm_engine.generate(prompts, n=1, sampling=greedy)
    from_hf = hf_engine.generate(prompts, n=1, sampling=greedy)
    for a, b in zip(from_vllm, from_hf):
        assert a[0].token_ids == b[0].token_ids
        assert a[0].text == b[0].text
        assert a[0].finish_reason == b[0].finish_reason
        assert a[0].logprobs == pytest.approx(b[0].logprobs, abs=1e-4)
    # The warmed-up model answers in tags: the comparison is about real answers, not noise.
    assert sum("<answer>" in g[0].text for g in from_vllm) >= len(prompts) // 2


def _assert_top_logprobs(samples: list[list[Sample]], k: int) -> None:
    for group in samples:
        for sample in group:
            assert sample.top_logprobs is not None and len(sample.top_logprobs) == len(sample.token_ids)
            for step, token, lp in zip(sample.top_logprobs, sample.token_ids, sample.logprobs):
                assert len(step) == k and [x[1] for x in step] == sorted((x[1] for x in step), reverse=True)
                # Greedy: the sampled token is the likeliest one, with its own logprob.
                assert step[0][0] == token and step[0][1] == pytest.approx(lp, abs=1e-5)


def test_the_transformers_engine_reports_the_top_logprobs_asked_for(hf_engine: Any) -> None:
    sampling = SamplingSpec(temperature=0.0, max_tokens=6, logprobs=3)
    _assert_top_logprobs(hf_engine.generate(_prompts(hf_engine)[:2], n=1, sampling=sampling), 3)
    assert hf_engine.generate(_prompts(hf_engine)[:1], n=1, sampling=GREEDY)[0][0].top_logprobs is None


@pytest.mark.vllm
def test_vllm_reports_the_same_top_logprobs_as_transformers(hf_engine: Any, vllm_engine: Any) -> None:
    sampling = SamplingSpec(temperature=0.0, max_tokens=6, logprobs=3)
    from_vllm = vllm_engine.generate(_prompts(vllm_engine)[:2], n=1, sampling=sampling)
    from_hf = hf_engine.generate(_prompts(hf_engine)[:2], n=1, sampling=sampling)
    _assert_top_logprobs(from_vllm, 3)
    for a, b in zip(from_vllm, from_hf):
        for sa, sb in zip(a[0].top_logprobs or [], b[0].top_logprobs or []):
            assert [t for t, _ in sa] == [t for t, _ in sb]
            assert [lp for _, lp in sa] == pytest.approx([lp for _, lp in sb], abs=1e-4)


@pytest.mark.vllm
def test_vllm_logprobs_match_a_transformers_forward_pass(vllm_engine: Any, demo_model_dir: Path) -> None:
    _assert_logprobs_match_a_forward_pass(vllm_engine, demo_model_dir, prompts=3,
                                          sampling=SamplingSpec(temperature=1.0, max_tokens=12, seed=7))


@pytest.mark.vllm
def test_vllm_hands_over_each_steps_tokens_and_ends_with_the_same_samples(vllm_engine: Any) -> None:
    """`generate(on_tokens=…)` (what `stream: true` uses): a call per engine step while the
    generation goes on, the rows' tokens in order, and the same samples as without it."""
    prompts = _prompts(vllm_engine)[:1]
    spec = SamplingSpec(temperature=1.0, max_tokens=12, seed=7)
    steps: list[list[int | None]] = []
    streamed = vllm_engine.generate(prompts, n=2, sampling=spec, on_tokens=steps.append)
    whole = vllm_engine.generate(prompts, n=2, sampling=spec)
    assert [[(s.token_ids, s.logprobs, s.text, s.finish_reason) for s in g] for g in streamed] == \
        [[(s.token_ids, s.logprobs, s.text, s.finish_reason) for s in g] for g in whole]
    assert all(len(step) == 2 for step in steps)
    for row, sample in enumerate(streamed[0]):
        assert [step[row] for step in steps if step[row] is not None] == sample.token_ids
    # Token by token, not once at the end.
    assert len(steps) >= max(len(s.token_ids) for s in streamed[0]) >= 2
    # The engine is left clean for the next request.
    assert not vllm_engine.llm.llm_engine.has_unfinished_requests()


def perturbed_copy(src: Path, dst: Path, *, scale: float = 0.3, seed: int = 1) -> Path:
    """A same-architecture checkpoint whose weights differ (what a training step publishes)."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(src / "model.safetensors")
    gen = torch.Generator().manual_seed(seed)
    changed = {k: v + scale * torch.randn(v.shape, generator=gen) * v.std().clamp_min(1e-3) if v.ndim == 2 else v for k, v in tensors.items()}
    save_file(changed, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def changed_checkpoint(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return perturbed_copy(demo_model_dir, tmp_path_factory.mktemp("v1") / "v1")


def _reload_round_trip(engine: Any, original: Path, changed: Path) -> None:
    prompts = _prompts(engine)
    before = engine.generate(prompts, n=1, sampling=GREEDY)
    try:
        engine.load(version=1, path=str(changed))
        assert engine.version == 1
        after = engine.generate(prompts, n=1, sampling=GREEDY)
        assert [g[0].logprobs for g in after] != [g[0].logprobs for g in before]
        assert [g[0].token_ids for g in after] != [g[0].token_ids for g in before]
    finally:
        engine.load(version=0, path=str(original))
    assert engine.version == 0
    restored = engine.generate(prompts, n=1, sampling=GREEDY)
    assert [g[0].token_ids for g in restored] == [g[0].token_ids for g in before]
    for a, b in zip(restored, before):
        assert a[0].logprobs == pytest.approx(b[0].logprobs, abs=1e-5)


def test_the_transformers_engine_loads_changed_weights_and_back(hf_engine: Any, demo_model_dir: Path, changed_checkpoint: Path) -> None:
    _reload_round_trip(hf_engine, demo_model_dir, changed_checkpoint)


@pytest.mark.vllm
def test_vllm_reloads_changed_weights_in_place_and_back(vllm_engine: Any, demo_model_dir: Path, changed_checkpoint: Path) -> None:
    llm = vllm_engine.llm
    _reload_round_trip(vllm_engine, demo_model_dir, changed_checkpoint)
    assert vllm_engine.llm is llm  # the same running engine, not a restart


@pytest.mark.gpu
@pytest.mark.vllm
def test_on_cuda_vllm_in_bfloat16_greedily_agrees_with_transformers_on_most_prompts(demo_model_dir: Path) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: the vLLM engine's GPU path (bfloat16, gpu_memory_utilization)")
    from workers.engines.hf_engine import HFEngine
    from workers.engines.vllm_engine import VLLMEngine

    vllm_gpu = VLLMEngine(path=str(demo_model_dir), gpu_memory_utilization=0.2)
    hf_gpu = HFEngine(path=str(demo_model_dir))
    a = vllm_gpu.generate(_prompts(vllm_gpu), n=1, sampling=GREEDY)
    b = hf_gpu.generate(_prompts(hf_gpu), n=1, sampling=GREEDY)
    # bfloat16 on both sides: near-ties may break differently, so most, not all.
    assert sum(x[0].token_ids == y[0].token_ids for x, y in zip(a, b)) >= len(PROBLEMS) - 1
