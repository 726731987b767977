"""Which ranks share a node: the Topology arithmetic, detection across real ranks (node ids
exchanged, the launcher's word checked against them), and the fingerprint that carries it."""

from __future__ import annotations

import pytest
from topology_jobs import detect_as

from autotune.comm.launch import run_local
from autotune.comm.topology import Topology
from autotune.storage import fingerprint


def test_topology_lists_nodes_in_order_of_their_lowest_rank() -> None:
    topo = Topology((0, 1, 0, 2, 1))
    assert topo.nodes == 3 and topo.size == 5
    assert topo.members == ((0, 2), (1, 4), (3,))
    assert topo.ranks_per_node == (2, 2, 1)
    assert [topo.local_index(r) for r in range(5)] == [0, 0, 1, 0, 1]
    assert topo.describe() == "3 nodes: 2+2+1 ranks"
    assert Topology((0, 0, 1, 1)).describe() == "2 nodes x 2 ranks"
    assert Topology.flat(3).describe() == "1 node x 3 ranks"


def test_topology_refuses_nodes_numbered_out_of_order() -> None:
    with pytest.raises(ValueError, match="lowest rank"):
        Topology((1, 0))
    with pytest.raises(ValueError, match="lowest rank"):
        Topology((0, 2, 1))


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("node_ids", "node_of", "per_node"),
    [
        (["a", "a", "b", "b"], (0, 0, 1, 1), "2"),
        (["x", "y", "x", "y"], (0, 1, 0, 1), "2"),  # a launcher that interleaves nodes
        (["n0", "n0", "n1", "n1", "n2"], (0, 0, 1, 1, 2), "2+2+1"),
        (["only", "only", "only"], (0, 0, 0), "3"),
    ],
)
def test_ranks_learn_their_nodes_from_each_others_ids(
    node_ids: list[str], node_of: tuple[int, ...], per_node: str
) -> None:
    n = len(node_ids)
    got = run_local(detect_as, n, node_ids, None)
    for seen, warned, fp, cached in got:
        assert seen == node_of
        assert not warned
        assert cached
        assert fp["nodes"] == max(node_of) + 1
        assert fp["ranks_per_node"] == per_node
        assert fp["world_size"] == n


@pytest.mark.distributed
def test_hosts_win_over_a_launcher_that_disagrees_and_say_so() -> None:
    # Two torchrun agents on one host: GROUP_RANK says two nodes, the ids say one.
    got = run_local(detect_as, 4, ["h", "h", "h", "h"], [0, 0, 1, 1])
    for seen, warned, fp, _ in got:
        assert seen == (0, 0, 0, 0)
        assert fp["nodes"] == 1
        assert len(warned) == 1
        assert "GROUP_RANK puts ranks on 2 nodes x 2 ranks" in warned[0]
        assert "hosts say 1 node x 4 ranks" in warned[0]


@pytest.mark.distributed
def test_agreeing_launcher_is_quiet() -> None:
    got = run_local(detect_as, 4, ["h0", "h0", "h1", "h1"], [0, 0, 1, 1])
    assert all(seen == (0, 0, 1, 1) and not warned for seen, warned, _, _ in got)


def test_fingerprint_keeps_nodes_and_ranks_per_node_apart() -> None:
    even = fingerprint(backend="gloo", world_size=4, nodes=2, device="cpu", dtype="float32")
    assert even["ranks_per_node"] == "2"
    one_node = fingerprint(backend="gloo", world_size=4, nodes=1, device="cpu", dtype="float32")
    assert one_node != even
    with pytest.raises(ValueError, match="do not split evenly"):
        fingerprint(backend="gloo", world_size=5, nodes=2, device="cpu", dtype="float32")
