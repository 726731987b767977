"""Every registered algorithm, plugins included, passes the conformance suite at N = 1..8.

Real ranks on gloo over 127.0.0.1; each result is checked against the exact sum of every rank's
input within a proven floating-point bound, and all ranks must agree bitwise.
"""

from __future__ import annotations

import functools

import pytest
import torch

from autotune.testing.conformance import (
    Case,
    Outcome,
    algorithms_under_test,
    cases,
    error_bound,
    failures,
    run_conformance,
)

WORLD_SIZES = [1, 2, 3, 4, 5, 8]
ALGORITHMS = algorithms_under_test()


@functools.cache
def outcomes(world_size: int) -> tuple[Outcome, ...]:
    # One world per size runs every algorithm: starting ranks is the expensive part.
    return tuple(run_conformance(world_size, ALGORITHMS))


def test_plugins_are_among_the_algorithms_under_test() -> None:
    # If the baselines plugin were not installed, the suite would quietly test fewer algorithms.
    assert {"native", "ring", "tree", "two_tree", "direct", "star"} <= set(ALGORITHMS)
    assert {"hierarchical_ring", "hierarchical_two_tree"} <= set(ALGORITHMS)
    assert "nccl.ring.simple" in ALGORITHMS  # NCCL's combinations, on gloo: one for all


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_conformance(algorithm: str, world_size: int) -> None:
    mine = [o for o in outcomes(world_size) if o.algorithm == algorithm]
    assert len(mine) == world_size * len(cases(world_size))
    problems = failures(mine)
    assert not problems, "\n".join(problems[:20])


#: Node layouts (each rank's node) one host cannot have, named through AUTOTUNE_NODE_ID: 3 x 2,
#: 2 x 3, uneven, a node with one rank, nodes interleaved in rank order.
LAYOUTS = [(0, 0, 1, 1, 2, 2), (0, 0, 0, 1, 1, 1), (0, 0, 1, 1, 1), (0, 1, 1, 1), (0, 1, 0, 1)]
#: The algorithms whose schedule depends on the layout.
TOPOLOGY_AWARE = ["hierarchical_ring", "hierarchical_two_tree"]


@pytest.mark.distributed
@pytest.mark.parametrize("node_of", LAYOUTS, ids=lambda n: "".join(map(str, n)))
def test_topology_aware_conformance_across_node_layouts(node_of: tuple[int, ...]) -> None:
    got = run_conformance(len(node_of), TOPOLOGY_AWARE, node_of=node_of)
    assert len(got) == len(node_of) * len(cases(len(node_of))) * len(TOPOLOGY_AWARE)
    problems = failures(got)
    assert not problems, "\n".join(problems[:20])


def test_cases_cover_the_edge_cases() -> None:
    for n in WORLD_SIZES:
        sizes = {c.numel for c in cases(n)}
        assert {0, 1, n + 1, 2 * n + 3} <= sizes
        assert any(s > 10_000 for s in sizes)
        assert {c.dtype for c in cases(n)} == {
            torch.float32,
            torch.float64,
            torch.float16,
            torch.bfloat16,
        }
        assert any(c.segment_bytes is not None and c.segment_bytes % 2 for c in cases(n))
        assert any(c.cols > 1 for c in cases(n))


def test_bound_is_tight_enough_to_catch_one_lost_rounding() -> None:
    # fp16 at 4 ranks: three roundings of 2^-11 each; an error of 4 roundings must not pass.
    magnitude = torch.tensor([1.0], dtype=torch.float64)
    bound = float(error_bound(magnitude, torch.float16, 4))
    u = 2.0**-11
    assert 3 * u <= bound < 3.01 * u


@pytest.mark.distributed
def test_suite_catches_broken_algorithms() -> None:
    # Both are registered in the ranks from tests/jobs/broken_algorithms.py, like a plugin would be.
    extra = {
        "loses_last_element": "broken_algorithms:LosesLastElement",
        "own_input_first": "broken_algorithms:OwnInputFirst",
    }
    case_list = [Case(1001, torch.float16), Case(1001, torch.float32)]
    got = run_conformance(3, list(extra), case_list=case_list, extra=extra)
    lost = failures([o for o in got if o.algorithm == "loses_last_element"])
    assert any("off the exact sum" in p for p in lost), lost
    unordered = failures([o for o in got if o.algorithm == "own_input_first"])
    # Within the error bound (the sums are right), but not the same bits everywhere.
    assert unordered and all("ranks disagree bitwise" in p for p in unordered), unordered
