"""The one builder of the models made locally (no model hub): the text demo model
(workers/models/demo.py) and the tiny vision-language model (workers/models/vision_demo.py) are
each a `Recipe` of it, built by `manage.py rft_demo_model` / `rft_vision_model` (one
command, apps/cli/model_build.py).

A recipe's build runs in a fresh Python process (`python -m <recipe module>`, whose `_main`
is `build_main`) with its numerics pinned before torch loads (`NUMERICS_ENV`: one thread,
torch's AVX2 kernels and MKL's AVX2 code path even on AVX-512 CPUs, which otherwise sum in
another order and give other bits), so neither the caller's thread settings nor its CPU's
widest vector unit change the weights. A manifest in the output directory records the
settings, the installed versions of the libraries the files depend on and the files' hashes;
a build into a directory that already holds an intact one made with the same settings and
versions is skipped.

Only the standard library loads here: the web side may import the recipes' names.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypedDict, TypeVar, cast

from kernel.exceptions import UpstreamFailed

if TYPE_CHECKING:
    import torch

# Set before torch loads in the build's process. MKL_CBWR: MKL's conditional numerical
# reproducibility (the same code path on every AVX2 CPU); ATEN_CPU_CAPABILITY and
# ONEDNN_MAX_CPU_ISA: torch's own and oneDNN's kernels no wider than AVX2. A CPU without
# AVX2 falls back to its default path (and may then give other bits). The pins narrow the
# spread, they do not close it: two machines with every pin in place still built two sets of
# weights (round 69: sha256 160d3e773468 on an Intel Xeon with AVX-512, ac8a24be366e before),
# so the manifest's hashes, which the benches print, are what tell two builds apart.
NUMERICS_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MKL_CBWR": "AVX2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "PYTHONHASHSEED": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "CUDA_VISIBLE_DEVICES": "",
}


class BuildSettings(Protocol):
    """A recipe's settings: a frozen dataclass whose every field the manifest records."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def seed(self) -> int: ...

    @property
    def steps(self) -> int: ...


S = TypeVar("S", bound=BuildSettings)


class DemoBuildFailed(UpstreamFailed, RuntimeError):
    """The build's process exited with an error; the message holds the end of its output."""

    code = "demo_build_failed"


@dataclass
class BuildResult(Generic[S]):
    out: Path
    settings: S
    accuracy: float
    built: bool
    seconds: float = 0.0
    files: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Recipe(Generic[S]):
    """What the builder needs to know of a model made locally."""

    name: str  # "demo model": its log lines start with "<name>:", its messages say it
    module: str  # run as `python -m <module>` in the pinned child; its `_main` is build_main
    manifest: str  # the manifest's file name in the output directory
    taskset: str  # the taskset file the build writes beside the model
    versions: tuple[str, ...]  # the libraries whose versions the files depend on
    settings_type: type[S]


class Manifest(TypedDict):
    """What `manifest_write` records beside a build (a recipe may add keys of its own)."""

    settings: dict[str, object]
    accuracy: float
    parameters: int
    steps: int
    files: dict[str, str]
    versions: dict[str, str]


def manifest_read(out: Path, *, name: str) -> Manifest | None:
    """The manifest `manifest_write` left in `out`; None when there is none or it is not a
    JSON object."""
    try:
        found = json.loads((out / name).read_text())
    except (OSError, ValueError):
        return None
    return cast(Manifest, found) if isinstance(found, dict) else None


def file_hashes(out: Path, *, manifest: str) -> dict[str, str]:
    """sha256 of every file a build wrote in `out`, its manifest aside."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.iterdir())
        if p.is_file() and p.name != manifest
    }


def library_versions(names: Sequence[str]) -> dict[str, str]:
    """The installed versions of the libraries the files depend on (read without importing them)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "absent"
    return out


def manifest_current(recipe: Recipe[S], out: Path, settings: S) -> Manifest | None:
    """The manifest when `out` holds an intact build with exactly these settings and the
    installed versions of the recipe's libraries."""
    recorded_manifest = manifest_read(out, name=recipe.manifest)
    if not recorded_manifest or recorded_manifest.get("settings") != asdict(settings):
        return None
    if recorded_manifest.get("versions") != library_versions(recipe.versions):
        return None
    recorded = recorded_manifest.get("files") or {}
    if not recorded or any(not (out / name).is_file() for name in recorded):
        return None
    return recorded_manifest


