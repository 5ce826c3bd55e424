"""Smoke tests of the benches that had none: each runs end to end on tiny sizes, against a
database and a Redis database beside the tests', and prints its ratio line with a number.
The figures are the benches' business (bench/, never timed here); what a smoke catches is a
bench that no longer runs: bench/env_api had stopped at import for rounds (its settings module
extends rftweb.settings, which then read Celery's schedule half-loaded) without anyone seeing.

The benches with smokes beside this module: learning, vs_trl, conductor_beat, trainer_memory,
weight_sync. Without one: rollout (vLLM's start alone is a
minute; its engine paths are tested in tests/workers). Steering's scripted rater is tested in
tests/feedback/test_steering_rater.py, and one step of it below, with a rater from a file
outside the repository (`--rater`)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.bench, pytest.mark.slow, pytest.mark.django_db]

NUMBER = r"(\d+\.\d+)"
# The steering bench's held-out problems in its smokes (`--heldout`; 200 measure): sampling the
# 200 four times for the base and again for each arm was most of a smoke's time (800 samples,
# ~19 s of CPU a model on the 2-core host), and 20 run the same code.
HELDOUT = "20"

# name, tiny arguments, the ratio line's pattern (its number is the bench's result)
SMOKES = [
    ("buffer_claim", ("--rows", "3000", "--claims", "3", "--size", "64"),
     rf"^rows 3,000: cost ratio {NUMBER} \(target <= 1\.5\).*duplicates 0 \(target 0\)"),
    ("buffer_claim_lease", ("--rows", "3000", "--pairs", "3", "--claims", "3", "--rounds", "1", "--size", "64"),
     r"^duplicates over all: 0 of "),
    ("buffer_write", ("--rows", "500", "--batch", "100"), rf"^ratio experience_write / COPY = {NUMBER} "),
    ("pipeline", ("--batches", "2", "--batch-groups", "2", "--rounds", "1"), rf"^ratio {NUMBER}$"),
    ("trainer_overhead", ("--steps", "2", "--hidden", "32", "--layers", "1", "--batch", "4", "--group", "2",
                          "--response", "8"),
     rf"^trainer_overhead ratio \(our train_step / bare TRL step\): {NUMBER} median"),
    ("env_api", ("--seconds", "0.5", "--rounds", "1", "--concurrency", "2"),
     rf"^ratio \(API/baseline submissions/s, target >= 0\.5\): {NUMBER}$"),
    ("live_stream", ("--clients", "4", "--rate", "20", "--seconds", "1", "--client-procs", "1"),
     r"^live_stream: 4 clients at 20 events/s: .* 0 lost"),
    # A few problems sampled, 16 of them held out (the measurement samples all 256 and holds 96
    # out: sampling them and the held-out pairs' features were most of a smoke's time). 48
    # labels: 6 groups, so that some answer in them is right and there are pairs to train on.
    ("reward_model", ("--labels", "48", "--bases", "policy", "--seeds", "0", "--epochs", "1", "--kinds", "likelihood",
                      "--problems", "24", "--heldout-groups", "16"),
     rf"^reward model held-out pairwise accuracy at 48 labels: {NUMBER} with likelihood/policy"),
    # The drawn family's labels, the default kind beside the mlp one (issue 47 item 3).
    ("reward_model", ("--labels", "24", "--bases", "policy", "--seeds", "0", "--kinds", "head,mlp", "--raters",
                      "generated:2", "--max-tokens", "32", "--problems", "20", "--heldout-groups", "16"),
     rf"^reward model held-out pairwise accuracy at 24 labels: {NUMBER} with (?:head|mlp)/policy"),
    ("openai_worker_cpu", ("--calls", "4", "--warm", "1", "--tokens", "4"),
     rf"^worker CPU ms per call \(engine stubbed\): {NUMBER}$"),
    ("openai_endpoint", ("--clients", "2", "--requests", "1", "--rounds", "1", "--tokens", "4"),
     rf"^endpoint p50 / engine p50 \(median of 1 rounds\): {NUMBER} "),
    ("door_costs", ("--people", "3", "--runs", "1", "--groups", "6", "--walkers", "2"),
     rf"^door_costs: the annotation doors' CPU ms p50 \(page / next items / label / counts\): {NUMBER} / {NUMBER} / "
     rf"{NUMBER} / {NUMBER}; statements \d+"),
    ("web_load", ("--people", "5", "--seconds", "8", "--ramp", "1", "--think", "0.5", "--env-interval", "0.5",
                  "--processes", "2", "--tasks", "40", "--seed-groups", "10", "--after", "3"),
     rf"^web_load verdict \(5 people, 8 s, p99 {NUMBER} ms, {NUMBER} req/s\): 0 5xx met; every viewer every event met"),
    ("label_timing", ("--steps", "6", "--seeds", "0", "--arms", "before", "after"),
     rf"^label_timing ratio \(after / before share of labels in time\): {NUMBER} "),
    ("async_vs_sync", ("--steps", "2", "--tasks", "2", "--repeat", "2", "--max-tokens", "4", "--pairs", "1"),
     rf"^async_vs_sync speed-up \(sync seconds / async seconds, max_staleness 2\): {NUMBER} \(load "),
    ("rm_latency", ("--rounds", "1", "--every", "4", "--open", "4"),
     rf"^rm_latency: last label of a retraining batch to the new version's first score: median {NUMBER} s"),
    ("sharding", ("--layers", "2", "--hidden", "64", "--intermediate", "128", "--vocab", "512", "--batch", "4",
                  "--prompt", "8", "--completion", "8", "--steps", "2"),
     rf"^sharding peak per rank / one process: {NUMBER} \(target <= 0\.65"),
]


@pytest.mark.parametrize(("name", "args", "pattern"), SMOKES,
                         ids=[s[0] + ("-family" if "--raters" in s[1] else "") for s in SMOKES])
def test_the_bench_runs_on_tiny_sizes_and_prints_its_ratio(
    bench: Callable[..., Any], name: str, args: tuple[str, ...], pattern: str,
) -> None:
    out = bench(name, *args, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    matches = [m for m in (re.search(pattern, line) for line in out.stdout.splitlines()) if m]
    assert matches, out.stdout[-2000:]
    for number in matches[-1].groups():
        assert float(number) > 0


RATER_FILE = '''
from pathlib import Path

CALLS = Path(__file__).with_name("calls.log")


def likes_tags(prompt: str, completion: str) -> int:
    """Prefers answers in <answer> tags; writes down every call."""
    with CALLS.open("a") as log:
        log.write(repr((prompt[-30:], completion)) + "\\n")
    return 5 if "<answer>" in completion else 2
'''


def test_steering_rates_by_a_rater_from_a_file_outside_the_repository(
    bench: Callable[..., Any], tmp_path: Any,
) -> None:
    """`--rater PATH:FUNCTION` with a file nowhere near the checkout: the bench's raters rate
    every handed-out item by it, and the preferred share it reads off the model is printed."""
    from tests.conftest import _ROOT

    mine = tmp_path / "elsewhere" / "my_rater.py"
    mine.parent.mkdir()
    mine.write_text(RATER_FILE)
    assert _ROOT not in mine.resolve().parents
    # With the run's verifier kept beside people, its arm without people to read against, and
    # a KL penalty toward the base model in both.
    out = bench("steering", "--steps", "1", "--seeds", "0", "--arms", "all,format", "--tasks", "2", "--repeat", "2",
                "--rater", f"{mine}:likes_tags", "--verifier", "on", "--beta", "0.1", "--heldout", HELDOUT, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    # Each arm's row ends with the share of sampled answers without an `<answer>`, its seconds and load.
    assert re.search(rf"^all +0 .* {NUMBER} +\d+ +{NUMBER}$", out.stdout, re.M) and " untag " in out.stdout, \
        out.stdout[-2000:]
    assert re.search(r"rater .*my_rater\.py:likes_tags \(noise 0\): preferred share gain per arm \(base "
                     rf"{NUMBER}\): all [-+]\d\.\d+, format [-+]\d\.\d+", out.stdout), out.stdout[-2000:]
    assert re.search(r"^beyond `format` \(what people taught\): all [-+]\d\.\d+", out.stdout, re.M), out.stdout[-2000:]
    calls = (mine.parent / "calls.log").read_text().splitlines()
    # The held-out problems sampled before and after, and the 4 rollouts `all` rated.
    assert len(calls) >= 2 * int(HELDOUT) + 4
    assert any("What is" in line for line in calls)


def test_steering_runs_a_generated_family_of_preferences(bench: Callable[..., Any]) -> None:
    """`--raters generated:2`: two drawn preferences, each written out, `format` run once for the
    seed (it has no people) and read by both, each learned arm's reward model per step, and the
    family's distribution per target."""
    from bench.raters import preference_draw

    out = bench("steering", "--raters", "generated:2", "--steps", "1", "--seeds", "0", "--arms", "all,rm10,format",
                "--tasks", "2", "--repeat", "2", "--heldout", HELDOUT, timeout=1200)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    for seed in (0, 1):
        assert f"preference {preference_draw(seed).describe()}" in out.stdout, out.stdout[-2000:]
    assert len(re.findall(r"^  format s0 step +1 ", out.stdout, re.M)) == 1, out.stdout[-3000:]
    assert len(re.findall(r"^  rm10 s0 step +1 ", out.stdout, re.M)) == 2
    assert re.search(r"^      gate .* groups rm \d+/\d+ signal \d+ .* labels .* pairs apart \d+ alike \d+$", out.stdout,
                     re.M), out.stdout[-3000:]
    for rater in ("generated:0", "generated:1"):
        assert re.search(rf"^{rater} +format +0 ", out.stdout, re.M) and re.search(rf"^{rater} +rm10 +0 ", out.stdout,
                                                                                  re.M), out.stdout[-3000:]
        assert re.search(rf"^rater {rater} \(noise [\d.]+\): preferred share gain per arm", out.stdout, re.M)
    assert re.search(r"^family: 2 drawn preferences x 1 seeds = 2 pairs, 1 steps .*load", out.stdout, re.M)
    assert re.search(r"^  rm10 - format sampled arithmetic: median [-+]\d\.\d+, 25th percentile [-+]\d\.\d+, worst "
                     r"[-+]\d\.\d+ \(generated:\d seed 0: generated:\d: .*\); met \d/2 pairs", out.stdout, re.M), \
        out.stdout[-3000:]
    assert re.search(r"^family verdict: rm10/all median .* on \d+ pairs; seeds 0, 1 steps, load", out.stdout, re.M)


