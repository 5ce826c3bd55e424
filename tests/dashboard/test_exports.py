"""Exports: the rows TRL reads, loadable with `datasets`, in bounded memory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
from django.db import connection

from apps.feedback.training_data import (
    ExportOptions,
    export_hf_dataset,
    export_jsonl,
    export_rows,
)
from apps.buffer.services import experience_write
from apps.runs.models import Run
from tests.factories import experience_row, make_experiences, make_run, make_user
from kernel.exceptions import ExportFailed
from tests.servers import ROOT, child_env

pytestmark = pytest.mark.django_db


def test_sft_rows_are_conversations_ending_in_the_models_answer(run: Run) -> None:
    make_experiences(run, groups=2, group_size=3)
    rows = list(export_rows(run=run, export_format="sft", options=ExportOptions(min_reward=2.0)))
    assert len(rows) == 2  # one reward-2 completion per group
    for row in rows:
        assert [m["role"] for m in row["messages"]] == ["user", "assistant"]
        assert row["messages"][0]["content"] == "What is 1 + 1?"


def test_sft_keeps_chat_prompts_and_expert_corrections(run: Run) -> None:
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    experience_write(experiences=[
        experience_row(run, key="a", messages=chat, response_text="4", reward=0.0),
        experience_row(run, key="b", response_text="corrected", reward=0.0, is_expert=True, source="human"),
        experience_row(run, key="c", response_text="wrong", reward=0.0),
        experience_row(run, key="d", response_text="waiting", reward=None, status="pending"),
    ])
    rows = list(export_rows(run=run, export_format="sft"))
    assert [r["messages"][-1]["content"] for r in rows] == ["4", "corrected", "wrong"]
    assert rows[0]["messages"][:2] == chat
    only_good = list(export_rows(run=run, export_format="sft", options=ExportOptions(min_reward=0.5)))
    assert [r["messages"][-1]["content"] for r in only_good] == ["corrected"]


def test_dpo_pairs_the_best_and_worst_of_each_group(run: Run) -> None:
    rows = [experience_row(run, key=f"g1-{i}", group="g1", response_text=f"g1 answer {i}", reward=r)
            for i, r in enumerate([0.2, 0.9, 0.5])]
    rows += [experience_row(run, key=f"g2-{i}", group="g2", response_text="same", reward=1.0) for i in range(2)]
    rows += [experience_row(run, key="g3-0", group="g3", response_text="alone", reward=1.0)]
    experience_write(experiences=rows)
    pairs = list(export_rows(run=run, export_format="dpo"))
    assert pairs == [{
        "prompt": [{"role": "user", "content": "What is 1 + 1?"}],
        "chosen": [{"role": "assistant", "content": "g1 answer 1"}],
        "rejected": [{"role": "assistant", "content": "g1 answer 0"}],
    }]
    assert list(export_rows(run=run, export_format="dpo", options=ExportOptions(min_margin=0.8))) == []


def test_dpo_also_exports_what_people_chose_in_ab_comparisons(run: Run) -> None:
    from apps.feedback.kinds.pairwise import feedback_compare

    a, b, c = make_experiences(run, groups=1, group_size=3)  # rewards 0, 1, 2: best c, worst a
    pending = make_experiences(run, groups=1, group_size=2, status="pending")
    # A person prefers the lower-reward b over c; the (c, a) choice repeats the reward pair.
    feedback_compare(run=run, author=run.owner, experience=b, other=c, winner="a")
    feedback_compare(run=run, author=run.owner, experience=a, other=c, winner="b")
    feedback_compare(run=run, author=run.owner, experience=pending[0], other=pending[1], winner="a")
    pairs = [(p["chosen"][0]["content"], p["rejected"][0]["content"]) for p in export_rows(run=run, export_format="dpo")]
    texts = {e.pk: e.response_text for e in (a, b, c)}
    assert pairs == [(texts[c.pk], texts[a.pk]), (texts[b.pk], texts[c.pk])]


def test_grpo_prompt_sets_come_from_the_taskset(run: Run) -> None:
    rows = list(export_rows(run=run, export_format="grpo"))
    assert len(rows) == 4
    assert rows[1]["prompt"] == [{"role": "user", "content": "What is 1 + 1?"}]
    assert (rows[1]["answer"], rows[1]["domain"]) == ("2", "math")
    without = make_run(owner=run.owner, name="no tasks")
    with pytest.raises(ExportFailed, match="no taskset"):
        list(export_rows(run=without, export_format="grpo"))


def test_exports_load_with_datasets(run: Run, tmp_path: Path) -> None:
    make_experiences(run, groups=3, group_size=4)
    for fmt, expected in (("sft", 12), ("dpo", 3), ("grpo", 4)):
        result = export_jsonl(run=run, export_format=fmt, out=tmp_path / f"{fmt}.jsonl")
        assert result.rows == expected
        from_json = datasets.load_dataset("json", data_files=str(tmp_path / f"{fmt}.jsonl"), split="train",
                                          cache_dir=str(tmp_path / "cache"))
        hf = export_hf_dataset(run=run, export_format=fmt, out_dir=tmp_path / f"{fmt}-hf")
        from_disk = datasets.load_from_disk(str(tmp_path / f"{fmt}-hf"))
        assert hf.rows == len(from_disk) == len(from_json) == expected
        assert from_disk[0] == from_json[0]
    assert not list(tmp_path.glob(".export-cache-*"))  # the private cache is cleaned up


def test_a_failed_export_leaves_no_file(run: Run, tmp_path: Path) -> None:
    make_experiences(run, groups=1)
    with pytest.raises(ExportFailed, match="unknown export format"):
        export_jsonl(run=run, export_format="ppo", out=tmp_path / "x.jsonl")
    with pytest.raises(ExportFailed, match="no such directory"):
        export_jsonl(run=run, export_format="sft", out=tmp_path / "missing" / "x.jsonl")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep").write_text("x")
    with pytest.raises(ExportFailed, match="not empty"):
        export_hf_dataset(run=run, export_format="sft", out_dir=tmp_path / "full")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]


# Peak RSS (ru_maxrss) of a fresh process: growth over the export against the process's
# size before it. A non-streaming export of 200k rows holds a few hundred MB of row objects.
_MEASURE = """
import json, resource, sys, django
django.setup()
from apps.feedback.training_data import export_jsonl
from apps.runs.models import Run
run = Run.objects.get(pk=int(sys.argv[1]))
list(Run.objects.filter(pk=run.pk).values_list("config", flat=True))  # connection and caches warm
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = {"before_kb": before}
for fmt in ("sft", "dpo"):
    result = export_jsonl(run=run, export_format=fmt, out=sys.argv[2] + f"/{fmt}.jsonl")
    out[fmt] = {"rows": result.rows, "growth_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before}
print(json.dumps(out))
"""


def _fill(run: Run, n: int) -> None:
    """n experiences in groups of 4, written by Postgres itself (the export is under test,
    not the writer)."""
    with connection.cursor() as cur:
        cur.execute(
            """
            INSERT INTO buffer_experience (run_id, group_id, key, source, prompt_text, response_text, token_ids,
                prompt_length, finish_reason, reward, reward_parts, model_version, is_expert, status, filter_reason,
                priority, use_count, lease_owner, metadata, created_at)
            SELECT %s, 'g' || (i / 4), 'k' || i, 'explorer', 'What is ' || i || ' + ' || i || '? Show your work.',
                repeat('The answer is ' || (2 * i) || '. ', 8), '[]'::jsonb, 0, 'stop', (i %% 4)::float,
                '{}'::jsonb, 0, false, 'ready', '', 0, 0, '', '{}'::jsonb, now()
            FROM generate_series(0, %s - 1) AS i
            """,
            [run.pk, n],
        )


def _measure(run: Run, out: Path) -> dict:
    out.mkdir()
    result = subprocess.run([sys.executable, "-c", _MEASURE, str(run.pk), str(out)], cwd=ROOT, env=child_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# A memory bound measured at size (32 s of a quiet run): with the benches, `make test-bench`.
@pytest.mark.bench
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_200k_row_export_stays_within_a_fixed_memory_bound(tmp_path: Path) -> None:
    run = make_run(owner=make_user("owner"), name="big")
    _fill(run, 200_000)
    measured = _measure(run, tmp_path / "out")
    assert measured["sft"]["rows"] == 200_000 and measured["dpo"]["rows"] == 50_000
    assert sum(1 for _ in (tmp_path / "out" / "sft.jsonl").open()) == 200_000
    # The files hold tens of MB; the process grows by at most a fixed few MB for either.
    assert (tmp_path / "out" / "sft.jsonl").stat().st_size > 50 * 2**20
    for fmt in ("sft", "dpo"):
        assert measured[fmt]["growth_kb"] < 32 * 1024, measured


@pytest.mark.django_db(transaction=True)
def test_the_web_side_and_its_exports_never_import_torch_trl_or_transformers(run: Run, tmp_path: Path) -> None:
    make_experiences(run, groups=2)
    code = f"""
import sys, django
django.setup()
import rftweb.urls, rftweb.asgi, apps.control.views, apps.control.tasks, apps.cli.management.commands.rft
from apps.feedback.training_data import export_hf_dataset, export_jsonl
from apps.runs.models import Run
run = Run.objects.get(pk={run.pk})
export_hf_dataset(run=run, export_format="dpo", out_dir=sys.argv[1] + "/hf")
export_jsonl(run=run, export_format="sft", out=sys.argv[1] + "/sft.jsonl")
print(sorted(m for m in ("torch", "trl", "transformers", "vllm") if m in sys.modules))
"""
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, env=child_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
