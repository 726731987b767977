"""The baselines plugin, tested the way any third-party algorithm would be: found through its entry
points, then put through autotune's shared conformance suite."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

from autotune.algorithms import ENTRY_POINT_GROUP, PLUGIN_SOURCES, available
from autotune.testing.pytest_algorithms import AlgorithmTests


def test_registered_through_entry_points() -> None:
    names = {
        ep.name
        for ep in entry_points(group=ENTRY_POINT_GROUP)
        if ep.dist is not None and ep.dist.name == "autotune-baselines"
    }
    assert names == {"direct", "star"}
    assert {"direct", "star"} <= set(available())
    assert PLUGIN_SOURCES["star"].startswith("autotune-baselines")


@pytest.mark.distributed
class TestDirect(AlgorithmTests):
    """The shared conformance suite at a prime world size, one test id per case."""

    algorithm = "direct"
    world_sizes = (5,)


@pytest.mark.distributed
class TestStar(AlgorithmTests):
    algorithm = "star"
    world_sizes = (5,)
