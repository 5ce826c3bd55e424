"""The tiny local VLM: deterministic, cached by its manifest, sometimes right, and shipped with
its taskset in the import format (a zip of tasks.jsonl and PNGs)."""

from __future__ import annotations

import json
import random
import zipfile
from pathlib import Path

from workers.models.vision_demo import (
    MANIFEST,
    QUESTION,
    TASKSET_ZIP,
    VisionSettings,
    squares_image,
    vision_messages,
    vision_model_build,
)

TINY = VisionSettings(steps=3, eval_every=0, batch_size=4, train_size=16, heldout=8, taskset_size=4)


def test_the_same_seed_builds_byte_identical_files_and_a_second_build_is_a_cache_hit(tmp_path: Path) -> None:
    a = vision_model_build(out=tmp_path / "a", settings=TINY, log=lambda _: None)
    b = vision_model_build(out=tmp_path / "b", settings=TINY, log=lambda _: None)
    assert a.built and b.built
    assert a.files == b.files
    assert {"model.safetensors", "tokenizer.json", "processor_config.json", TASKSET_ZIP} <= set(a.files)
    again = vision_model_build(out=tmp_path / "a", settings=TINY, log=lambda _: None)
    assert not again.built and again.files == a.files
    other = vision_model_build(out=tmp_path / "c", settings=VisionSettings(**{**TINY.__dict__, "seed": 1}), log=lambda _: None)
    assert other.files["model.safetensors"] != a.files["model.safetensors"]


def test_the_warmed_up_model_counts_squares_better_than_a_constant_guess_but_not_always(vision_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from workers.models.vision_demo import greedy_accuracy

    manifest = json.loads((vision_model_dir / MANIFEST).read_text())
    # The build stopped at its target: above 0.25 (always answering one count), below perfect.
    assert 0.3 < manifest["accuracy"] < 0.95
    processor = AutoProcessor.from_pretrained(vision_model_dir)
    model = AutoModelForImageTextToText.from_pretrained(vision_model_dir, dtype=torch.float32)
    rng = random.Random(1234)
    fresh = [(squares_image(count=n, rng=rng), n) for n in [1, 2, 3, 4] * 15]
    assert 0.3 < greedy_accuracy(model=model, processor=processor, examples=fresh) < 0.95
    # The picture matters: the same question over different pictures gets different answers.
    text = processor.apply_chat_template(vision_messages(QUESTION), add_generation_prompt=True, tokenize=False)
    inputs = processor(images=[[img] for img, _ in fresh], text=[text] * len(fresh), return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    answers = {processor.tokenizer.decode(row[inputs["input_ids"].shape[1]:], skip_special_tokens=True) for row in out}
    assert len(answers) > 1


def test_the_shipped_taskset_zip_names_an_image_per_task_with_its_count(vision_model_dir: Path) -> None:
    from PIL import Image

    with zipfile.ZipFile(vision_model_dir / TASKSET_ZIP) as zf:
        records = [json.loads(line) for line in zf.read("tasks.jsonl").decode().splitlines()]
        assert len(records) == VisionSettings().taskset_size
        for record in records[:5]:
            assert record["domain"] == "vision" and record["prompt"] == QUESTION
            with zf.open(record["image"]) as fh:
                image = Image.open(fh)
                image.load()
            # Count the squares' centres: the answer is what the picture shows.
            pixels = image.convert("RGB")
            centres = sum(pixels.getpixel((x * 8 + 4, y * 8 + 4)) != (255, 255, 255) for x in range(4) for y in range(4))
            assert str(centres) == record["answer"]


def test_the_command_finds_a_current_build_and_names_its_taskset(vision_model_dir: Path) -> None:
    import io

    from django.core.management import call_command

    out = io.StringIO()
    call_command("rft_vision_model", "--out", str(vision_model_dir), stdout=out)
    assert f"vision model in {vision_model_dir} is up to date" in out.getvalue()
    assert str(vision_model_dir / TASKSET_ZIP) in out.getvalue()
