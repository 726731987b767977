"""The backend's own all-reduce, the baseline (NCCL picks ring or tree itself; gloo runs a ring)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from autotune.algorithms._base import AllReduceAlgorithm, Pending
from autotune.comm.groups import Comm

__all__ = ["NativeAllReduce"]


class NativeAllReduce(AllReduceAlgorithm):
    """``dist.all_reduce`` on the dedicated group; ``segment_bytes`` does not apply."""

    name = "native"
    segmented = False
    asynchronous = True

    def _start(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> Pending:
        # The backend runs it: return at once, so the next message can start meanwhile.
        what = f"{comm.backend} all_reduce of {buf.numel() * buf.element_size()} bytes"
        work = comm.posted(lambda: dist.all_reduce(buf, group=comm.group, async_op=True), what)
        assert work is not None
        return Pending(lambda: comm.wait(work, what), future=work.get_future())

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        self._start(buf, comm, segment_elems).wait()
