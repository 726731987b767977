"""The baselines plugin, tested the way any third-party algorithm would be: found through its entry
points, then put through autotune's shared conformance suite."""

from __future__ import annotations

from importlib.metadata import entry_points

from autotune.algorithms import ENTRY_POINT_GROUP, PLUGIN_SOURCES, available
from autotune.testing.conformance import failures, run_conformance


def test_registered_through_entry_points() -> None:
    names = {
        ep.name
        for ep in entry_points(group=ENTRY_POINT_GROUP)
        if ep.dist is not None and ep.dist.name == "autotune-baselines"
    }
    assert names == {"direct", "star"}
    assert {"direct", "star"} <= set(available())
    assert PLUGIN_SOURCES["star"].startswith("autotune-baselines")


def test_conformance_at_a_prime_world_size() -> None:
    outcomes = run_conformance(5, ["direct", "star"])
    assert len(outcomes) > 0
    problems = failures(outcomes)
    assert not problems, "\n".join(problems[:20])
