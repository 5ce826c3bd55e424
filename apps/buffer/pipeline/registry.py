"""The operator registry: names, the stages each operator can run at, and its params schema.

Pure Python (no Django models imported at module level), so the run-config schema can
validate pipeline steps anywhere the config is validated.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from kernel.plain_errors import error_plain

if TYPE_CHECKING:
    from apps.buffer.pipeline.core import Row

# Where a pipeline runs: experiences being written, a taskset being imported, a batch
# claimed for training. The config's lists are named after them (on_write, ...).
STAGES = ("write", "import", "claim")


class Params(BaseModel):
    """Base of every operator's params: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# An operator: `fn(rows, ctx, params) -> added rows | None` (apps/buffer/pipeline/core.py);
# each takes its own Params subclass, hence the open argument list.
Operator = Callable[..., "list[Row] | None"]
Op = TypeVar("Op", bound=Operator)


@dataclass(frozen=True)
class OperatorSpec:
    name: str
    fn: Operator
    stages: frozenset[str]
    params: type[Params]
    # "inline": runs in the process applying the pipeline; "worker": enqueued to a GPU
    # worker after the surrounding transaction commits (needs the rollout engine).
    where: str = "inline"
    description: str = ""
    extra: dict[str, object] = field(default_factory=dict)


_REGISTRY: dict[str, OperatorSpec] = {}


def register(
    name: str, *, stages: Iterable[str], params: type[Params] = Params, where: str = "inline", description: str = ""
) -> Callable[[Op], Op]:
    stage_set = frozenset(stages)
    unknown = stage_set - set(STAGES)
    if unknown:
        raise ValueError(f"operator {name!r}: unknown stages {sorted(unknown)}")

    def decorate(fn: Op) -> Op:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ValueError(f"pipeline operator {name!r} is registered twice")
        _REGISTRY[name] = OperatorSpec(
            name=name, fn=fn, stages=stage_set, params=params, where=where,
            description=description or (fn.__doc__ or "").strip().split("\n")[0],
        )
        return fn

    return decorate


def _load_builtins() -> None:
    # Importing the modules registers the built-in operators.
    from apps.buffer.pipeline import clean, filters, prioritize, synthesize  # noqa: F401


def operator_names() -> set[str]:
    _load_builtins()
    return set(_REGISTRY)


def operator_get(name: str) -> OperatorSpec:
    _load_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown pipeline operator {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None


def _pydantic_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        msg = error_plain(err)
        if err["type"] == "extra_forbidden":
            msg = "unknown parameter"
        # A param's own name is in its message ("Threshold must be less than 1"); a nested
        # one's path goes first.
        parts.append(f"{where}: {msg}" if len(err["loc"]) > 1 or err["type"] == "extra_forbidden" else msg)
    return "; ".join(parts)


def params_check(name: str, params: Mapping[str, object]) -> Params:
    """The operator's typed params, or ValueError saying which param is wrong and why."""
    spec = operator_get(name)
    try:
        return spec.params.model_validate(params)
    except ValidationError as exc:
        raise ValueError(f"{name} params: {_pydantic_message(exc)}") from None


@lru_cache(maxsize=512)
def _params_cached(name: str, params_json: str) -> Params:
    return params_check(name, json.loads(params_json))


def params_parse(name: str, params: Mapping[str, object]) -> Params:
    """params_check, cached: the write path parses the same few configs again and again."""
    return _params_cached(name, json.dumps(params, sort_keys=True, default=str))


def stage_check(name: str, stage: str) -> None:
    spec = operator_get(name)
    if stage not in spec.stages:
        runs_at = ", ".join(f"on_{s}" for s in STAGES if s in spec.stages)
        raise ValueError(f"operator {name!r} cannot run on_{stage}; it runs {runs_at}")