def model_build(recipe: Recipe[S], *, out: str | Path, settings: S, force: bool = False, progress: bool = True,
                log: Callable[[str], None] = print) -> BuildResult[S]:
    """Build (or find already built) the recipe's model and taskset in `out`, in a child
    process with `NUMERICS_ENV`; its log lines come back through `log`, its progress bar on
    stderr (`progress`; else stderr joins the output whose end a failure reports)."""
    out = Path(out)
    if not force:
        manifest = manifest_current(recipe, out, settings)
        if manifest is not None:
            return BuildResult(out=out, settings=settings, accuracy=manifest["accuracy"], built=False,
                               files=manifest["files"])
    started = time.monotonic()
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", recipe.module, "--out", str(out.resolve()),
           "--settings", json.dumps(asdict(settings))] + ([] if progress else ["--quiet"])
    # The child inherits this environment (not a setting: what the process was started with),
    # with the numerics pinned and this checkout first on its path.
    env = {**os.environ, **NUMERICS_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=None if progress else subprocess.STDOUT,
                            text=True)
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        tail = (tail + [line])[-20:]
        if line.startswith(f"{recipe.name}:"):
            log(line)
    if proc.wait() != 0:
        raise DemoBuildFailed(f"building the {recipe.name} failed (exit {proc.returncode}):\n" + "\n".join(tail))
    manifest = manifest_read(out, name=recipe.manifest)
    if manifest is None:
        raise DemoBuildFailed(f"the {recipe.name} build wrote no manifest in {out}")
    return BuildResult(out=out, settings=settings, accuracy=manifest["accuracy"], built=True,
                       seconds=time.monotonic() - started, files=manifest["files"])


def manifest_write(recipe: Recipe[S], out: Path, *, settings: S, accuracy: float, parameters: int, steps: int,
                   **extra: object) -> dict[str, str]:
    """Record a finished build in `out` (last, so a manifest means the files are whole);
    returns the files' hashes."""
    files = file_hashes(out, manifest=recipe.manifest)
    manifest = {"settings": asdict(settings), "accuracy": accuracy, "parameters": parameters,
                "steps": steps, "files": files, "versions": library_versions(recipe.versions), **extra}
    (out / recipe.manifest).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return files


class Pretrained(Protocol):
    """What transformers saves with `save_pretrained`: a model, a tokenizer, a processor."""

    # A read-only attribute of any call shape: transformers types each class's own keywords.
    @property
    def save_pretrained(self) -> Callable[..., object]: ...


def build_save(recipe: Recipe[S], out: Path, *, model: Pretrained, companion: Pretrained,
               data_write: Callable[[Path], None], settings: S, accuracy: float, parameters: int, steps: int,
               **extra: object) -> dict[str, str]:
    """Write a finished build into `out`: the model (safetensors), its tokenizer or processor
    (`companion`), the recipe's own data (`data_write(out)`: a taskset), the manifest last.
    The old manifest goes first, so a build cut short leaves none and is not taken for current.
    Returns the files' hashes."""
    out.mkdir(parents=True, exist_ok=True)
    (out / recipe.manifest).unlink(missing_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    companion.save_pretrained(out)
    data_write(out)
    return manifest_write(recipe, out, settings=settings, accuracy=accuracy, parameters=parameters, steps=steps, **extra)


def check_due(*, step: int, every: int, steps: int) -> bool:
    """Whether a warm-up measures held-out accuracy after its 0-based `step`: every `every`
    steps (0: never), but not after the last (the build measures once more after the loop)."""
    return bool(every) and (step + 1) % every == 0 and step + 1 < steps


def build_main(recipe: Recipe[S], build_here: Callable[..., BuildResult[S]], argv: list[str] | None = None) -> None:
    """The child process's entry: `build_here(out=, settings=, progress=, log=)` in it."""
    import argparse

    parser = argparse.ArgumentParser(description=f"Build the {recipe.name} here (model_build runs this in a pinned child).")
    parser.add_argument("--out", required=True)
    parser.add_argument("--settings", required=True, help=f"{recipe.settings_type.__name__} as JSON")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    build_here(out=Path(args.out), settings=recipe.settings_type(**json.loads(args.settings)), progress=not args.quiet,
               log=lambda line: print(line, flush=True))


def sft_batch(rows: Sequence[tuple[list[int], list[int]]], *, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids, attention mask, labels) of (prompt, completion) rows, right-padded, the
    loss on the completion only: the prompt is given, not learned."""
    import torch

    width = max(len(p) + len(c) for p, c in rows)
    ids = torch.full((len(rows), width), pad_id)
    labels = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (p, c) in enumerate(rows):
        seq = p + c
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(seq)] = 1
        labels[i, len(p) : len(seq)] = torch.tensor(c)
    return ids, mask, labels
