"""The conformance suite as a pytest base class (`autotune.testing.pytest_algorithms`), run the way
a plugin author runs it: a subclass in a test file of its own, in a pytest of its own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autotune.testing.conformance import cases

pytestmark = pytest.mark.distributed

SUBCLASSES = """
from autotune.testing.pytest_algorithms import AlgorithmTests


class TestRing(AlgorithmTests):
    algorithm = "ring"
    world_sizes = (2,)


class TestLosesLastElement(AlgorithmTests):
    algorithm = "loses_last_element"
    world_sizes = (2,)
    extra = {"loses_last_element": "broken_algorithms:LosesLastElement"}
"""

JOBS = Path(__file__).parents[1] / "jobs"


def test_one_test_per_case_passing_for_a_correct_algorithm_failing_for_a_broken_one(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The broken algorithm is registered in the ranks from tests/jobs/, as a plugin's would be.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(JOBS), os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(test_mine=SUBCLASSES)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rf", timeout=300)
    n = len(cases(2))
    outcomes = result.parseoutcomes()
    # Per class: a case each and the registration check. The ring passes all of its own; the
    # broken one fails every case with an element (it never sums its last one) and passes the
    # empty ones.
    assert outcomes["passed"] + outcomes["failed"] == 2 * (n + 1)
    out = result.stdout.str()
    failed = [line for line in out.splitlines() if line.startswith("FAILED")]
    assert failed and all("TestLosesLastElement::test_conformance[2ranks-" in f for f in failed)
    assert (
        "TestLosesLastElement::test_conformance[2ranks-00-0xfloat32"
        not in out.split("short test summary")[-1]
    )
    assert outcomes["failed"] == sum(1 for c in cases(2) if c.numel > 0)
    # Each failure is the ranks' own complaint about that case.
    assert "loses_last_element" in out.split("FAILURES")[-1]
