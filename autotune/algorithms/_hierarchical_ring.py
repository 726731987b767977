"""Hierarchical ring all-reduce: reduce inside each node, ring across nodes, gather inside nodes.

Across nodes only one ring per shard runs, so each node puts 2(n-1)/n of the data on its link
to the others (n nodes), against 2(N-1)/N for the flat ring over all N ranks: the scheme of
Horovod's hierarchical all-reduce and of NCCL's rings across nodes (seed 003).
"""

from __future__ import annotations

import torch

from autotune.algorithms._base import AllReduceAlgorithm
from autotune.algorithms._ring import ring_rounds
from autotune.algorithms._transport import Recv, Round, Send, Transport, segments, split
from autotune.comm import topology
from autotune.comm.groups import Comm

__all__ = ["HierarchicalRingAllReduce", "hierarchical_rounds"]

# One tag per phase: a pair of ranks may talk in two phases, and gloo matches by tag and order.
_REDUCE, _ACROSS, _GATHER = 0, 1, 2

#: The most pieces a message is cut into (one per segment, at most this many), so that the links
#: between nodes carry one piece while the others are reduced or gathered inside the nodes.
PIPELINE = 4


class HierarchicalRingAllReduce(AllReduceAlgorithm):
    """Reduce-scatter inside each node, one ring per shard across nodes, all-gather inside nodes.

    The buffer is cut into S shards, S the fewest ranks any node has; the k-th rank of every node
    owns shard k. Inside a node every rank sends each owner its part of that owner's shard (one
    round, pipelined by segments); owners of one shard then ring-all-reduce it across the nodes;
    each owner sends its finished shard back to its node's other ranks. Every element is summed
    on one rank and copied, so all ranks end bitwise identical. On one node, or where every
    node has a single rank, it is the flat ring.

    A message of several segments is cut into up to `PIPELINE` pieces, each run as above, one
    reduce phase apart: while a piece crosses the slow links, the next is reduced inside the
    nodes and the one before it gathered, so the links wait for neither.
    """

    name = "hierarchical_ring"
    flat_twin = "ring"

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        topo = topology.detect(comm.group, comm.timeout)
        rounds = hierarchical_rounds(topo, comm.rank, buf.numel(), segment_elems)
        Transport(buf, comm).run(rounds)


def hierarchical_rounds(
    topo: topology.Topology, rank: int, numel: int, segment_elems: int
) -> list[Round]:
    """``rank``'s rounds of a hierarchical ring all-reduce of ``numel`` elements on ``topo``.

    Round t of every rank holds the matching halves of the same messages (NCCL runs a round as
    one batch), so phases are padded to their longest shard. Pieces (`PIPELINE`) start one
    reduce phase apart; a round then holds one phase of each piece under way, on disjoint
    elements (the transport orders a batch's operations alike on both sides).
    """
    if topo.nodes in (1, topo.size):  # nothing to gather inside nodes, or nothing across
        return ring_rounds(range(topo.size), rank, (0, numel), segment_elems)
    pieces = max(1, min(PIPELINE, numel // segment_elems))
    merged: list[tuple[list[Send], list[Recv]]] = []
    start = 0
    for a, b in split(0, numel, pieces):
        reduce, across, gather = _phases(topo, rank, a, b, segment_elems)
        for t, (sends, recvs) in enumerate(reduce + across + gather, start):
            if t == len(merged):
                merged.append(([], []))
            merged[t][0].extend(sends)
            merged[t][1].extend(recvs)
        start += len(reduce)  # the same on every rank: the schedule's shape is global
    return [(sends, recvs) for sends, recvs in merged]


def _phases(
    topo: topology.Topology, rank: int, lo: int, hi: int, segment_elems: int
) -> tuple[list[Round], list[Round], list[Round]]:
    """``rank``'s reduce, across and gather rounds for elements ``lo:hi``."""
    members = topo.members
    node = members[topo.node_of[rank]]
    mine = topo.local_index(rank)
    owners = min(len(m) for m in members)
    shards = split(lo, hi, owners)
    pieces = [segments(a, b, segment_elems) for a, b in shards]
    depth = max(len(p) for p in pieces)

    reduce: list[Round] = []
    gather: list[Round] = []
    for j in range(depth):
        to_owners = [
            Send(node[s], *pieces[s][j], channel=_REDUCE)
            for s in range(owners)
            if s != mine and j < len(pieces[s])
        ]
        from_owners = [
            Recv(node[s], *pieces[s][j], reduce=False, channel=_GATHER)
            for s in range(owners)
            if s != mine and j < len(pieces[s])
        ]
        own = pieces[mine][j : j + 1] if mine < owners else []
        peers = [p for p in node if p != rank]
        reduce.append(
            (to_owners, [Recv(p, *seg, reduce=True, channel=_REDUCE) for p in peers for seg in own])
        )
        gather.append(([Send(p, *seg, channel=_GATHER) for p in peers for seg in own], from_owners))

    # A ring of n ranks takes 2(n-1) steps of its longest chunk's segments; shards differ in
    # length by at most one element, so their rings by at most one segment per step.
    n = topo.nodes
    across_len = (
        2
        * (n - 1)
        * max(len(segments(a, b, segment_elems)) for shard in shards for a, b in split(*shard, n))
    )
    across: list[Round] = [((), ())] * across_len
    if mine < owners:
        ring = [m[mine] for m in members]
        own_ring = ring_rounds(ring, rank, shards[mine], segment_elems, channel=_ACROSS)
        across[: len(own_ring)] = own_ring
    return reduce, across, gather
