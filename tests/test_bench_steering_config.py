"""bench/steering's arms start from the product's defaults and change only what they print
(issue 62.1): each arm's run config, validated, equals kernel.config's defaults (a config
naming nothing but its model) with the overrides the bench printed at its start, read back
from that print, field by field; every printed override says why."""

from __future__ import annotations

import ast
import json
import re

import pytest

from bench.steering.config import ARMS, Override, arm_config, overrides_print
from kernel.config import config_dump, config_validate
from kernel.jsontypes import JSON

LINE = re.compile(r"^    (?P<path>[a-z_.]+) = (?P<value>.+)  \((?P<reason>[^()]*(?:\([^()]*\)[^()]*)*)\)$")
MODEL = "/models/demo"


def _arm(arm: str, *, verifier: bool = False) -> tuple[dict[str, object], list[Override]]:
    return arm_config(arm, model=MODEL, steps=30, tasks=8, repeat=8, seed=1, lr=1e-4, beta=0.6, verifier=verifier)


def _print(arms: list[str], *, verifier: bool = False) -> None:
    overrides_print(arms, model=MODEL, steps=30, tasks=8, repeat=8, seed=1, lr=1e-4, beta=0.6, verifier=verifier)


def _printed(text: str) -> dict[str, dict[str, JSON]]:
    """The print read back: each section's title and its overrides (path: value)."""
    sections: dict[str, dict[str, JSON]] = {}
    title = ""
    for line in text.splitlines()[1:]:
        if line.startswith("  ") and not line.startswith("    "):
            title = line.strip().rstrip(":")
            sections[title] = {}
            continue
        match = LINE.match(line)
        assert match, f"not an override line: {line!r}"
        assert match["reason"].strip(), f"{match['path']} has no reason"
        value: JSON = ast.literal_eval(match["value"])
        sections[title][match["path"]] = value
    return sections


def _leaves(tree: JSON, prefix: str = "") -> dict[str, JSON]:
    """Each field of a dumped config by its dotted path (a list is one field)."""
    if isinstance(tree, dict):
        out: dict[str, JSON] = {}
        for key, value in tree.items():
            out.update(_leaves(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): tree}


def _defaults_with(overrides: dict[str, JSON]) -> dict[str, JSON]:
    """kernel.config's defaults (the config of the printed model alone) with `overrides` set."""
    config = config_dump(config_validate(data={"model": overrides["model"]}))
    for path, value in overrides.items():
        *parents, leaf = path.split(".")
        node = config
        for key in parents:
            child = node[key]
            assert isinstance(child, dict), path
            node = child
        node[leaf] = value
    return _leaves(config_dump(config_validate(data=config)))


@pytest.mark.parametrize("verifier", [False, True])
@pytest.mark.parametrize("arm", [*ARMS, "auto", "format"])
def test_an_arms_config_is_the_defaults_with_its_printed_overrides_field_by_field(
    arm: str, verifier: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    _print([arm], verifier=verifier)
    printed = _printed(capsys.readouterr().out)
    config, _ = _arm(arm, verifier=verifier)

    made = _leaves(config_dump(config_validate(data=config)))
    expected = _defaults_with(printed["every arm"] | printed[arm])

    assert made.keys() == expected.keys()
    assert {path: (made[path], expected[path]) for path in made if made[path] != expected[path]} == {}
    defaults = _leaves(config_dump(config_validate(data={"model": MODEL})))
    unprinted = {path for path in made if made[path] != defaults[path]} - set(printed["every arm"] | printed[arm])
    assert unprinted == set()


def test_the_print_of_several_arms_gives_each_arm_the_shared_overrides_and_its_own(
    capsys: pytest.CaptureFixture[str],
) -> None:
    arms = [*ARMS, "format"]
    _print(arms)
    printed = _printed(capsys.readouterr().out)

    assert set(printed) == {"every arm", *arms}
    assert "feedback.mode" not in printed["every arm"]  # the arms differ there
    for arm in arms:
        _, overrides = _arm(arm)
        assert printed["every arm"] | printed[arm] == {o.path: o.value for o in overrides}


def test_the_learned_arms_take_the_products_active_selection_and_print_only_arrival_order(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Active selection is the product's default since issue 62: an rm10 arm sets nothing for it,
    # and its run hands out by the reward model's uncertainty with a fifth at random.
    _print(["rm10"])
    printed = _printed(capsys.readouterr().out)["every arm"]
    config, _ = _arm("rm10")
    selection = config_validate(data=config).feedback.selection

    assert not [path for path in printed if path.startswith("feedback.selection.") and path != "feedback.selection.pairs"]
    assert (selection.uncertainty, selection.random_share) == (1.0, 0.2)
    assert printed["reward_model.retrain_every"] == 16

    # --selection arrival (the old default) is an override, printed with its reason.
    overrides_print(["rm10"], model=MODEL, steps=30, tasks=8, repeat=8, seed=1, lr=1e-4, beta=0.6, selection="arrival")
    arrival = _printed(capsys.readouterr().out)["every arm"]
    assert arrival["feedback.selection.uncertainty"] == 0.0
    assert arrival["feedback.selection.random_share"] == 0.0


@pytest.mark.parametrize("steps", [None, 12])
def test_the_live_benchs_people_run_is_the_defaults_with_its_overrides_and_the_demo_runs_length(
    steps: int | None,
) -> None:
    """bench/live_steering's people run: the product's defaults with the overrides it prints,
    field by field; without --steps it runs as long as the demo run `rft_demo` makes, and says so."""
    from apps.cli.management.commands.rft_demo import DEMO_TOTAL_STEPS
    from bench.live_steering import live_config

    config, overrides = live_config(model=MODEL, steps=steps or DEMO_TOTAL_STEPS, seed=0)
    made = _leaves(config_dump(config_validate(data=config)))
    printed: dict[str, JSON] = json.loads(json.dumps({o.path: o.value for o in overrides}))  # as a config file holds them
    expected = _defaults_with(printed)
    assert made.keys() == expected.keys()
    assert {path: (made[path], expected[path]) for path in made if made[path] != expected[path]} == {}
    (length,) = [o for o in overrides if o.path == "total_steps"]
    assert length.value == (steps or 40)
    assert length.reason == ("the demo run's own length (rft_demo --total-steps)" if steps is None else "--steps")
