"""Property-based tests (hypothesis) of the config and taskset parsers (issue 20): whatever
JSON, YAML or bytes arrive, the answer is a clean refusal (ConfigInvalid / ImportFailed,
naming where) or a stored value equal to the input, read back from Postgres; never another
exception."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from apps.buffer.importers import ImportFailed, taskset_import
from apps.buffer.models import Task
from kernel.config import ConfigInvalid, config_parse
from apps.runs.models import Run
from apps.runs.services import run_create
from tests.factories import make_user

pytestmark = pytest.mark.django_db

PROPERTY = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Text with everything Postgres refuses: NUL and lone surrogates (category Cs).
any_text = st.text(st.characters(codec=None, categories=None), max_size=12) | st.sampled_from(["", "a\x00b", "\ud800", "é", "2024-01-01"])
any_number = (st.integers() | st.integers(min_value=-(2**80), max_value=2**80)
              | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([1e400, -1e400, 2**63, 2**63 - 1]))
scalars = st.none() | st.booleans() | any_number | any_text
# Nesting up to a few levels, plus the odd very deep list.
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
                           max_leaves=20) | st.integers(min_value=60, max_value=400).map(lambda n: json.loads("[" * n + "]" * n))


def _storable(value: Any) -> bool:
    """What the hygiene accepts: finite numbers, text without NUL or lone surrogates,
    string keys, at most 64 levels."""
    def walk(v: Any, depth: int) -> bool:
        if depth > 64:
            return False
        if isinstance(v, bool) or v is None:
            return True
        if isinstance(v, float):
            return math.isfinite(v)
        if isinstance(v, int):
            return True
        if isinstance(v, str):
            return "\x00" not in v and not any(0xD800 <= ord(c) <= 0xDFFF for c in v)
        if isinstance(v, list):
            return all(walk(x, depth + 1) for x in v)
        return all(walk(k, depth + 1) and walk(x, depth + 1) for k, x in v.items())
    return walk(value, 0)


def _equal(a: Any, b: Any) -> bool:
    # JSON has no int/float distinction once stored: 1 and 1.0 are the same number.
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, float) or isinstance(b, float):
        # jsonb keeps a number as the decimal JSON wrote: 7.205759403792163e+16 comes back
        # as the integer 72057594037921630, which is the same double.
        return isinstance(a, int | float) and isinstance(b, int | float) and float(a) == float(b)
    return a == b


def _config_with(extra: Any) -> dict[str, Any]:
    # exact_match takes any further params, so arbitrary JSON has a place to be stored.
    return {"model": "local/demo", "repeat_times": 4, "rewards": [{"name": "exact_match", "params": {"extra": extra}}]}


def _store(config: Any, owner: Any) -> dict[str, Any]:
    run = run_create(name="prop", owner=owner, config=config)
    return Run.objects.get(pk=run.pk).config


@PROPERTY
@given(extra=json_values)
def test_arbitrary_json_in_a_config_file_is_refused_or_stored_as_given(extra: Any) -> None:
    owner = make_user()
    text = json.dumps(_config_with(extra), allow_nan=True)
    try:
        config = config_parse(text=text.encode("utf-8", "surrogatepass"), filename="c.json")
    except ConfigInvalid as exc:
        event("refused")
        assert exc.errors and not _storable(extra) or "nested" in str(exc) or "digit" in str(exc), exc.errors
        return
    event("stored")
    assert _storable(extra)
    assert _equal(_store(config, owner)["rewards"][0]["params"]["extra"], extra)


@PROPERTY
@given(extra=json_values)
def test_arbitrary_yaml_in_a_config_file_is_refused_or_stored_as_given(extra: Any) -> None:
    owner = make_user()
    try:
        text = yaml.safe_dump(_config_with(extra), allow_unicode=True)
    except (yaml.YAMLError, UnicodeEncodeError, RecursionError):
        assume(False)
    try:
        config = config_parse(text=text.encode("utf-8", "surrogatepass"), filename="c.yaml")
    except ConfigInvalid as exc:
        event("refused")
        assert exc.errors
        return
    event("stored")
    assert _storable(extra)
    assert _equal(_store(config, owner)["rewards"][0]["params"]["extra"], extra)


@PROPERTY
@given(data=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_arbitrary_bytes_as_a_config_file_are_refused_or_a_valid_config(data: bytes) -> None:
    for filename in ("c.yaml", "c.json"):
        try:
            config_parse(text=data, filename=filename)
        except ConfigInvalid as exc:
            assert exc.errors and all(isinstance(m, str) and m for m in exc.errors.values())


@PROPERTY
@given(records=st.lists(st.fixed_dictionaries({"prompt": any_text, "extra": json_values}), min_size=1, max_size=3))
def test_arbitrary_json_records_are_imported_as_given_or_refused_naming_the_line(records: list[dict[str, Any]], tmp_path_factory: Any) -> None:
    path = Path(tmp_path_factory.mktemp("import")) / "tasks.jsonl"
    path.write_bytes(b"\n".join(json.dumps(r, allow_nan=True).encode("utf-8", "surrogatepass") for r in records))
    before = Task.objects.count()
    try:
        taskset = taskset_import(name="prop", path=path)
    except ImportFailed as exc:
        event("refused")
        assert str(exc).startswith("line ")
        assert Task.objects.count() == before  # nothing written
        assert not all(_storable(r) and r["prompt"] for r in records)
        return
    event("stored")
    stored = list(Task.objects.filter(taskset=taskset).order_by("index"))
    assert len(stored) == len(records)
    for task, record in zip(stored, records, strict=True):
        assert task.prompt == record["prompt"]
        assert _equal(task.metadata["extra"], record["extra"])


@PROPERTY
@given(data=st.binary(min_size=1, max_size=300))
def test_arbitrary_bytes_as_a_taskset_are_refused_or_imported(data: bytes, tmp_path_factory: Any) -> None:
    path = Path(tmp_path_factory.mktemp("import")) / "tasks.jsonl"
    path.write_bytes(data)
    try:
        taskset_import(name="bytes", path=path)
    except ImportFailed as exc:
        assert str(exc)


@PROPERTY
@given(reward=st.none() | any_number | json_values, extra=json_values, prompt=st.text(max_size=20) | any_text)
def test_arbitrary_json_in_an_api_trajectory_is_a_4xx_or_stored_as_given(reward: Any, extra: Any, prompt: str) -> None:
    from apps.buffer.models import Experience
    from tests.envapi.conftest import Api, make_key
    from tests.factories import make_run

    run = make_run(owner=make_user())
    _, raw = make_key(run, rate=1_000_000)
    body = {"trajectories": [{"key": "k", "prompt": prompt, "response": "r", "reward": reward, "metadata": {"x": extra}}]}
    response = Api(raw).post(f"/runs/{run.pk}/trajectories",
                             raw=json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass"))
    if response.status_code != 200:
        event("refused")
        assert response.status_code in (400, 422), response.content
        assert not Experience.objects.filter(run=run).exists()
        return
    event("stored")
    stored = Experience.objects.get(run=run)
    assert _storable(reward) and not isinstance(reward, bool) and isinstance(reward, int | float | None)
    assert _equal(stored.metadata["x"], extra) and stored.prompt_text == prompt


form_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30) | st.sampled_from(
    ["nan", "inf", "-Infinity", "1e400", "true", "[*a]", "&a [1]", "{", "- - - -", "9" * 5000, "0x10", " 3 "])


@PROPERTY
@given(data=st.data())
def test_arbitrary_text_in_the_run_forms_is_never_a_500_and_what_is_stored_validates(data: Any) -> None:
    from django.test import Client

    from kernel.config import config_validate
    from apps.control.forms import config_field_specs, feedback_field_specs
    from tests.factories import make_run

    owner = make_user()
    client = Client()
    client.force_login(owner)
    specs = config_field_specs()
    chosen = data.draw(st.lists(st.sampled_from(specs), min_size=1, max_size=4, unique_by=lambda s: s.path))
    post = {"name": "prop", "model": "local/demo", "rewards": "[{name: exact_match}]"}
    post.update({spec.path: data.draw(form_text) for spec in chosen})
    response = client.post("/runs/new/", post)
    assert response.status_code in (302, 400), response.status_code
    event("created" if response.status_code == 302 else "refused")
    for run in Run.objects.filter(owner=owner):
        config_validate(data=run.config)  # what was stored is a valid config

    run = make_run(owner=owner)
    fields = {spec.path: data.draw(form_text) for spec in data.draw(st.lists(st.sampled_from(feedback_field_specs()), min_size=1, max_size=3))}
    response = client.post(f"/runs/{run.pk}/feedback-settings/", {"confirm": "yes", **fields})
    assert response.status_code < 500
    run.refresh_from_db()
    config_validate(data=run.config)
