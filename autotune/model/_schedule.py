"""Each algorithm's schedule, counted: rounds on the critical path and the busiest rank's load.

The counts follow the schedules the algorithms run (autotune/algorithms): the ring's 2(N-1)
steps of one chunk each, cut into segments; the trees' pipelined reduce then broadcast
(`autotune.algorithms._trees`), whose heights and fan-outs are read off the very trees they
build; the baselines' one or two rounds of whole buffers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from autotune.algorithms import Tree, binary_tree, double_binary_tree, node_double_binary_tree

__all__ = ["GLOO_MAX_SEGMENT_BYTES", "MODELLED", "Schedule", "bytes_sent", "schedule"]

#: The algorithms the model covers. ``native`` is gloo's: torch's CPU all-reduce on gloo runs
#: ``gloo::allreduce`` with its default algorithm, a ring (`GLOO_MAX_SEGMENT_BYTES`). NCCL's
#: native is NCCL's own choice of its ring and tree (`autotune.model.nccl_native`).
MODELLED = (
    "native",
    "ring",
    "tree",
    "two_tree",
    "hierarchical_ring",
    "hierarchical_two_tree",
    "direct",
    "star",
)


#: gloo's ring cuts each rank's chunk into segments of at most this (``kMaxSegmentSize`` in
#: gloo/allreduce.h, pytorch/gloo at 02947151), and into at least two, so that one is in flight
#: while the other is summed (gloo/allreduce.cc, ``ring``).
GLOO_MAX_SEGMENT_BYTES = 1 << 20


@dataclass(frozen=True)
class Schedule:
    """An all-reduce's critical path.

    ``rounds`` is how many rounds it takes, ``round_bytes`` what the busiest rank sends in one,
    ``reduce_rounds`` how many of them sum data and ``reduce_bytes`` what the busiest rank sums
    in one. ``chain_hops`` is the longest chain of messages that wait for each other (a message
    waits only for those it needs, not for a whole round; the pipeline's other rounds follow it
    one by one), and ``inter_hops`` of them cross nodes. ``local``: a further part that runs
    inside every node at once, on the node's own links (the hierarchical schedules' scatter to
    and gather from each node's shard owners); the fields above are then the part across nodes.
    """

    rounds: int
    round_bytes: float
    reduce_rounds: int
    reduce_bytes: float
    chain_hops: int = 0
    inter_hops: int = 0
    local: Schedule | None = None


def schedule(
    name: str, nbytes: int, ranks: int, segment_bytes: int, ranks_per_node: int | None = None
) -> Schedule:
    """The critical path of all-reducing ``nbytes`` over ``ranks`` with ``segment_bytes``, the
    ranks in order on nodes of ``ranks_per_node`` (None: one node)."""
    if ranks < 1 or nbytes < 0 or segment_bytes < 1:
        raise ValueError(
            f"need ranks >= 1, nbytes >= 0 and segment_bytes >= 1, got {ranks}, {nbytes}, "
            f"{segment_bytes}"
        )
    if name not in MODELLED:
        raise ValueError(f"no cost model for {name!r}; modelled: {', '.join(MODELLED)}")
    if ranks == 1 or nbytes == 0:
        return Schedule(0, 0.0, 0, 0.0)
    n = ranks
    per_node = n if ranks_per_node is None else min(ranks_per_node, n)
    nodes = math.ceil(n / per_node)
    if name == "ring":
        # Chunk c = S/N moves one step at a time: N-1 steps that sum, N-1 that copy, each cut
        # into the same number of segments (one round each).
        chunk = nbytes / n
        depth = max(1, math.ceil(chunk / segment_bytes))
        rounds = 2 * (n - 1) * depth
        # One chain per chunk: its 2(N-1) steps, each waiting for the one before.
        hops = _ring_inter_hops(n, per_node)
        return Schedule(rounds, chunk / depth, (n - 1) * depth, chunk / depth, 2 * (n - 1), hops)
    if name == "native":
        # gloo's ring: numSegments = max(ceil(S / max segment), 2N), rounded up to a multiple
        # of N; each of the 2(N-1) steps sends one chunk of numSegments / N segments.
        segments = max(math.ceil(nbytes / GLOO_MAX_SEGMENT_BYTES), 2 * n)
        segments = math.ceil(segments / n) * n
        return schedule("ring", nbytes, n, max(1, math.ceil(nbytes / segments)), ranks_per_node)
    if name == "hierarchical_ring":
        if nodes == 1 or per_node == 1:
            return schedule("ring", nbytes, n, segment_bytes, ranks_per_node)  # what it runs there
        return _hierarchical_ring(nbytes, n, segment_bytes, per_node)
    if name in ("tree", "two_tree", "hierarchical_two_tree"):
        trees = _trees(name, n, per_node)
        share = nbytes / len(trees)  # each tree carries its part
        k = max(1, math.ceil(share / segment_bytes))
        seg = share / k
        height = max(t.height[t.root] for t in trees)
        sends, sums = _fan(name, n, per_node)
        # Segment s leaves a rank of height h in round s + h and comes back down from the root
        # in round s + H + depth: k - 1 + 2H rounds in all, k - 1 + H of them going up (summing).
        rounds = k - 1 + 2 * height
        hops = 2 * max(_tree_inter_hops(t, per_node) for t in trees)
        return Schedule(rounds, seg * sends, k - 1 + height, seg * sums, 2 * height, hops)
    cross = 1 if nodes > 1 else 0
    if name == "direct":
        # Every rank sends its buffer to each of the N-1 others: N-1 messages, each a round of
        # its own (each pays a message's latency, at every scale), and sums N-1 buffers. No
        # message waits for another: the chain is one hop.
        return Schedule(n - 1, nbytes, n - 1, nbytes, 1, cross)
    # star: everyone to rank 0, which takes the N-1 buffers one message at a time, sums them,
    # and sends the sum back as N-1 messages: 2(N-1) rounds on rank 0's link.
    return Schedule(2 * (n - 1), nbytes, n - 1, nbytes, 2, 2 * cross)


def _hierarchical_ring(nbytes: int, n: int, segment_bytes: int, per_node: int) -> Schedule:
    """Across nodes, the owners' rings of one shard each (every hop crosses); inside each node,
    the scatter to the shard owners and the gather from them (`hierarchical_rounds`)."""
    nodes = math.ceil(n / per_node)
    owners = min(per_node, n - (nodes - 1) * per_node)  # shards follow the smallest node
    shard = nbytes / owners
    across = schedule("ring", math.ceil(shard), nodes, segment_bytes, 1)
    depth = max(1, math.ceil(shard / segment_bytes))
    seg = shard / depth
    # A scatter round and a gather round per segment of a shard: an owner sends its segment to
    # its node's per_node - 1 others (the busiest), and sums as many in the scatter.
    local = Schedule(2 * depth, (per_node - 1) * seg, depth, (per_node - 1) * seg, 2, 0)
    return Schedule(
        across.rounds,
        across.round_bytes,
        across.reduce_rounds,
        across.reduce_bytes,
        across.chain_hops,
        across.inter_hops,
        local,
    )


def bytes_sent(
    name: str, rank: int, ranks: int, nbytes: int, ranks_per_node: int | None = None
) -> float:
    """What ``rank`` sends in all, however it is segmented (the algorithms' `Traffic` counts),
    the ranks in order on nodes of ``ranks_per_node`` (None: one node)."""
    if name not in MODELLED:
        raise ValueError(f"no cost model for {name!r}; modelled: {', '.join(MODELLED)}")
    if not 0 <= rank < ranks:
        raise ValueError(f"rank must be in [0, {ranks}), got {rank}")
    n = ranks
    per_node = n if ranks_per_node is None else min(ranks_per_node, n)
    nodes = math.ceil(n / per_node)
    if n == 1:
        return 0.0
    if name == "hierarchical_ring" and 1 < nodes < n:
        owners = min(per_node, n - (nodes - 1) * per_node)
        shard = nbytes / owners
        local = rank % per_node
        node_size = min(per_node, n - (rank // per_node) * per_node)
        if local >= owners:  # contributes its part of every shard, owns none
            return owners * shard
        return (owners - 1) * shard + 2 * (nodes - 1) / nodes * shard + (node_size - 1) * shard
    if name in ("native", "ring", "hierarchical_ring"):  # native: gloo's ring
        return 2 * (n - 1) * nbytes / n
    if name == "direct":
        return (n - 1) * nbytes
    if name == "star":
        return (n - 1) * nbytes if rank == 0 else nbytes
    trees = _trees(name, n, per_node)
    share = nbytes / len(trees)
    # Up once to the parent (unless the root), down once to each child.
    return sum(share * ((t.parent[rank] is not None) + len(t.children[rank])) for t in trees)


def _ring_inter_hops(ranks: int, per_node: int) -> int:
    """Node crossings on the ring's longest chain: 2(N-1) consecutive hops of the ring 0 -> 1 ->
    ... -> N-1 -> 0, whose node boundaries (ranks in order, ``per_node`` a node) are crossed.

    Two laps less two hops cross every one of the n boundaries twice, less those among the two
    hops left out; the longest chain leaves out two hops inside a node where a node has three
    ranks or more (2n), one where it has two (2n - 1), none where every node has one (2n - 2).
    """
    nodes = math.ceil(ranks / per_node)
    if nodes == 1:
        return 0
    largest = min(per_node, ranks)
    return 2 * nodes - (0 if largest >= 3 else 1 if largest == 2 else 2)


def _tree_inter_hops(tree: Tree, per_node: int) -> int:
    """Node crossings on ``tree``'s longest root-to-leaf path (ranks in order on nodes)."""
    crossings = [0] * tree.size
    order = [tree.root]
    for r in order:
        for c in tree.children[r]:
            crossings[c] = crossings[r] + (c // per_node != r // per_node)
            order.append(c)
    return max(crossings)


@lru_cache(maxsize=64)
def _trees(name: str, ranks: int, per_node: int) -> tuple[Tree, ...]:
    if name == "tree":
        return (binary_tree(ranks),)
    if name == "hierarchical_two_tree":
        members = [list(range(a, min(a + per_node, ranks))) for a in range(0, ranks, per_node)]
        return node_double_binary_tree(members)
    return double_binary_tree(ranks)


@lru_cache(maxsize=64)
def _fan(name: str, ranks: int, per_node: int) -> tuple[int, int]:
    """The busiest rank's segments sent, and summed, per round in the steady state (all its
    trees' up and down traffic at once): max over ranks of parent + children, and of children."""
    trees = _trees(name, ranks, per_node)
    sends = max(
        sum((t.parent[r] is not None) + len(t.children[r]) for t in trees) for r in range(ranks)
    )
    sums = max(sum(len(t.children[r]) for t in trees) for r in range(ranks))
    return sends, sums
