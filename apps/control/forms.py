"""The run-creation form, generated from the one config schema (`kernel.config.RunConfig`).

Each scalar field of the schema becomes an input named by its dotted path
(`sampling.temperature`); lists and mappings (rewards, stop strings, pipeline steps) are YAML
text areas. The posted values go through `config_validate` unchanged, so the form, the API
and config files agree, and each `ConfigInvalid.errors` entry lands beside the field whose
path is the longest prefix of the error's path (`rewards.0.name` → the rewards box).
"""

from __future__ import annotations

import enum
import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic.json_schema import JsonDict

from kernel.input_checks import InputRejected, yaml_parse
from kernel.algorithms import algorithm_get, algorithm_names, algorithms
from kernel.config import FeedbackSettings, RunConfig, config_validate
from kernel.eval_series import best_by_choices
from kernel.preferences import preference_names
from kernel.reward_kinds import reward_kind_names
from kernel.plugin_names import domains

# Where errors with no field of their own go: the whole form, or the uploaded file.
FORM = "__all__"
CONFIG_FILE = "config_file"


@dataclass
class FieldSpec:
    path: str
    label: str
    widget: str  # text | number | select | checkbox | yaml
    section: str
    required: bool = False
    choices: list[str] = field(default_factory=list)
    default: str = ""
    help: str = ""
    step: str = "any"
    # A field of a settings block that is off unless given (trainer.lora): no value is
    # filled in, so an untouched form does not switch the block on.
    optional_block: bool = False
    # Filled in per request by the views (the value shown, its errors).
    value: str = ""
    errors: list[str] = field(default_factory=list)


def _unwrap_optional(annotation: object) -> tuple[object, bool]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


_NO_BASE = object()


def _default_text(info: FieldInfo, widget: str, base: object = _NO_BASE) -> str:
    if base is _NO_BASE and info.is_required():
        return ""
    # A nested block's field takes its default from the block's own default (eval.sampling
    # is greedy, although a SamplingConfig's temperature defaults to 1).
    value = info.get_default(call_default_factory=True) if base is _NO_BASE else base
    if isinstance(value, BaseModel):
        return ""
    if value is None:
        return ""
    if widget == "yaml":
        return "" if value in ([], {}) else yaml.safe_dump(value, sort_keys=False).strip()
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "on" if value else ""
    return str(value)


def _extra(info: FieldInfo) -> JsonDict:
    return info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}


def _specs(model: type[BaseModel], prefix: str, section: str, optional_block: bool = False,
           base: BaseModel | None = None) -> list[FieldSpec]:
    specs: list[FieldSpec] = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        annotation, optional = _unwrap_optional(info.annotation)
        # A block whose fields depend on another field (trainer.params: the algorithm's) is one YAML box.
        if isinstance(annotation, type) and issubclass(annotation, BaseModel) and not _extra(info).get("per_algorithm"):
            # A block that may be left out entirely (None: off) keeps its fields blank.
            block = getattr(base, name) if base is not None else (
                None if info.is_required() else info.get_default(call_default_factory=True))
            specs.extend(_specs(annotation, f"{path}.", path, optional_block or (optional and info.default is None),
                                block if isinstance(block, BaseModel) else None))
            continue
        origin = typing.get_origin(annotation)
        choices: list[str] = []
        if origin is typing.Literal:
            widget, choices = "select", [str(a) for a in typing.get_args(annotation)]
        elif isinstance(annotation, type) and issubclass(annotation, enum.Enum):
            widget, choices = "select", [str(m.value) for m in annotation]
        elif annotation is bool:
            widget = "checkbox"
        elif annotation in (int, float):
            widget = "number"
        elif annotation is str and _extra(info).get("registry") == "algorithms":
            widget, choices = "select", algorithm_names()
        elif annotation is str and _extra(info).get("registry") == "reward_kinds":
            widget, choices = "select", reward_kind_names()
        elif annotation is str and _extra(info).get("registry") == "eval_series":
            # The evaluation's series, each registered preference's share among them; blank:
            # the default (accuracy where the domain has a verifier, else reward_mean).
            widget, choices = "select", ["", *best_by_choices(preference_names())]
        elif annotation is str:
            widget = "markdown" if _extra(info).get("widget") == "markdown" else "text"
        else:
            widget = "yaml"
        specs.append(FieldSpec(
            path=path,
            label=name.replace("_", " "),
            widget=widget,
            section=section,
            required=info.is_required(),
            choices=choices,
            default="" if optional_block else _default_text(info, widget, getattr(base, name) if base is not None else _NO_BASE),
            help=info.description or "",
            step="1" if annotation is int else "any",
            optional_block=optional_block,
        ))
    return specs


def config_field_specs() -> list[FieldSpec]:
    return _specs(RunConfig, "", "run")


def feedback_field_specs() -> list[FieldSpec]:
    return _specs(FeedbackSettings, "feedback.", "feedback")


def _set(data: dict[str, object], path: str, value: object) -> None:
    *parents, leaf = path.split(".")
    node = data
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise TypeError(f"{path}: {part} is a value, not a block of the config")
        node = child
    node[leaf] = value


