"""The hierarchical ring's schedule, checked on every rank at once: every send meets its receive
in the same round (NCCL runs a round as one batch), each element is summed on exactly one rank,
and each node puts 2(n-1)/n of the data on its link, against 2(N-1)/N for the flat ring."""

from __future__ import annotations

from collections import Counter

import pytest

from autotune.algorithms import Round, split
from autotune.algorithms._hierarchical_ring import hierarchical_rounds
from autotune.algorithms._ring import ring_rounds
from autotune.comm.topology import Topology

LAYOUTS = [
    (0, 0, 1, 1),  # 2 nodes x 2
    (0, 0, 0, 1, 1, 1),  # 2 x 3
    (0, 0, 1, 1, 2, 2),  # 3 x 2
    (0, 0, 1, 1, 1),  # uneven
    (0, 1, 1, 1),  # a node with one rank
    (0, 1, 0, 1),  # interleaved
    (0, 1, 2, 3),  # one rank per node: the flat ring
    (0, 0, 0),  # one node: the flat ring
]


def schedules(topo: Topology, numel: int, segment: int) -> list[list[Round]]:
    return [hierarchical_rounds(topo, r, numel, segment) for r in range(topo.size)]


@pytest.mark.parametrize("node_of", LAYOUTS)
@pytest.mark.parametrize(("numel", "segment"), [(1, 4), (5, 2), (1000, 64), (997, 1000)])
def test_every_send_meets_its_receive_in_the_same_round(
    node_of: tuple[int, ...], numel: int, segment: int
) -> None:
    topo = Topology(node_of)
    everyone = schedules(topo, numel, segment)
    assert len({len(s) for s in everyone}) == 1, "ranks disagree on the number of rounds"
    for t in range(len(everyone[0])):
        sent = Counter(
            (r, s.peer, s.start, s.stop, s.channel)
            for r in range(topo.size)
            for s in everyone[r][t][0]
        )
        received = Counter(
            (v.peer, r, v.start, v.stop, v.channel)
            for r in range(topo.size)
            for v in everyone[r][t][1]
        )
        assert sent == received, f"round {t}"


@pytest.mark.parametrize("node_of", LAYOUTS)
def test_each_element_is_summed_on_one_rank_per_step_of_the_reduction(
    node_of: tuple[int, ...],
) -> None:
    # Follow every element: the set of ranks whose input it holds, per rank, through the rounds.
    topo = Topology(node_of)
    numel = 37
    everyone = schedules(topo, numel, 5)
    holds = [[{r} for _ in range(numel)] for r in range(topo.size)]
    for t in range(len(everyone[0])):
        before = [[set(h) for h in mine] for mine in holds]
        for r in range(topo.size):
            for v in everyone[r][t][1]:
                for e in range(v.start, v.stop):
                    incoming = before[v.peer][e]
                    if v.reduce:
                        assert not holds[r][e] & incoming, "a contribution added twice"
                        holds[r][e] |= incoming
                    else:
                        holds[r][e] = set(incoming)
    for r in range(topo.size):
        assert all(h == set(range(topo.size)) for h in holds[r]), f"rank {r} misses inputs"


def node_link_bytes(topo: Topology, rounds: list[list[Round]]) -> list[int]:
    out = [0] * topo.nodes
    for r, mine in enumerate(rounds):
        for sends, _ in mine:
            for s in sends:
                if topo.node_of[s.peer] != topo.node_of[r]:
                    out[topo.node_of[r]] += s.stop - s.start
    return out


@pytest.mark.parametrize(
    ("node_of", "nodes"), [((0, 0, 1, 1), 2), ((0, 0, 0, 1, 1, 1), 2), ((0, 0, 1, 1, 2, 2), 3)]
)
def test_each_node_sends_two_n_minus_one_over_n_of_the_data_across(
    node_of: tuple[int, ...], nodes: int
) -> None:
    topo = Topology(node_of)
    numel = 6 * 1000
    hier = node_link_bytes(topo, schedules(topo, numel, 100))
    assert hier == [2 * (nodes - 1) * numel // nodes] * nodes
    flat = [ring_rounds(range(topo.size), r, (0, numel), 100) for r in range(topo.size)]
    n = topo.size
    # Ranks of a node are consecutive: the flat ring leaves each node by one rank's link.
    assert node_link_bytes(topo, flat) == [2 * (n - 1) * numel // n] * nodes


def test_one_node_and_one_rank_per_node_are_the_flat_ring() -> None:
    for node_of in [(0, 0, 0), (0, 1, 2)]:
        topo = Topology(node_of)
        for r in range(3):
            assert hierarchical_rounds(topo, r, 100, 7) == ring_rounds(range(3), r, (0, 100), 7)


def test_shards_follow_the_smallest_node() -> None:
    # 2+1 ranks: one shard, owned by each node's first rank; the second rank only contributes.
    topo = Topology((0, 0, 1))
    rounds = hierarchical_rounds(topo, 1, 10, 100)
    sends = [s for r in rounds for s in r[0]]
    assert [(s.peer, s.start, s.stop) for s in sends] == [(0, 0, 10)]
    assert split(0, 10, 1) == [(0, 10)]


def test_pieces_cross_the_links_while_others_are_reduced_inside_the_nodes() -> None:
    topo = Topology((0, 0, 1, 1))
    piece = hierarchical_rounds(topo, 0, 1000, 1000)  # one segment: one piece
    pieces = hierarchical_rounds(topo, 0, 4000, 1000)  # four segments: four pieces
    crossing = [({topo.node_of[s.peer] != topo.node_of[0] for s in sends}) for sends, _ in pieces]
    # Some round sends across the link and inside the node at once: the phases overlap.
    assert any(kinds == {True, False} for kinds in crossing)
    assert len(pieces) < 4 * len(piece)
    # Four rounds a piece (reduce, two ring steps, gather), each piece one round after the last.
    assert (len(piece), len(pieces)) == (4, 7)
