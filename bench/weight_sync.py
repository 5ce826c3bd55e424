"""Seconds and bytes from publishing a version to an explorer generating with it: full
weights against a LoRA adapter, same model, same run. Target: adapter sync ≤ 0.1× the
full-weight time.

One process plays both sides on the checkpoint path (the default weight sync): the trainer
writes the version (`workers.weights.sync.save_pretrained_atomic`, as `CheckpointSync` does), the
explorer's transformers engine loads it (`engine_version_ensure`) and generates one greedy
token. The model is a ~100M-parameter Qwen2 built locally (random weights); the adapter is
rank 16 on every linear layer of the blocks. Each is timed over `--repeats` versions after
a first one (the first adapter also wraps the engine's base; reported apart).

Two figures per kind: sync (publish until the engine holds the version, ready to generate:
the weight sync itself, what the target is on) and publish → first token (sync plus one
greedy token; the token is a forward pass of the same model either way, ~0.3 s for 100M
parameters on a CPU, so it bounds that ratio from below whatever the sync costs).

    python -m bench.weight_sync [--layers 12] [--hidden 768] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--intermediate", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from kernel.config import AdapterConfig
    from workers.weights.adapters import adapter_wrap
    from workers.engines import SamplingSpec, engine_version_ensure
    from workers.engines.hf_engine import HFEngine
    from workers.models.tiny import tokenizer_build
    from workers.weights.sync import save_pretrained_atomic, weight_bytes

    torch.set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="bench-weight-sync-"))
    try:
        tokenizer = tokenizer_build(texts=[f"{a} + {b} = {a + b}" for a in range(30) for b in range(30)], vocab_size=300)
        config = Qwen2Config(
            vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
            num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
            num_key_value_heads=min(4, args.hidden // 64),
            max_position_embeddings=1024, tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        )
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        base = root / "base"
        model.save_pretrained(base)
        tokenizer.save_pretrained(base)
        # Loaded back from its directory, so an adapter on it records the base it applies to.
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        params = sum(p.numel() for p in model.parameters())
        engine = HFEngine(path=str(base))
        prompt = [[5, 6, 7, 8]]
        greedy = SamplingSpec(temperature=0.0, max_tokens=1)

        def sync(policy: torch.nn.Module, version: int) -> tuple[float, float, int]:
            """(seconds until the engine holds the version, until its first token, bytes)."""
            out = root / f"v{version}"
            started = time.perf_counter()
            save_pretrained_atomic(model=policy, tokenizer=tokenizer, out=out)
            engine_version_ensure(engine, version=version, path=str(out))
            ready = time.perf_counter() - started
            engine.generate(prompt, n=1, sampling=greedy)
            return ready, time.perf_counter() - started, weight_bytes(out)

        def nudge(policy: torch.nn.Module, only_lora: bool) -> None:
            with torch.no_grad():
                for name, p in policy.named_parameters():
                    if not only_lora or "lora_" in name:
                        p.add_(1e-3)

        version = 0

        def repeats(model: torch.nn.Module, *, only_lora: bool) -> tuple[list[float], list[float], int]:
            """Seconds and tokens/s of each sync after a nudge (the first one is a warm-up), and its bytes."""
            nonlocal version
            times: list[float] = []
            tokens: list[float] = []
            size = 0
            for _ in range(args.repeats + 1):
                version += 1
                nudge(model, only_lora=only_lora)
                seconds, token_s, size = sync(model, version)
                times.append(seconds)
                tokens.append(token_s)
            return times, tokens, size

        full, full_token, full_bytes = repeats(model, only_lora=False)
        lora = adapter_wrap(model=model, lora=AdapterConfig(
            rank=16, alpha=32.0, dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
        adapter, adapter_token, adapter_bytes = repeats(lora, only_lora=True)
        full_s, adapter_s = statistics.median(full[1:]), statistics.median(adapter[1:])
        full_t, adapter_t = statistics.median(full_token[1:]), statistics.median(adapter_token[1:])
        load = os.getloadavg()[0]
        print(f"model: {params / 1e6:.1f}M parameters; publish → explorer (checkpoint path, transformers engine, "
              f"{engine.device}); medians of {args.repeats} versions after the first")
        print(f"{'version kind':<16}{'bytes':>14}{'sync s':>9}{'spread':>15}{'first':>8}{'→ token s':>11}{'load':>7}")
        for name, size, runs, token, first in (("full weights", full_bytes, full, full_t, full[0]),
                                               ("LoRA adapter", adapter_bytes, adapter, adapter_t, adapter[0])):
            spread = f"{min(runs[1:]):.3f}–{max(runs[1:]):.3f}"
            print(f"{name:<16}{size:>14,}{statistics.median(runs[1:]):>9.3f}{spread:>15}{first:>8.3f}{token:>11.3f}{load:>7.2f}")
        ratio = adapter_s / full_s
        print(f"\nadapter sync: {ratio:.3f}× the full-weight time, {adapter_bytes / full_bytes:.4f}× the bytes "
              f"(target ≤ 0.1× time): {'met' if ratio <= 0.1 else 'NOT met'}; publish → first token "
              f"{adapter_t / full_t:.3f}×; load average {load:.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