def _get(data: object, path: str) -> object:
    node = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def config_from_post(post: Mapping[str, object], specs: list[FieldSpec]) -> tuple[dict[str, object], dict[str, str]]:
    """The nested config mapping the posted fields describe, and errors for fields that
    could not even be read (bad YAML). Empty inputs are left out so defaults apply."""
    data: dict[str, object] = {}
    errors: dict[str, str] = {}
    for spec in specs:
        raw = post.get(spec.path)
        if spec.widget == "checkbox":
            _set(data, spec.path, raw is not None and raw not in ("", "off", "false", "0"))
            continue
        if raw is None or str(raw).strip() == "":
            continue
        if spec.widget == "yaml":
            try:
                _set(data, spec.path, yaml_parse(str(raw), where=spec.path))
            except InputRejected as exc:
                errors[spec.path] = exc.message if exc.field == spec.path else f"{exc.field}: {exc.message}"
            continue
        # Numbers stay strings: the schema parses them and names the field when it can't.
        # Markdown is kept as written (its line endings made \n by the schema): a trailing
        # newline stripped here made a copied run's guidelines differ from its original's.
        _set(data, spec.path, str(raw) if spec.widget == "markdown" else str(raw).strip())
    return data, errors


def values_from_config(data: object, specs: list[FieldSpec]) -> dict[str, str]:
    """Form values for a (possibly invalid) config mapping, to show an uploaded file's
    contents in the form beside its errors."""
    values: dict[str, str] = {}
    if not isinstance(data, dict):
        return values
    for spec in specs:
        value = _get(data, spec.path)
        if value is None:
            continue
        if spec.widget == "yaml":
            values[spec.path] = yaml.safe_dump(value, sort_keys=False).strip() if value not in ([], {}) else ""
        elif spec.widget == "checkbox":
            values[spec.path] = "on" if value else ""
        else:
            values[spec.path] = value if isinstance(value, str) else json.dumps(value)
    return values


def errors_by_field(errors: dict[str, str], specs: list[FieldSpec], *, fallback: str = FORM) -> dict[str, list[str]]:
    """Attach each error to the field of the longest matching path, else its section,
    else `fallback` (the whole form, or the uploaded file for keys the form lacks)."""
    paths = {spec.path for spec in specs}
    sections = {spec.section for spec in specs}
    placed: dict[str, list[str]] = {}
    for path, message in errors.items():
        target = fallback
        parts = path.split(".") if path else []
        for n in range(len(parts), 0, -1):
            candidate = ".".join(parts[:n])
            if candidate in paths or candidate in sections or candidate in {"name", "taskset", CONFIG_FILE}:
                target = candidate
                break
        if target == fallback and path and fallback != FORM:
            message = f"{path}: {message}" if path not in message else message
        placed.setdefault(target, []).append(message)
    return placed


def section_specs(specs: list[FieldSpec]) -> list[tuple[str, list[FieldSpec]]]:
    out: dict[str, list[FieldSpec]] = {}
    for spec in specs:
        out.setdefault(spec.section, []).append(spec)
    return list(out.items())


# The run section's fields everyone sets; the rest of the section is collapsed like the
# other sections ("more run settings").
ESSENTIAL = ("model", "tokenizer", "algorithm", "mode", "engine", "repeat_times", "explore_batch_size",
             "train_batch_size", "total_steps", "rewards")
SECTION_ORDER = ("run", "sampling", "feedback", "trainer", "reward_model", "feedback.selection", "feedback.trust",
               "run.more", "eval", "eval.sampling", "replay", "trainer.lora", "pipeline", "rollout")
SECTION_TITLES: dict[str, str] = {
    "run": "Run", "run.more": "More run settings", "sampling": "Sampling", "feedback": "Feedback settings",
    "feedback.selection": "Annotation queue order", "feedback.trust": "Hand-out by rater trust",
    "replay": "Replay", "trainer": "Trainer", "trainer.lora": "LoRA adapter", "reward_model": "Learned reward model",
    "pipeline": "Data pipeline", "rollout": "Rollout engine", "eval": "Held-out evaluation",
    "eval.sampling": "Evaluation sampling",
}


@dataclass
class FormSection:
    """One section (a folding box) of the new-run form: open (the essentials, or any with an error) or folded
    with a line saying what in it differs from the defaults."""

    id: str
    title: str
    help: str
    errors: list[str]
    fields: list[FieldSpec]
    open: bool
    summary: str


def _said(value: str, limit: int = 40) -> str:
    one_line = " ".join(value.split())
    return one_line if len(one_line) <= limit else one_line[: limit - 1] + "…"


def section_summary(fields: list[FieldSpec]) -> str:
    """What a folded box holds: its values that differ from the defaults, or "defaults"."""
    changed = []
    for spec in fields:
        if (spec.value or "") == (spec.default or ""):
            continue
        if spec.widget == "checkbox":
            changed.append(f"{spec.label} {'on' if spec.value else 'off'}")
        elif spec.widget in ("yaml", "markdown"):
            changed.append(f"{spec.label}: {_said(spec.value)}" if spec.value else f"{spec.label} cleared")
        else:
            changed.append(f"{spec.label} {_said(spec.value, 24) if spec.value else '(blank)'}")
    return " · ".join(changed) if changed else ("off" if fields and all(f.optional_block for f in fields) else "defaults")


