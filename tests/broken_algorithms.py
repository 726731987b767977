"""Deliberately broken algorithms: the conformance suite must catch each of them."""

from __future__ import annotations

import torch

from autotune.algorithms import Comm, Recv, RingAllReduce, Send, Transport


class LosesLastElement(RingAllReduce):
    """A ring that never reduces the last element: a wrong sum."""

    name = "loses_last_element"

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        if buf.numel() > 1:
            super()._run(buf[:-1], comm, segment_elems)


class OwnInputFirst(RingAllReduce):
    """Every rank sums everything itself, starting from its own input: right to within rounding,
    but ranks add in different orders, so they disagree bitwise."""

    name = "own_input_first"
    segmented = False

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        n, me = buf.numel(), comm.rank
        gathered = buf.new_empty(comm.size * n)
        gathered[me * n : (me + 1) * n].copy_(buf)
        peers = [p for p in range(comm.size) if p != me]
        Transport(gathered, comm).run(
            [
                (
                    [Send(p, me * n, (me + 1) * n) for p in peers],
                    [Recv(p, p * n, (p + 1) * n, reduce=False) for p in peers],
                )
            ]
        )
        for p in peers:
            buf.add_(gathered[p * n : (p + 1) * n])
