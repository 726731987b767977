"""A wrong name is said with the nearest right one, wherever autotune checks names."""

from __future__ import annotations

import subprocess
import sys

import pytest

from autotune.algorithms import get_algorithm_class
from autotune.config import Config
from autotune.sweep import SweepOptions
from autotune.util.names import nearest, unknown


def test_the_nearest_name_is_offered_only_when_it_is_near() -> None:
    names = ["ring", "tree", "two_tree", "native"]
    assert nearest("rng", names) == "ring" and nearest("twotree", names) == "two_tree"
    assert nearest("fastest", names) is None
    assert unknown("algorithm", ["rng"], names) == "unknown algorithm 'rng' (did you mean 'ring'?)"
    assert unknown("algorithm", ["rng", "fastest"], names) == (
        "unknown algorithms 'rng' (did you mean 'ring'?), 'fastest'"
    )


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: Config(algorithm="rng"), "unknown algorithm 'rng' (did you mean 'ring'?)"),
        (lambda: Config(algorithms=("ring", "tre")), "'tre' (did you mean 'tree'?)"),
        (lambda: Config.from_env({"AUTOTUNE_ALGORITHM": "rng"}), "did you mean 'ring'?"),
        (lambda: get_algorithm_class("rng"), "unknown algorithm 'rng' (did you mean 'ring'?)"),
        (lambda: SweepOptions(algorithms=("rign",)), "'rign' (did you mean 'ring'?)"),
    ],
)
def test_every_place_that_checks_an_algorithm_name_suggests_the_nearest(make, words) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError) as info:
        make()
    assert words in str(info.value)


def test_the_model_command_suggests_the_nearest_algorithm() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "autotune.cli", "model", "--algorithms", "rign,tree"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode != 0
    assert "unknown algorithm 'rign' (did you mean 'ring'?): no model for it" in out.stderr
