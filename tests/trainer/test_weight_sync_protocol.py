"""NcclSync's protocol over gloo on CPU: the trainer (rank 0) publishes a version and an
explorer (rank 1) receives it on its receiver thread; its transformers engine takes the
tensors without reading the checkpoint and generates the trainer's greedy text. A LoRA
version moves its adapter only. (The same code with backend nccl is the GPU path.)"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from kernel.config import AdapterConfig
from tests.servers import free_port

pytestmark = pytest.mark.slow

PROMPTS = ["What is 3 + 4?", "What is 12 + 5?"]


def _greedy(engine_or_model, tokenizer, prompts):
    from workers.engines import SamplingSpec

    groups = engine_or_model.generate(prompts, n=1, sampling=SamplingSpec(temperature=0.0, max_tokens=10))
    return [g[0].token_ids for g in groups]


def _trainer_model(model_dir: str, lora: bool):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if lora:
        from workers.weights.adapters import adapter_wrap

        model = adapter_wrap(model=model, lora=AdapterConfig(rank=4, alpha=16.0, dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj"]))
    with torch.no_grad():  # a "trained" version: visibly different greedy text
        for name, p in model.named_parameters():
            if p.requires_grad and (not lora or "lora_" in name):
                p.add_(torch.randn_like(p) * (0.5 if lora else 0.05))
    return model


def _rank(rank: int, addr: str, model_dir: str, lora: bool, out: str) -> None:
    from transformers import AutoTokenizer

    from workers.engines import engine_last_load, engine_version_ensure, prompt_ids
    from workers.engines.hf_engine import HFEngine
    from workers.weights.sync import NcclSync, SyncReceiver, receiver_install, save_pretrained_atomic

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [prompt_ids(tokenizer, text=p) for p in PROMPTS]
    sync = NcclSync(backend="gloo", addr=addr, world_size=2, rank=rank)
    version_dir = Path(out) / "v1"
    if rank == 0:
        model = _trainer_model(model_dir, lora)
        save_pretrained_atomic(model=model, tokenizer=tokenizer, out=version_dir)
        engine = HFEngine(path=model_dir)
        engine.model = model.eval()  # the trainer's own weights, generating as an engine would
        expected = _greedy(engine, tokenizer, prompts)
        started = time.perf_counter()
        sent = sync.broadcast(model, run_id=7, version=1, path=str(version_dir))
        result = {"expected": expected, "sent": sent, "seconds": time.perf_counter() - started,
                  "full_bytes": sum(t.numel() * t.element_size() for t in model.state_dict().values())}
    else:
        engine = HFEngine(path=model_dir)
        if lora:  # an explorer that already holds an adapter of this run (e.g. version 0's)
            import shutil

            first = Path(out) / "v0-adapter"
            while not (version_dir / "adapter_config.json").exists():
                time.sleep(0.1)
            shutil.copytree(version_dir, first)
            from safetensors.torch import load_file, save_file

            zeros = {k: torch.zeros_like(v) for k, v in load_file(str(first / "adapter_model.safetensors")).items()}
            save_file(zeros, str(first / "adapter_model.safetensors"))
            engine.load(version=0, path=str(first))
        before = _greedy(engine, tokenizer, prompts)
        receiver = SyncReceiver(sync, limit=1).start()
        receiver_install(receiver)
        deadline = time.monotonic() + 120
        while receiver.received == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        # The checkpoint's weights are gone: whatever the engine holds next came over the wire.
        for f in version_dir.glob("*.safetensors"):
            f.unlink()
        took = engine_version_ensure(engine, version=1, path=str(version_dir))
        how = engine_last_load(engine)
        result = {"got": _greedy(engine, tokenizer, prompts), "before": before, "loaded": took,
                  "version": engine.version, "path": engine.path, "via": how.via if how else None,
                  "bytes": how.bytes if how else None}
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(result))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_an_explorer_receives_a_broadcast_version_and_generates_the_trainers_text(
    tiny_model_dir: Path, tmp_path: Path, lora: bool
) -> None:
    import torch.multiprocessing as mp

    mp.start_processes(_rank, args=(f"tcp://127.0.0.1:{free_port()}", str(tiny_model_dir), lora, str(tmp_path)),
                       nprocs=2, start_method="spawn")
    trainer = json.loads((tmp_path / "rank0.json").read_text())
    explorer = json.loads((tmp_path / "rank1.json").read_text())
    assert explorer["loaded"] and explorer["version"] == 1
    # What the explorer's load event reports: the tensors came over the wire, every byte sent.
    assert explorer["via"] == "broadcast" and explorer["bytes"] == trainer["sent"]
    assert explorer["got"] == trainer["expected"]
    assert explorer["before"] != trainer["expected"], "the new version generates what the old one did: proves nothing"
    if lora:
        assert trainer["sent"] < trainer["full_bytes"] / 5, "a LoRA version sent more than its adapter"
    else:
        assert trainer["sent"] == trainer["full_bytes"]
    assert trainer["seconds"] > 0
