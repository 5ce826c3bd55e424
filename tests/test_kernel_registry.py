"""The one registry shape (kernel/registry.py) that every registry of the project uses:
declarations by name, built-ins loaded from their modules on first use, the same declaration
again a no-op and a different one under a taken name an error. Pure: no Django, no database."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kernel.registry import Registry
from kernel.rewards import DOMAINS, REWARDS, RewardResult, domain_register, register, reward_get


@dataclass(frozen=True)
class Record:
    name: str
    weight: float


def test_the_same_record_again_is_a_no_op_and_a_different_one_is_refused() -> None:
    registry: Registry[Record] = Registry(what="record", package="kernel", builtin=())
    registry.add("a", Record("a", 1.0))
    registry.add("a", Record("a", 1.0))
    with pytest.raises(ValueError, match="record 'a' is registered twice"):
        registry.add("a", Record("a", 2.0))
    assert registry.entries() == [Record("a", 1.0)]
    with pytest.raises(ValueError, match="unknown record 'b'; known: a"):
        registry.get("b")


def test_built_ins_load_once_from_their_modules_on_first_use() -> None:
    registry: Registry[Record] = Registry(what="record", package="kernel", builtin=("no_such_module",))
    with pytest.raises(ModuleNotFoundError):
        registry.names()
    registry.builtin = ()
    registry.add("x", Record("x", 0.5))
    assert registry.names() == ["x"]


def _one(completion: str, task: object, **_: object) -> RewardResult:
    return RewardResult(score=1.0)


def _other(completion: str, task: object, **_: object) -> RewardResult:
    return RewardResult(score=0.0)


def test_a_reward_or_domain_registered_twice_differently_is_refused() -> None:
    """The kernel's reward and domain registries keep the old rules: one function per reward
    name, one route per domain name; the built-in plugins are loaded by name."""
    assert reward_get("exact_match").where == "inline"
    register("kernel_test_one")(_one)
    register("kernel_test_one")(_one)
    domain_register("kernel_test", terms={"kernel_test_one": 1.0})
    try:
        with pytest.raises(ValueError, match="reward 'kernel_test_one' is registered twice"):
            register("kernel_test_one")(_other)
        with pytest.raises(ValueError, match="reward domain 'kernel_test' is registered twice"):
            domain_register("kernel_test", terms={"kernel_test_one": 0.5})
    finally:
        REWARDS.remove("kernel_test_one")
        DOMAINS.remove("kernel_test")
    with pytest.raises(KeyError, match="unknown reward 'kernel_test_one'"):
        reward_get("kernel_test_one")


def test_the_reward_plugins_are_discovered_by_their_module_names() -> None:
    """No list names the reward modules: every apps/rewards/*_rules.py is imported, and each
    built-in domain's rewards are registered."""
    assert REWARDS.discovered() == ["builtin_rules", "code_rules", "k12_rules", "math_rules", "remote_rules",
                                    "vision_rules"]
    assert {"math", "code", "k12"} <= {route.name for route in DOMAINS.entries()}
    assert {"exact_match", "math_accuracy", "k12_judge"} <= set(REWARDS.names())
