"""The baseline's lane: a bucket the backend all-reduces whole, launched on the job's own group.

When the backend runs a bucket as one message (the baseline: `native` on DDP's own buckets, or an
``nccl.*`` cell) on a CPU or on NCCL, the bucket is launched on the submitting thread and its future
completes from the backend's own completion callback, as PyTorch's ``allreduce_hook`` does:
backward never waits for the engine's completing thread, and on NCCL the host never waits for the
GPU. Sparse gradients take the backend's own all-reduce here too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from autotune.algorithms import AllReduceAlgorithm, Comm, Pending, check_tensor
from autotune.ddp.gpu import Gpu
from autotune.ddp.kernel_clock import LANE, KernelClock
from autotune.ddp.messages import Bucket, Message, Piece, stamp
from autotune.plan import BASELINE_CHOICE, Plan

__all__ = ["Lane"]


class Lane:
    """Launches on the job's own ``group`` what the backend runs, from the submitting thread only:
    it may then share the group with DDP's own collectives (the engine's start thread never
    launches here). ``completing`` is the engine's lock around completing a bucket's future."""

    def __init__(
        self,
        group: ProcessGroup,
        world_size: int,
        algorithm_for: Callable[[str], AllReduceAlgorithm],
        completing: threading.Lock,
    ) -> None:
        self.group = group
        self.world_size = world_size
        self.algorithm_for = algorithm_for
        self._completing = completing
        #: Per algorithm name: the algorithm and its kept connection (None: the algorithm is
        #: driven from Python and takes the engine's general path).
        self._connections: dict[str, tuple[AllReduceAlgorithm, Comm] | None] = {}

    def launch(
        self,
        bucket: Bucket,
        plan: Plan,
        fusion_bytes: int,
        gpu: Gpu | None,
        clock: KernelClock | None,
    ) -> Message | None:
        """Launch ``bucket`` as one message where the plan's choice for it is the backend's own,
        and have the backend's callback complete its future; None where the lane does not apply
        (a Python-driven choice, a bucket cut into pieces, or on NCCL a plan not all the
        backend's: `whole`).

        On CUDA the all-reduce is launched with the current stream current, as DDP launches its
        own: the backend orders it after the gradient (NCCL's stream waits for the current
        one), no side stream or event of autotune's does. On NCCL the host waits for nothing:
        NCCL's future is complete at launch, and its callback, run at once, completes the
        bucket's future on a stream that waits for the all-reduce. The message is timed on the
        GPU: by NCCL's clock where its profiler is loaded, else between an event at launch and
        one the callback records."""
        nbytes = bucket.nbytes
        if 0 < fusion_bytes < nbytes:
            return None
        choice = plan.choice(nbytes)
        if choice.wire is not None:
            return None  # the general path sends a cast copy
        try:
            connection = self.connection(choice.algorithm, bucket.buffer.device)
        except BaseException as exc:
            return Message([bucket], bucket.buffer, algorithm=choice.algorithm, error=exc)
        if connection is None:
            return None  # Python-driven: the engine's general path
        message = Message([bucket], bucket.buffer, algorithm=choice.algorithm)
        try:
            algo, comm = connection
            if comm.backend == "nccl" and not self.whole(plan, fusion_bytes):
                return None
            check_tensor(bucket.buffer)
            bucket.buffer.mul_(1.0 / self.world_size)  # as the engine's `_start` explains
            piece = Piece(nbytes, choice, Pending(), 0.0, None, None, None)
            if gpu is not None:
                if clock is not None:
                    piece.ticket = clock.expect(nbytes, LANE)
                stamp(gpu, piece.marks)  # on the current stream, where the gradient was made
            piece.started = time.perf_counter()
            piece.pending = algo.launch(bucket.buffer, comm)
        except BaseException as exc:
            message.error = exc
            return message
        message.pieces.append(piece)
        self._complete_early(bucket, piece, gpu)
        return message

    def whole(self, plan: Plan, fusion_bytes: int) -> bool:
        """Whether every message ``plan`` sends is one of DDP's buckets on an asynchronous
        algorithm (the backend's own): on NCCL the lane is taken only then.

        NCCL's kernels wait for their peers, and two communicators in use at once may hang each
        other: NCCL's guide asks for one order on every rank, its maintainers for one
        communicator at a time (NVIDIA/nccl#195). A lane message runs on the job's
        communicator; the others on autotune's groups, some launched from the start thread,
        which a lane message could overtake on one rank and not on another. So on NCCL the lane
        is all or nothing, per plan and fusion size. Both change on every rank alike, at an
        iteration end the next iteration's first bucket waits for, and the finish thread has
        waited there for every message before it: the two kinds of message never overlap.
        (gloo's groups are host-driven and independent.)"""
        if fusion_bytes:
            return False
        choices = plan.choices()
        return choices is not None and all(
            c.wire is None and self.algorithm_for(c.algorithm).asynchronous for c in choices
        )

    def connection(self, name: str, device: torch.device) -> tuple[AllReduceAlgorithm, Comm] | None:
        """Algorithm ``name`` and its kept connection on the job's own group, where the backend
        runs it (`asynchronous`); None where it is driven from Python."""
        if name not in self._connections:
            algo = self.algorithm_for(name)
            # On the job's own group, as DDP and allreduce_hook do: launched on the autograd
            # thread, in bucket order on every rank. (A dedicated group was tried: the step
            # was slower.)
            self._connections[name] = (
                (algo, algo.connect(self.group, device, dedicated=False))
                if algo.asynchronous
                else None
            )
        return self._connections[name]

    def sparse(self, bucket: Bucket) -> Message:
        """A sparse gradient (``nn.Embedding(sparse=True)``): the backend's own all-reduce, on the
        job's group, as DDP runs it without a hook and PyTorch's ``allreduce_hook`` with one.
        No algorithm of autotune's takes sparse tensors, and its size says nothing of a dense
        message's: it is neither tuned nor timed."""
        message = Message([bucket], bucket.buffer, algorithm="native", sparse=True)
        try:
            connection = self.connection(BASELINE_CHOICE.algorithm, bucket.buffer.device)
            assert connection is not None  # the backend's own all-reduce is asynchronous
            comm = connection[1]
            # Divided, not multiplied by the reciprocal: DDP's reducer divides a sparse gradient
            # (mark_variable_ready_sparse), and a dense one by the reciprocal (the engine's
            # `_start`).
            bucket.buffer.div_(self.world_size)
            begin = time.perf_counter()
            what = f"{comm.backend} all_reduce of a sparse gradient {tuple(bucket.buffer.shape)}"
            work = comm.posted(
                lambda: dist.all_reduce(bucket.buffer, group=comm.group, async_op=True), what
            )
            assert work is not None
            pending = Pending(lambda: comm.wait(work, what), future=work.get_future())
            message.pieces.append(Piece(0, BASELINE_CHOICE, pending, begin, None, None, None))
        except BaseException as exc:
            message.error = exc
        return message

    def _complete_early(self, bucket: Bucket, piece: Piece, gpu: Gpu | None) -> None:
        """Have the backend's completion callback complete ``bucket``'s future, where it has one:
        backward then goes on without waiting for the completing thread. A failure is left to
        that thread, which fails the future with the diagnosed error. (A world of one has
        nothing to wait for: its future completes here.)"""
        future = piece.pending.future
        if future is None:
            if piece.pending.done:
                piece.early, piece.finished = True, time.perf_counter()
                bucket.future.set_result(bucket.buffer)
            return
        piece.early = True

        def done(fut: torch.futures.Future[list[torch.Tensor]]) -> None:
            # On CUDA the callback runs with streams current that wait for the all-reduce
            # (torch.futures.Future.add_done_callback): what it records or completes here
            # follows the all-reduce on the GPU, while the host goes on.
            piece.finished = time.perf_counter()
            if piece.marks and gpu is not None:
                stamp(gpu, piece.marks)
            try:
                fut.value()
            except Exception:
                return
            with self._completing:
                if not bucket.future.done():
                    bucket.future.set_result(bucket.buffer)

        future.add_done_callback(done)
