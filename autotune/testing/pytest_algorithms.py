"""The conformance suite as a pytest base class: a plugin author subclasses it, names the algorithm,
and gets one test id per (world size, case), as Optuna's sampler tests do for samplers.

Example::

    # tests/test_my_star.py
    from autotune.testing.pytest_algorithms import AlgorithmTests

    class TestMyStar(AlgorithmTests):
        algorithm = "my_star"
        world_sizes = (2, 5)

Each world size starts its ranks once (gloo over 127.0.0.1) and runs every case there; each case
is then its own test, failing with the ranks' complaints about that case alone.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import ClassVar

import pytest

from autotune.algorithms import available
from autotune.testing.conformance import Outcome, cases, failures, run_conformance

__all__ = ["AlgorithmTests"]


@functools.cache
def _outcomes(
    algorithm: str, world_size: int, extra: tuple[tuple[str, str], ...]
) -> tuple[Outcome, ...]:
    return tuple(run_conformance(world_size, [algorithm], extra=dict(extra)))


class AlgorithmTests:
    """Subclass, set `algorithm` (a registered name) and, if you like, `world_sizes`."""

    #: The registered name of the algorithm under test.
    algorithm: ClassVar[str]
    #: World sizes to run at: one, a power of two, an odd and a prime one by default.
    world_sizes: ClassVar[tuple[int, ...]] = (1, 2, 3, 5)
    #: Algorithms to register in the ranks first, name -> "module:Class" (importable there), for
    #: one that is not installed through an entry point.
    extra: ClassVar[Mapping[str, str]] = {}

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """One parameter per (world size, case), with the case in its id."""
        if "conformance_case" not in metafunc.fixturenames:
            return
        params: list[tuple[int, int]] = []
        ids: list[str] = []
        for n in self.world_sizes:
            for index, case in enumerate(cases(n)):
                params.append((n, index))
                ids.append(f"{n}ranks-{index:02d}-{case}".replace(" ", "-"))
        metafunc.parametrize("conformance_case", params, ids=ids)

    def test_conformance(self, conformance_case: tuple[int, int]) -> None:
        world_size, index = conformance_case
        case = cases(world_size)[index]
        extra = tuple(sorted(self.extra.items()))
        mine = [o for o in _outcomes(self.algorithm, world_size, extra) if o.case == case]
        assert len(mine) == world_size, f"{world_size} ranks, {len(mine)} outcomes for {case}"
        problems = failures(mine)
        assert not problems, "\n".join(problems)

    def test_is_registered(self) -> None:
        assert self.algorithm in available() or self.algorithm in self.extra, (
            f"{self.algorithm!r} is neither registered nor named in `extra`"
        )
