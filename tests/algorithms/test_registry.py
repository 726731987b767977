"""The registry: a plain dict, `register`, and plugins from `autotune.algorithms` entry points."""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

import pytest

from autotune.algorithms import (
    ALGORITHMS,
    BUILTINS,
    ENTRY_POINT_GROUP,
    PLUGIN_SOURCES,
    RingAllReduce,
    _registry,
    available,
    get_algorithm,
    register,
)


class SlowRing(RingAllReduce):
    name = "slow_ring"


def test_builtins_are_registered_under_their_names() -> None:
    for cls in BUILTINS:
        assert ALGORITHMS[cls.name] is cls
    assert {"native", "ring", "tree", "two_tree"} <= set(ALGORITHMS)


def test_baselines_load_through_the_entry_point_group() -> None:
    # The plugin distribution is installed (make test installs it); its algorithms arrive only
    # through importlib.metadata entry points, exactly as a third party's would.
    eps = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    assert eps["direct"].value == "autotune_baselines.direct:DirectAllReduce"
    assert eps["star"].value == "autotune_baselines.star:StarAllReduce"
    assert "direct" in available()
    assert type(get_algorithm("direct")).__module__ == "autotune_baselines.direct"
    assert type(get_algorithm("star")).__module__ == "autotune_baselines.star"
    assert PLUGIN_SOURCES["direct"].startswith("autotune-baselines ")


@pytest.mark.usefixtures("clean_registry")
def test_register_and_get() -> None:
    register("slow_ring", SlowRing)
    algo = get_algorithm("slow_ring", timeout_s=5)
    assert isinstance(algo, SlowRing)
    assert algo.timeout_s == 5
    register("slow_ring", SlowRing)  # the same class again is fine


@pytest.mark.usefixtures("clean_registry")
def test_register_refuses_to_rebind_silently() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register("ring", SlowRing)
    register("ring", SlowRing, replace=True)
    assert ALGORITHMS["ring"] is SlowRing


@pytest.mark.parametrize("name", ["", "has space", "-leading", None])
def test_register_checks_the_name(name: object) -> None:
    with pytest.raises(ValueError, match="algorithm name"):
        register(name, SlowRing)  # type: ignore[arg-type]


def test_register_checks_the_class() -> None:
    with pytest.raises(TypeError, match="AllReduceAlgorithm"):
        register("not_an_algorithm", dict)  # type: ignore[arg-type]


@pytest.mark.usefixtures("clean_registry")
def test_a_broken_plugin_warns_and_does_not_stop_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broken = EntryPoint("broken", "no_such_module_anywhere:Algo", ENTRY_POINT_GROUP)
    good = EntryPoint("good", f"{__name__}:SlowRing", ENTRY_POINT_GROUP)
    clash = EntryPoint("ring", f"{__name__}:SlowRing", ENTRY_POINT_GROUP)
    monkeypatch.setattr(_registry, "entry_points", lambda group: [broken, good, clash])
    _registry._loaded[0] = False
    with pytest.warns(RuntimeWarning) as caught:
        names = available()
    messages = [str(w.message) for w in caught]
    assert any("could not load algorithm 'broken'" in m for m in messages)
    assert any("'ring', which already exists" in m for m in messages)
    assert "good" in names and "broken" not in names
    assert ALGORITHMS["ring"] is RingAllReduce  # a plugin cannot replace a built-in
    with pytest.raises(RuntimeError, match="failed to load") as info:
        get_algorithm("broken")
    assert isinstance(info.value.__cause__, ModuleNotFoundError)
