"""A tiny model taught, in a few seconds of supervised steps, to use a calculator tool:
asked a sum, it answers `<tool_call>{"name": "calc", ...}</tool_call>`; shown the tool's
result, it answers `<answer>N</answer>`. Greedy decoding reproduces both, so tests can drive
a real multi-turn, tool-calling conversation through the real endpoint and worker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from examples.calculator_agent import CALC_TOOL as EXAMPLE_TOOL

# The example agent's own tool, so the model knows the prompt the agent sends.
CALC_TOOL = EXAMPLE_TOOL
QUESTIONS = [(2, 3), (4, 1), (7, 5)]


def question(a: int, b: int) -> str:
    return f"What is {a} + {b}?"


def call_text(a: int, b: int) -> str:
    return '<tool_call>{"name": "calc", "arguments": {"expression": "%d+%d"}}</tool_call>' % (a, b)


def conversation(a: int, b: int) -> list[dict[str, Any]]:
    """The three turns: the question, the model's call with the tool's answer, the model's answer."""
    return [
        {"role": "user", "content": question(a, b)},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "calc", "arguments": json.dumps({"expression": f"{a}+{b}"})}}]},
        {"role": "tool", "tool_call_id": "c", "content": str(a + b)},
    ]


def tool_model_save(out: Path, *, steps: int = 60, seed: int = 0) -> Path:
    import torch

    from workers.explore.chat import messages_for_template
    from workers.models.tiny import causal_lm_build, tokenizer_build

    torch.manual_seed(seed)
    corpus = [call_text(a, b) + f"<answer>{a + b}</answer>" + question(a, b) + json.dumps(CALC_TOOL) for a, b in QUESTIONS]
    fresh = tokenizer_build(texts=corpus * 4, vocab_size=400)
    model = causal_lm_build(tokenizer=fresh, hidden_size=64, layers=2, heads=4, max_positions=1024, seed=seed)
    # Trained with the tokenizer as everyone loads it: next to a Qwen2 config, AutoTokenizer
    # picks Qwen2's class, whose pre-tokenizer differs from the freshly trained one's.
    out.mkdir(parents=True, exist_ok=True)
    fresh.save_pretrained(out)
    model.config.save_pretrained(out)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)
    examples: list[tuple[list[int], list[int]]] = []
    for a, b in QUESTIONS:
        # As the endpoint renders them (a tool call's arguments parsed from their JSON string).
        turns = messages_for_template(conversation(a, b))
        first = tokenizer.apply_chat_template(turns[:1], tools=[CALC_TOOL], add_generation_prompt=True, tokenize=False)
        second = tokenizer.apply_chat_template(turns, tools=[CALC_TOOL], add_generation_prompt=True, tokenize=False)
        for prompt, answer in ((first, call_text(a, b)), (second, f"<answer>{a + b}</answer>")):
            p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            c = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            examples.append((p, c))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    model.train()
    for _ in range(steps):
        for p, c in examples:
            ids = torch.tensor([p + c])
            labels = torch.tensor([[-100] * len(p) + c])
            model(input_ids=ids, labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    return out