def form_sections(specs: list[FieldSpec], errors: dict[str, list[str]]) -> list[FormSection]:
    """The form's boxes in schema order: the run's essentials first and open, every other
    section folded unless one of its fields (or the section) has an error."""
    boxes: list[FormSection] = []
    for section, fields in section_specs(specs):
        parts = [(section, fields)]
        if section == "run":
            parts = [("run", [f for f in fields if f.path in ESSENTIAL]),
                     ("run.more", [f for f in fields if f.path not in ESSENTIAL])]
        for gid, members in parts:
            section_errors = errors.get(section, []) if gid == section else []
            has_errors = bool(section_errors) or any(f.errors for f in members)
            boxes.append(FormSection(
                id=gid, title=SECTION_TITLES.get(gid, gid), help=SECTION_HELP.get(gid, ""), errors=section_errors,
                fields=members, open=gid == "run" or has_errors, summary=section_summary(members),
            ))
    # What people change most first; the rarely touched blocks after (unknown ones last).
    rank = {gid: i for i, gid in enumerate(SECTION_ORDER)}
    return sorted(boxes, key=lambda box: rank.get(box.id, len(rank)))


# Help shown on the new-run form, by section and by field (the schema's descriptions first).
SECTION_HELP: dict[str, str] = {
    "run": "What to train and how the loop runs: the starting model, the algorithm, the mode "
           "(sync waits for each new version; async explores ahead by at most max staleness versions; "
           "explore only writes experiences; train only learns from the buffer), batch sizes and steps.",
    "sampling": "How the explorer samples completions from the model.",
    "feedback": "How people's feedback enters the reward: auto (reward functions only), blend "
                "(w_auto·auto + w_human·human), human or learned; how long a group waits for people before the fallback "
                "(under learned, until the reward model passes its gate, a group nobody has open waits hold_seconds).",
    "replay": "How often an experience may be trained on, and how its priority decays.",
    "trainer": "The optimiser and loss of the trainer.",
    "pipeline": "Data operators over the buffer at write, import and claim time.",
    "run.more": "How explore and train steps interleave (sync interval and offset, staleness), epochs, "
                "held-out evaluation, experiment trackers and the seed.",
    "trainer.lora": "Train a LoRA adapter instead of every weight: give a rank to switch it on; blank is full fine-tuning.",
}
def field_help(path: str, default: str) -> str:
    """A field's help text; the rewards help names the domains registered now."""
    return FIELD_HELP.get(path, default).replace("{domains}", ", ".join(domains()))


FIELD_HELP: dict[str, str] = {
    "model": "A local directory that exists on this host and the workers (a checkpoint with config.json), or a hub id such as org/model.",
    "rewards": "YAML list of reward functions: - name: math_accuracy (weight: 1.0, params: {...}, domains: [math]). "
               "Domains: {domains}; K-12 answers: k12_judge and/or k12_learned.",
    "repeat_times": "Completions per task: GRPO and MIX compare them within the group, so at least 2 (4–8 is usual).",
    "total_steps": "Train steps (explore steps in explore-only mode); the run is finished after these.",
    "sync_interval": "A new model version every this many train steps.",
    "max_staleness": "Async mode: how many versions the explorer may run ahead of the trainer.",
    "train_batch_size": "Experiences per trainer step.",
    "explore_batch_size": "Tasks per explore step (each gives repeat_times completions).",
    "engine": "transformers works everywhere; vllm is faster where it is installed.",
}
# Values the new-run form fills in when the algorithm changes (static/rftweb/newrun.js),
# for fields the person has not edited.
def algorithm_defaults() -> dict[str, dict[str, str]]:
    """Each registered algorithm's form values (its declaration's `form_defaults`)."""
    return {a.name: dict(a.form_defaults) for a in algorithms()}


def config_warnings(*, config: object) -> list[str]:
    """Configs that are valid but cannot learn (or learn nothing from people)."""
    cfg = config_validate(data=config)
    out: list[str] = []
    group_relative = algorithm_get(cfg.algorithm).group_relative
    for i, term in enumerate(cfg.rewards):
        if term.weight == 0:
            out.append(f"reward {term.name} (rewards.{i}) has weight 0: it never changes the reward.")
    if group_relative and cfg.feedback.mode == "auto" and not any(t.weight for t in cfg.rewards):
        out.append(f"{cfg.algorithm} with no weighted reward and feedback mode auto: every completion scores 0, "
                   "so every advantage is 0 and the model learns nothing. Add a reward or let people rate (blend / human).")
    if group_relative and cfg.sampling.temperature == 0:
        out.append(f"{cfg.algorithm} with temperature 0: a group's completions are identical, so advantages are 0.")
    if cfg.feedback.mode == "blend" and cfg.feedback.w_human == 0:
        out.append("feedback mode blend with w_human 0: people's ratings do not change the reward.")
    if cfg.mode == "explore":
        out.append("explore mode writes experiences but never trains the model.")
    return out
