"""Build small causal LMs and tokenizers locally and deterministically (no model hub).

Used by the demo model, by tests and by benches. Same arguments, same files: the tokenizer
is trained on the given texts in order and the weights come from a seeded generator.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

# Qwen2-shaped: a turn is `<|role|>content<|end|>`, except that an assistant turn ends with
# the end-of-sequence token, as a sampled one does (so a multi-turn prompt extends the tokens
# the model saw and sampled exactly; Qwen's <|im_end|> is likewise its eos). Tools are
# offered Hermes-style in a system turn and called as `<tool_call>{"name", "arguments"}</tool_call>`;
# a tool's answer is a `<|tool|>` turn. Without tools or tool calls this renders what the
# first template (round 1) did for system and user turns.
CHAT_TEMPLATE = (
    "{% if tools %}<|system|>You may call these tools; to call one, answer "
    '<tool_call>{"name": NAME, "arguments": {...}}</tool_call>.<tools>'
    "{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools><|end|>{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] if m['content'] is string else '' }}"
    "{% if m['tool_calls'] %}{% for tc in m['tool_calls'] %}{% set f = tc['function'] if tc['function'] is defined else tc %}"
    '<tool_call>{"name": {{ f[\'name\'] | tojson }}, "arguments": {{ f[\'arguments\'] | tojson }}}</tool_call>'
    "{% endfor %}{% endif %}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% else %}<|end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# `<|endoftext|>` is in the vocabulary although nothing uses it: a saved Qwen2 model's
# tokenizer reloads as transformers' Qwen2Tokenizer, which adds it as its unknown token when
# missing, one id past the model's embeddings (len(tokenizer) == vocab_size + 1).
SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|endoftext|>"]


def tokenizer_build(*, texts: Iterable[str], vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on `texts`, wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", padding_side="left"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def causal_lm_build(
    *,
    tokenizer: PreTrainedTokenizerBase,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int | None = None,
    intermediate_size: int | None = None,
    max_positions: int = 512,
    seed: int = 0,
    tied: bool = False,
) -> PreTrainedModel:
    """A randomly initialised Qwen2 causal LM sized for the CPU, float32 (`tied`: its output
    head is its input embeddings)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or hidden_size * 4,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tied,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


def tiny_model_save(out_dir: str | Path, *, texts: Iterable[str] | None = None, seed: int = 0, tied: bool = False,
                    **sizes: int) -> Path:
    """Build and save a tiny random model with its tokenizer; returns the directory."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    corpus = list(texts) if texts is not None else [
        f"What is {a} + {b}? <answer>{a + b}</answer>" for a in range(20) for b in range(20)
    ]
    tokenizer = tokenizer_build(texts=corpus, vocab_size=sizes.pop("vocab_size", 300))
    model = causal_lm_build(tokenizer=tokenizer, seed=seed, tied=tied, **sizes)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
