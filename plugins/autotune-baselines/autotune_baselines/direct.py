"""Direct all-reduce: every rank sends everything to every other rank and sums all N inputs."""

from __future__ import annotations

import torch

from autotune.algorithms import AllReduceAlgorithm, Comm, Recv, Send, Transport

__all__ = ["DirectAllReduce"]


class DirectAllReduce(AllReduceAlgorithm):
    """All-to-all exchange of whole buffers: one step, but (N-1)·S bytes out of every rank.

    Every rank sums the N inputs itself, in rank order, so every rank adds the same numbers in the
    same order and ends bitwise identical to the others.
    """

    name = "direct"
    segmented = False

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        n, me = buf.numel(), comm.rank
        gathered = buf.new_empty(comm.size * n)
        gathered[me * n : (me + 1) * n].copy_(buf)
        peers = [p for p in range(comm.size) if p != me]
        sends = [Send(p, me * n, (me + 1) * n) for p in peers]
        recvs = [Recv(p, p * n, (p + 1) * n, reduce=False) for p in peers]
        Transport(gathered, comm).run([(sends, recvs)])
        self._sum(buf, gathered.view(comm.size, n), me)

    def _sum(self, buf: torch.Tensor, inputs: torch.Tensor, me: int) -> None:
        """Sum the rows of ``inputs`` (one per rank) into ``buf``, in rank order on every rank."""
        buf.copy_(inputs[0])
        for row in inputs[1:]:
            buf.add_(row)