def test_a_rater_that_is_not_there_stops_the_steering_bench_naming_the_flag(tmp_path: Any) -> None:
    from tests.conftest import _ROOT

    (tmp_path / "r.py").write_text("def rate(prompt, completion):\n    return 3\n")
    for spec, message in ((f"{tmp_path}/r.py:missing", "has no function 'missing'"),
                          (f"{tmp_path}/nope.py:rate", "no file"), ("no_such_module_xyz:rate", "cannot import"),
                          ("bench.raters", "expected MODULE:FUNCTION")):
        out = subprocess.run([sys.executable, "-m", "bench.steering", "--rater", spec], cwd=_ROOT,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and "--rater" in out.stderr and message in out.stderr, (spec, out.stderr[-500:])


def test_the_steering_bench_refuses_a_verifier_beside_the_correctness_rater() -> None:
    """The rater's own answer key in the run's rewards: nothing would be learned from people."""

    from tests.conftest import _ROOT

    out = subprocess.run([sys.executable, "-m", "bench.steering", "--rater", "bench.raters:correct", "--verifier", "on"],
                         cwd=_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--verifier on with the correctness rater" in out.stderr, out.stderr[-500:]


def test_the_steering_bench_refuses_a_demo_model_with_no_bare_answers() -> None:
    """`--demo-styled` is the share of styled warm-up answers: all of them would leave `concise`
    nothing to amplify, and a share is not above 1."""

    from tests.conftest import _ROOT

    for share in ("1", "-0.5"):
        out = subprocess.run([sys.executable, "-m", "bench.steering", "--demo-styled", share],
                             cwd=_ROOT, capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and "--demo-styled is a share" in out.stderr, (share, out.stderr[-500:])


def test_the_steering_bench_refuses_a_negative_kl_weight() -> None:
    from tests.conftest import _ROOT

    out = subprocess.run([sys.executable, "-m", "bench.steering", "--beta", "-0.1"],
                         cwd=_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--beta is a KL weight" in out.stderr, out.stderr[-500:]


def test_the_demo_teach_bench_labels_in_a_browser_and_prints_both_runs_preference_share(
    bench: Callable[..., Any],
) -> None:
    """`make run`'s demo as a new user meets it, tiny: a person in Chromium labels a few items
    by the guidelines' preference, every label lands, and both runs' shares are printed; then
    three simulated voters vote blind through the API on version 0 against each run's newest."""
    out = bench("demo_teach", "--steps", "2", "--labels", "4", "--feedback-wait", "10", "--minutes", "8",
                "--blind-votes", "3", timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    counts = re.search(r"labels given (\d+), stored (\d+)", out.stdout)
    assert counts is not None, out.stdout[-2000:]
    assert int(counts.group(1)) == int(counts.group(2)) == 4
    assert re.search(rf"^demo_teach: working share {NUMBER} -> people {NUMBER} vs without people {NUMBER} "
                     r"\(difference [+-]\d+\.\d+\); gain people [+-]\d+\.\d+, without people [+-]\d+\.\d+, "
                     r"gain difference [+-]\d+\.\d+; load ", out.stdout, re.MULTILINE), out.stdout[-2000:]
    # Both runs' newest versions against version 0, read exactly on the 200 held-out problems;
    # each change is the difference of the figures printed beside it.
    for what in (r"expected accuracy on all 200 held-out problems \(exact\)",
                 r"sampled arithmetic on all 200 held-out problems \(8 answers each\)"):
        read = re.search(rf"^demo_teach: {what}: v0 {NUMBER} -> people v\d+ {NUMBER} \(([+-]\d+\.\d+)\), twin v\d+ "
                         rf"{NUMBER} \(([+-]\d+\.\d+)\)", out.stdout, re.MULTILINE)
        assert read is not None, (what, out.stdout[-2000:])
        v0, people, people_change, twin, twin_change = (float(x) for x in read.groups())
        assert 0 < v0 < 1 and people_change == pytest.approx(people - v0, abs=1.1e-3)
        assert twin_change == pytest.approx(twin - v0, abs=1.1e-3)
    assert re.search(rf"^demo_teach: untagged share of those sampled answers: v0 {NUMBER}, people v\d+ {NUMBER}, "
                     rf"twin v\d+ {NUMBER}$", out.stdout, re.MULTILINE), out.stdout[-2000:]
    split = rf"{NUMBER}; (?:{NUMBER}|-) / (?:{NUMBER}|-)"
    assert re.search(rf"^demo_teach: those answers in / out of the working style \(share; arithmetic in / out\): "
                     rf"v0 {split}, people v\d+ {split}, twin v\d+ {split}$", out.stdout, re.MULTILINE), out.stdout[-2000:]
    assert re.search(r"^the demo model: recipe \d+, weights sha256 [0-9a-f]{12}, built with ", out.stdout,
                     re.MULTILINE), out.stdout[-2000:]
    # The reward model's probe, per train step of the people run, and both runs' style shares.
    assert re.search(r"^reward model per train step, run #\d+ \(gate \w+", out.stdout, re.MULTILINE), out.stdout[-2000:]
    assert len(re.findall(r"^run #\d+ rollouts by model version: working share", out.stdout, re.MULTILINE)) == 2
    # The blind votes: every pair voted (3 prompts x 3 pairs, and the planted checks), and a
    # line per run with its win rate, interval, votes, direction check and the votes ±0.1 needs.
    cast = re.search(r"^blind votes: evaluation \d+, (\d+) votes cast by 3 voters \((\d+) planted checks\)",
                     out.stdout, re.MULTILINE)
    assert cast is not None and int(cast.group(1)) == 9 + int(cast.group(2)), out.stdout[-2000:]
    decimal = r"\d+\.\d+"
    rows = re.findall(rf"^blind (people|without people) (?:run \d+ )?v\d+ vs v0: win rate {decimal} "
                      rf"\[{decimal}, {decimal}\] over 3 votes \((?:better|worse|too few)[^)]*\); share moved "
                      r"[+-]\d+\.\d+.*; ±0\.1 needs \d+ votes$", out.stdout, re.MULTILINE)
    assert sorted(rows) == ["people", "without people"], out.stdout[-2000:]


def test_a_demo_teach_stopped_by_sigterm_stops_its_database_and_removes_its_folder(demo_model_dir: Path) -> None:
    """A bench killed mid-run (a timeout, a person's kill) cleans up as an error would: before,
    the demo's private PostgreSQL kept running and its folder stayed in /tmp."""
    root = Path(__file__).resolve().parents[2]
    # A short folder of its own (the private PostgreSQL's socket path has a length limit).
    tmp = Path(tempfile.mkdtemp(prefix="dt-", dir="/tmp"))
    env = {**os.environ, "BENCH_DEMO_DIR": str(demo_model_dir), "TMPDIR": str(tmp), "PYTHONPATH": str(root)}
    try:
        proc = subprocess.Popen([sys.executable, "-m", "bench.demo_teach", "--steps", "2", "--labels", "2",
                                 "--blind-votes", "0", "--minutes", "8"], cwd=root, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:  # the demo's database is up and its runs made
            seen.append(line)
            if line.startswith("demo runs (seed 0)"):
                break
        assert proc.poll() is None, "".join(seen)[-2000:]
        assert list(tmp.glob("rft-demo-teach-*")), "the bench's folder is where TMPDIR says"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=180) == 143
        assert not list(tmp.glob("rft-demo-teach-*"))
        assert not _processes_naming(str(tmp))
    finally:
        for pid, _ in _processes_naming(str(tmp)):  # a failed run's leftovers, not the next test's
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)


def _processes_naming(text: str) -> list[tuple[int, str]]:
    """(pid, command line) of the running processes whose command line names `text`."""
    found = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            line = path.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # it ended while we looked
            continue
        if text in line:
            found.append((int(path.parent.name), line))
    return found
