"""Pictures on the worker side: prompts that carry images, for both engines and the trainer.

A vision-language model's processor expands each image placeholder of the chat template
(`<image>`) into the image's tokens. The two engines take the prompt differently:
transformers wants the expanded ids with the pixel tensors, vLLM wants the ids with one
placeholder per image and the pictures themselves (it expands them; handing it expanded ids
makes it expand again). `ImagePrompt` carries both, and the expanded ids are what the
experience stores: the tokens the model saw, which the trainer feeds back with the same
pictures (`pixel_inputs`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from PIL.Image import Image
    from transformers import ProcessorMixin


@dataclass(frozen=True)
class ImagePrompt:
    token_ids: list[int]
    expanded_ids: list[int]
    images: tuple[Image, ...]
    digests: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.expanded_ids)

    def __iter__(self) -> Iterator[int]:
        # Read as a sequence of ids it is the prompt the model sees (what is stored).
        return iter(self.expanded_ids)


def stored_ids(prompt: Sequence[int] | ImagePrompt) -> list[int]:
    """The prompt's token ids as the model saw them (expanded for an ImagePrompt)."""
    return list(prompt.expanded_ids) if isinstance(prompt, ImagePrompt) else list(prompt)


@functools.lru_cache(maxsize=8)
def is_vision_model(path: str) -> bool:
    """Whether the model directory (or a version's checkpoint) holds an image-text model."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError):
        return False
    return getattr(config, "vision_config", None) is not None


def processor_load(path: str) -> ProcessorMixin:
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(path)
    processor.tokenizer.padding_side = "left"
    return processor


def _with_images(messages: Sequence[Mapping[str, Any]], count: int) -> list[dict[str, Any]]:
    """The chat with the pictures put before the text of the last user turn."""
    chat = [dict(m) for m in messages]
    last = max((i for i, m in enumerate(chat) if m.get("role") == "user"), default=len(chat) - 1)
    content = chat[last].get("content")
    parts = list(content) if isinstance(content, list) else [{"type": "text", "text": str(content or "")}]
    chat[last]["content"] = [{"type": "image"}] * count + parts
    return chat


def vision_prompt(
    processor: ProcessorMixin, *, text: str | None = None, messages: Sequence[Mapping[str, Any]] | None = None,
    images: Sequence[Image], digests: Sequence[str] = (),
) -> ImagePrompt:
    """The prompt of a task with pictures, rendered by the model's chat template."""
    if (text is None) == (messages is None):
        raise ValueError("give exactly one of text or messages")
    chat = _with_images(messages if messages is not None else [{"role": "user", "content": text}], len(images))
    rendered = processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    raw = processor.tokenizer(rendered, add_special_tokens=False)["input_ids"]
    expanded = processor(text=[rendered], images=[list(images)], add_special_tokens=False)["input_ids"][0]
    return ImagePrompt(token_ids=list(raw), expanded_ids=[int(t) for t in expanded], images=tuple(images),
                       digests=tuple(digests))


def pixel_inputs(processor: ProcessorMixin, images: Sequence[Sequence[Image]]) -> dict[str, torch.Tensor]:
    """The pixel tensors of one row of pictures per prompt (what `model.generate` and the
    forward pass take beside the expanded ids)."""
    out = processor.image_processor(images=[list(row) for row in images], return_tensors="pt")
    return {k: v for k, v in out.items() if k in ("pixel_values", "pixel_attention_mask", "image_sizes", "image_grid_thw")}


def images_open(digests: Sequence[str]) -> list[Image]:
    from apps.buffer.ports import image_open

    return [image_open(d) for d in digests]
