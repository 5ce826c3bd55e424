"""vLLM vs transformers rollout throughput on the same ~20M-parameter local model.

Same prompts, same sampling (temperature 1, n samples per prompt, up to `--tokens` new
tokens), both engines given both cores. Prints tokens/s of each and, on the last line, the
ratio vLLM / transformers (target >= 1.5 on CPU).

The vision row, in the same run: the tiny VLM (workers/models/vision_demo.py, 0.44M parameters) on
the same picture prompts (a 32×32 picture of squares and the counting question) through
vLLM's multimodal inputs and through transformers with the processor's pixels; its ratio is
printed before the text ratio (`--no-vision` skips it).

    python -m bench.rollout [--prompts 64 --n 4 --tokens 64 --threads 2 --no-vision | --vision-only]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any


def _model(out: Path) -> Path:
    from workers.models.tiny import tiny_model_save

    if not (out / "model.safetensors").exists():
        # ~20M parameters: Qwen2, hidden 512, 5 layers.
        tiny_model_save(out, hidden_size=512, layers=5, heads=8, intermediate_size=2048, max_positions=512, vocab_size=512)
    return out


def _measure(engine: Any, prompts: list[Any], *, n: int, tokens: int) -> tuple[float, int, float]:
    from workers.engines import SamplingSpec

    sampling = SamplingSpec(temperature=1.0, max_tokens=tokens, seed=0)
    engine.generate(prompts[:4], n=n, sampling=sampling)  # warm-up
    started = time.perf_counter()
    result = engine.generate(prompts, n=n, sampling=sampling)
    seconds = time.perf_counter() - started
    generated = sum(len(s.token_ids) for group in result for s in group)
    return generated / seconds, generated, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--model-dir", default=None, help="reuse or create the bench model here")
    parser.add_argument("--no-vision", action="store_true", help="skip the vision row")
    parser.add_argument("--vision-only", action="store_true", help="only the vision row (its ratio is then the last line)")
    args = parser.parse_args()

    cache = Path(os.environ.get("RFT_BENCH_CACHE", Path(__file__).resolve().parent.parent / ".cache" / "bench"))
    cache.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache.parent / "vllm"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache.parent / "inductor"))
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # Both engines get every core: vLLM's CPU worker binds its OpenMP threads to these.
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{args.threads - 1}"
    os.environ["OMP_NUM_THREADS"] = str(args.threads)

    import torch

    torch.set_num_threads(args.threads)
    from workers.engines import engine_create, prompt_ids

    if args.vision_only:
        only = _vision_row(cache, prompts=args.prompts, n=args.n, tokens=args.tokens)
        print(json.dumps({"prompts": args.prompts, "n": args.n, "max_tokens": args.tokens,
                          "loadavg": [round(x, 2) for x in os.getloadavg()]}))
        _vision_print(only, prompts=args.prompts)
        return

    model_dir = _model(Path(args.model_dir) if args.model_dir else cache / "rollout-20m")
    # The concrete engines' own attributes (model, close) are read: not the RolloutEngine protocol.
    hf: Any = engine_create(backend="transformers", path=str(model_dir), batch_size=args.prompts * args.n)
    params = sum(p.numel() for p in hf.model.parameters())
    prompts = [prompt_ids(hf.tokenizer, text=f"What is {i} + {i % 7}?") for i in range(args.prompts)]
    hf_tps, hf_tokens, hf_s = _measure(hf, prompts, n=args.n, tokens=args.tokens)
    del hf

    vllm: Any = engine_create(backend="vllm", path=str(model_dir))
    vllm_tps, vllm_tokens, vllm_s = _measure(vllm, prompts, n=args.n, tokens=args.tokens)
    vllm.close()  # its shutdown logs come before the results, so the ratio stays the last line

    vision: dict[str, Any] | None = None if args.no_vision else _vision_row(cache, prompts=args.prompts, n=args.n, tokens=args.tokens)

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU x{args.threads} ({platform.processor() or platform.machine()})"
    print(json.dumps({"model_parameters": params, "prompts": args.prompts, "n": args.n, "max_tokens": args.tokens, "device": device,
                      "loadavg": [round(x, 2) for x in os.getloadavg()]}))
    if vision is not None:
        _vision_print(vision, prompts=args.prompts)
    print(f"transformers: {hf_tokens} tokens in {hf_s:.2f} s = {hf_tps:.1f} tokens/s")
    print(f"vllm:         {vllm_tokens} tokens in {vllm_s:.2f} s = {vllm_tps:.1f} tokens/s")
    print(f"vllm/transformers tokens/s ratio: {vllm_tps / hf_tps:.2f}", flush=True)


def _vision_print(vision: dict[str, Any], *, prompts: int) -> None:
    print(f"vision transformers: {vision['hf_tokens']} tokens in {vision['hf_s']:.2f} s = {vision['hf_tps']:.1f} tokens/s "
          f"({vision['parameters']} parameters, {prompts} pictures)")
    print(f"vision vllm:         {vision['vllm_tokens']} tokens in {vision['vllm_s']:.2f} s = {vision['vllm_tps']:.1f} tokens/s")
    print(f"vision vllm/transformers tokens/s ratio: {vision['vllm_tps'] / vision['hf_tps']:.2f}", flush=True)


def _vision_row(cache: Path, *, prompts: int, n: int, tokens: int) -> dict[str, Any]:
    """The tiny VLM through both engines on the same picture prompts (ImagePrompt: vLLM gets
    the pictures as multimodal inputs, transformers the processor's pixels)."""
    import random

    from workers.engines import engine_create
    from workers.vision import vision_prompt
    from workers.models.vision_demo import QUESTION, squares_image, vision_model_build

    model_dir = vision_model_build(out=cache / "vision-model", log=lambda _: None).out
    hf: Any = engine_create(backend="transformers", path=str(model_dir), batch_size=prompts * n)
    rng = random.Random(0)
    pictured = [vision_prompt(hf.processor, text=QUESTION, images=[squares_image(count=rng.randint(1, 4), rng=rng)])
                for _ in range(prompts)]
    parameters = sum(p.numel() for p in hf.model.parameters())
    hf_tps, hf_tokens, hf_s = _measure(hf, pictured, n=n, tokens=tokens)
    del hf
    vllm: Any = engine_create(backend="vllm", path=str(model_dir))
    vllm_tps, vllm_tokens, vllm_s = _measure(vllm, pictured, n=n, tokens=tokens)
    vllm.close()
    return {"parameters": parameters, "hf_tps": hf_tps, "hf_tokens": hf_tokens, "hf_s": hf_s,
            "vllm_tps": vllm_tps, "vllm_tokens": vllm_tokens, "vllm_s": vllm_s}


if __name__ == "__main__":
    main()
