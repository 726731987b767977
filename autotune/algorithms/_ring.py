"""Ring all-reduce: reduce-scatter then all-gather around a logical ring, 2(N-1) steps.

Each rank sends 2(N-1)/N of the data, the bandwidth optimum; latency grows linearly with N.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from autotune.algorithms._base import AllReduceAlgorithm
from autotune.algorithms._transport import Recv, Round, Send, Transport, segments, split
from autotune.comm.groups import Comm

__all__ = ["RingAllReduce", "ring_rounds"]


class RingAllReduce(AllReduceAlgorithm):
    """Ring all-reduce, each step's chunk cut into segments so sends overlap reductions.

    Chunk c of the buffer is reduced while it travels from rank c+1 around the ring to rank c, which
    ends with the full sum and starts it on its way round again (all-gather). Every element is
    summed on one rank and copied everywhere else, so all ranks end bitwise identical.
    """

    name = "ring"

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        ring = range(comm.size)
        Transport(buf, comm).run(ring_rounds(ring, comm.rank, (0, buf.numel()), segment_elems))


def ring_rounds(
    ring: Sequence[int], rank: int, span: tuple[int, int], segment_elems: int, channel: int = 0
) -> list[Round]:
    """``rank``'s rounds of a ring all-reduce of ``buf[span]`` over the ranks of ``ring``, in ring
    order; 2(len(ring)-1) steps of one chunk each, cut into segments. Empty for a one-rank ring."""
    n, r = len(ring), ring.index(rank)
    right, left = ring[(r + 1) % n], ring[(r - 1) % n]
    chunks = [segments(a, b, segment_elems) for a, b in split(*span, n)]
    depth = max(len(c) for c in chunks)
    # Reduce-scatter: at step k send chunk r-k right, add chunk r-k-1 from the left into ours.
    # All-gather: at step k pass on chunk r+1-k (complete), take chunk r-k in place.
    steps = [((r - k) % n, (r - k - 1) % n, True) for k in range(n - 1)]
    steps += [((r + 1 - k) % n, (r - k) % n, False) for k in range(n - 1)]
    return [
        (
            [Send(right, *seg, channel=channel) for seg in chunks[send_chunk][s : s + 1]],
            [
                Recv(left, *seg, reduce=reduce, channel=channel)
                for seg in chunks[recv_chunk][s : s + 1]
            ],
        )
        for send_chunk, recv_chunk, reduce in steps
        for s in range(depth)
    ]
