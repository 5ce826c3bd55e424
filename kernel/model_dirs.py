"""What a local model folder holds and lacks, by file name (no Django, no I/O beyond the folder):
the run form's model check and the workers' tokenizer check (workers/engines/base.py, which
runs in processes where Django is not set up, such as a learner gang's ranks) share it."""

from __future__ import annotations

from pathlib import Path

# What a saved model directory holds (transformers' save_pretrained), by file name. Loading
# a folder that lacks its tokenizer fails deep inside the library ("install sentencepiece or
# tiktoken"); naming the missing part before a run is created says what to fix.
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
            "adapter_model.safetensors", "adapter_model.bin")
WEIGHT_SHARDS = ("model-*.safetensors", "pytorch_model-*.bin")
TOKENIZER = ("tokenizer.json", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "vocab.json", "vocab.txt",
              "tokenizer.tiktoken")


def has_any(directory: Path, names: tuple[str, ...], patterns: tuple[str, ...] = ()) -> bool:
    return any((directory / n).is_file() for n in names) or any(next(directory.glob(p), None) for p in patterns)


def model_dir_missing(*, path: Path, tokenizer: bool = True) -> list[str]:
    """The parts a local model directory lacks, as people name them: "config.json" (not a
    saved model), "weights", "tokenizer" (when `tokenizer`: none is named elsewhere). A
    LoRA adapter directory (adapter_config.json) needs its adapter weights only."""
    if (path / "adapter_config.json").is_file():
        return [] if has_any(path, ("adapter_model.safetensors", "adapter_model.bin")) else ["weights"]
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not has_any(path, WEIGHTS, WEIGHT_SHARDS):
        missing.append("weights")
    if tokenizer and not has_any(path, TOKENIZER, ("*.tiktoken",)):
        missing.append("tokenizer")
    return missing


_MISSING_SAID = {
    "config.json": "no config.json (not a directory saved with save_pretrained)",
    "weights": "no weights (model.safetensors, model-*.safetensors or pytorch_model.bin)",
    "tokenizer": "no tokenizer (tokenizer.json, tokenizer.model or vocab.json): save one there with "
                 "tokenizer.save_pretrained, or name one in the tokenizer field",
}


def model_missing_said(*, name: str, missing: list[str]) -> str:
    """What a model folder lacks, as a sentence: "/m has no tokenizer (tokenizer.json, …)"."""
    return f"{name} has " + "; ".join(_MISSING_SAID[m] for m in missing)
