"""How the engine's buckets become messages: fused or cut into pieces, timed, and read back.

Arithmetic and bookkeeping, the same on every rank; the engine's threads (`autotune.ddp.engine`)
and its lane (`autotune.ddp.lane`) move these records along.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed import ProcessGroup

from autotune.algorithms import AllReduceAlgorithm, Pending, at_storage_start, split
from autotune.ddp.gpu import Gpu
from autotune.ddp.kernel_clock import KernelClock, Ticket
from autotune.ddp.stats import MessageRecord
from autotune.ddp.step_clock import DeviceEvent
from autotune.plan import Choice, size_class

__all__ = [
    "CAST_SAMPLE_EVERY",
    "Bucket",
    "Message",
    "Piece",
    "Prepared",
    "at_storage_start",
    "cast",
    "joins",
    "leave_within",
    "mark_end",
    "message_sizes",
    "piece_bounds",
    "piece_sizes",
    "pieces",
    "stage",
    "stamp",
]


@dataclass(slots=True)
class Bucket:
    """One of DDP's gradient buckets, as the hook handed it over."""

    buffer: torch.Tensor  # flat; averaged in place, or see `result`
    future: torch.futures.Future[torch.Tensor]
    is_last: bool
    iteration: int = 0  # how many iterations had been submitted before it
    #: Recorded on the producing stream (CUDA), where a message starts on the side stream.
    ready: DeviceEvent | None = None
    #: Where the averaged gradient is, if not in ``buffer``: its slice of a fused message, or
    #: where the algorithm left the sum (`leave_within`). DDP copies a hook's result into the
    #: gradients whatever tensor it is, so a copy back into ``buffer`` first would be one pass
    #: over the bucket more.
    result: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


@dataclass(slots=True)
class Piece:
    """One all-reduce of a message (a message cut by the fusion size has several)."""

    nbytes: int
    choice: Choice
    pending: Pending
    started: float
    finished: float | None  # when it finished: while starting (Python-driven), or at the callback
    first_wait_s: float | None
    sent_bytes: int | None
    early: bool = False  # the backend's callback completes the bucket's future (and sets finished)
    wait_s: float | None = None  # blocked on peers in all (`Traffic.wait_s`; None: not observable)
    ticket: Ticket | None = None  # NCCL's kernel time, beside the GPU's (`KernelClock`)
    #: On CUDA, every message is timed on the GPU: an event where it can start (its gradient
    #: ready on the stream it starts on) and one where it has ended there, recorded before
    #: anything waits for it (by the backend's callback, or on the side stream after a
    #: Python-driven schedule). The second ends the iteration on the step's clock.
    marks: list[DeviceEvent] = field(default_factory=list)
    #: Completes once the end event is recorded, where a callback records it.
    stopped: torch.futures.Future[Any] | None = None
    #: On a compressed wire (`Choice.wire`): the piece of the message the sum goes back into
    #: once done, and where the sum is (the cast copy); and, on a sample of pieces, the cast's
    #: relative error (`cast`).
    unpack: tuple[torch.Tensor, torch.Tensor] | None = None
    cast_error: float | None = None

    @classmethod
    def started_by(
        cls, nbytes: int, choice: Choice, pending: Pending, begin: float, done: float | None
    ) -> Piece:
        """A piece an algorithm's `start` returned ``pending`` for, with what its traffic says."""
        traffic = pending.traffic
        if traffic is None:
            return cls(nbytes, choice, pending, begin, done, None, None)
        return cls(
            nbytes,
            choice,
            pending,
            begin,
            done,
            traffic.first_wait_s,
            traffic.bytes_sent,
            wait_s=traffic.wait_s,
        )

    def gpu_seconds(self, clock: KernelClock | None) -> tuple[float, float | None]:
        """The piece's time between its two GPU marks, and NCCL's kernel time where ``clock``
        has a record of it in time (else None). Call it once its work was waited for."""
        start, stop = self.marks
        stop.synchronize()  # the GPU is there, or nearly
        took = start.elapsed_time(stop) / 1000.0
        kernel = None
        if self.ticket is not None and clock is not None:
            kernel = clock.seconds(self.ticket)
        return took, kernel

    def record(
        self,
        seconds: float,
        iteration: int,
        world_size: int,
        timer: str = "host",
        kernel_s: float | None = None,
    ) -> MessageRecord:
        """What this piece measured, as the engine's listeners get it."""
        return MessageRecord(
            iteration=iteration,
            size_class=size_class(self.nbytes),
            nbytes=self.nbytes,
            # What ran: the choice's wire only where the gradients were cast to it.
            algorithm=self.choice.label if self.unpack is not None else self.choice.algorithm,
            segment_bytes=self.choice.segment_bytes,
            seconds=seconds,
            first_wait_s=self.first_wait_s,
            wait_s=self.wait_s,
            world_size=world_size,
            started=self.started,
            sent_bytes=self.sent_bytes,
            timer=timer,
            kernel_s=kernel_s,
            cast_error=self.cast_error,
        )

    def take_sum(self) -> None:
        """Once the piece's work is done: on a compressed wire, cast its sum back into the
        message (the gradient's dtype)."""
        if self.unpack is not None:
            into, sent = self.unpack
            into.copy_(sent)


@dataclass(slots=True)
class Message:
    """Buckets sent together, started (or failed starting), on their way to the finishing thread."""

    buckets: list[Bucket]
    flat: torch.Tensor  # the buckets' data, fused or not
    pieces: list[Piece] = field(default_factory=list)
    error: BaseException | None = None
    algorithm: str | None = None  # the one starting or being waited on (for a failure)
    #: A sparse gradient (`autotune.ddp.lane.Lane.sparse`): its result is the collective's
    #: output, a new tensor.
    sparse: bool = False

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)

    def hand_back(self) -> None:
        """Point each bucket at its part of the result, where the sum is not in its own buffer
        (fused, or left elsewhere by the algorithm)."""
        if self.flat is self.buckets[0].buffer:
            return
        offset = 0
        for b in self.buckets:
            n = b.buffer.numel()
            b.result = at_storage_start(self.flat[offset : offset + n])
            offset += n


def joins(pending: list[Bucket], bucket: Bucket, limit: int) -> bool:
    """Whether ``bucket`` may be fused with the ``pending`` ones under the fusion size ``limit``
    (0: off): same dtype and device, and the whole within the limit."""
    if not pending:
        return True
    first = pending[0].buffer
    return (
        limit != 0
        and first.dtype == bucket.buffer.dtype
        and first.device == bucket.buffer.device
        and sum(b.nbytes for b in pending) + bucket.nbytes <= limit
    )


def piece_bounds(numel: int, element_size: int, limit: int) -> list[tuple[int, int]]:
    """Element ranges of a message's pieces: near-equal, each at most ``limit`` bytes (0: one)."""
    nbytes = numel * element_size
    if limit == 0 or nbytes <= limit:
        return [(0, numel)]
    parts = -(-nbytes // limit)
    return [(a, b) for a, b in split(0, numel, parts) if b > a]


def piece_sizes(nbytes: int, element_size: int, limit: int) -> list[int]:
    """The byte sizes of a message's pieces (`piece_bounds`)."""
    bounds = piece_bounds(nbytes // element_size, element_size, limit)
    return [(b - a) * element_size for a, b in bounds]


def message_sizes(buckets: list[tuple[int, str]], limit: int) -> list[int]:
    """The byte sizes of the messages an iteration of ``buckets`` ((bytes, dtype) each, as
    `autotune.ddp.engine.Engine.buckets` holds them) makes at the fusion size ``limit`` (0: off):
    what the engine fuses (`joins`) and cuts (`piece_sizes`), in order. Two fusion sizes that
    give the same list run the same messages."""
    out: list[int] = []
    pending: list[tuple[int, str]] = []

    def flush() -> None:
        if pending:
            out.append(sum(n for n, _ in pending))
            pending.clear()

    for nbytes, dtype in buckets:
        if " " in dtype:  # sparse: on its own, after what came before
            flush()
            out.append(nbytes)
            continue
        if pending and (
            limit == 0 or pending[0][1] != dtype or sum(n for n, _ in pending) + nbytes > limit
        ):
            flush()
        if limit == 0 or nbytes >= limit:
            out.extend(piece_sizes(nbytes, getattr(torch, dtype).itemsize, limit))
        else:
            pending.append((nbytes, dtype))
    flush()
    return out


def pieces(flat: torch.Tensor, limit: int) -> list[torch.Tensor]:
    """``flat`` cut into its pieces (views, `piece_bounds`)."""
    return [flat[a:b] for a, b in piece_bounds(flat.numel(), flat.element_size(), limit)]


def leave_within(first: Bucket, layout: list[tuple[int, str]]) -> int | None:
    """How many bytes of messages may follow one that starts at bucket ``first`` before its sum
    must have been taken, where an algorithm leaves it in memory of its own
    (`AllReduceAlgorithm.leaves_result`): an iteration's (``layout``'s), since DDP copies every
    bucket's result into the gradients at the end of backward, before any rank's next
    iteration sends anything. None in the first iteration, whose buckets are not all known yet:
    the same on every rank, as the algorithm's choice of where to sum must be."""
    if first.iteration == 0:
        return None
    return sum(nbytes for nbytes, _ in layout)


def stage(
    buckets: list[Bucket],
    algo: AllReduceAlgorithm,
    group: ProcessGroup,
    within: int,
    world_size: int,
    limit: int,
) -> torch.Tensor | None:
    """Gather a fused message's ``buckets``, scaled, straight into the memory ``algo`` would copy
    them into (`AllReduceAlgorithm.stage`: `shm`'s slot), where it leaves the sum for the buckets
    to take within ``within`` bytes: one pass over the buckets where a concatenation and the
    algorithm's copy of it were two, and none where the algorithm reads them where they are
    (`AllReduceAlgorithm.gather`: `shm`'s ranks, where they can). Only a message sent whole
    (under the fusion size ``limit``) is staged. The staged message, or None where it is not."""
    nbytes = sum(b.nbytes for b in buckets)
    if (
        not algo.leaves_result
        or len(piece_sizes(nbytes, buckets[0].buffer.element_size(), limit)) > 1
    ):
        return None
    flat = algo.stage(group, nbytes, buckets[0].buffer.dtype, within)
    if flat is None:
        return None
    algo.gather(group, [b.buffer for b in buckets], flat, 1.0 / world_size)
    return flat


def stamp(gpu: Gpu | None, marks: list[DeviceEvent], stream: Any = None) -> None:
    """Append to ``marks`` a timing event recorded now on ``stream`` (None: the current)."""
    assert gpu is not None
    event = gpu.event()
    event.record(stream)
    marks.append(event)


def mark_end(
    gpu: Gpu | None, pending: Pending, marks: list[DeviceEvent]
) -> torch.futures.Future[Any] | None:
    """Record the end event of a message started on the side stream (current here), where its
    work ends on the GPU and before anything waits for it: in its future's callback, which runs
    with streams current that wait for the backend's work (NCCL's: at once); else now, the side
    stream having waited for the schedule's work. The future returned, if any, completes once
    the event is recorded."""
    if pending.future is not None and not pending.done:
        return pending.future.then(lambda _: stamp(gpu, marks))
    stamp(gpu, marks)
    return None


def cast(
    piece: torch.Tensor, wire: torch.dtype, measure: bool
) -> tuple[torch.Tensor, float | None]:
    """``piece`` (already divided by the world size, as PyTorch's compression hooks divide
    before they cast: a sum of fp16 gradients can overflow where their mean cannot) as a copy in
    ``wire``; and where ``measure``, the cast's relative error ||g - cast(g)|| / ||g|| (0 for a
    zero piece), on this rank's gradients alone: no communication."""
    sent = piece.to(wire)
    if not measure:
        return sent, None
    norm = float(torch.linalg.vector_norm(piece))
    if norm == 0.0:
        return sent, 0.0
    return sent, float(torch.linalg.vector_norm(piece - sent.to(piece.dtype))) / norm


#: One compressed piece in this many has its cast's error measured (`cast`): two passes over
#: the piece, so a sample.
CAST_SAMPLE_EVERY = 8


@dataclass(slots=True)
class Prepared:
    """What an algorithm is started on for one piece of a message, and with which options."""

    tensor: torch.Tensor
    options: dict[str, Any]
    unpack: tuple[torch.Tensor, torch.Tensor] | None = None
    cast_error: float | None = None

    @classmethod
    def of(
        cls,
        piece: torch.Tensor,
        algo: AllReduceAlgorithm,
        wire: torch.dtype | None,
        scale: float,
        *,
        scaled: bool,
        whole: bool,
        within: int | None,
        measure: bool,
    ) -> Prepared:
        """``piece`` averaged as the engine sends it: scaled first, as DDP does without a hook,
        since the sum of N fp16 gradients can overflow where their mean cannot; by the
        reciprocal, as DDP does, so that with `native` the result is bitwise DDP's own (x * (1/3)
        and x / 3 round apart). An algorithm that copies its input anyway scales it in that copy
        (`folds_scale`: `shm`), a pass fewer (a third party's `start`, written before ``scale``,
        is called without it); ``scaled``: it was, as it was gathered (`stage`). On a compressed
        ``wire`` the algorithm sums a cast copy (`cast`, its error measured where ``measure``),
        in place, the sum cast back once done (`Piece.take_sum`). ``whole``: the message is one
        piece, whose sum ``algo`` may leave in memory of its own (``within``: `leave_within`)."""
        if wire is not None:
            if not scaled:
                piece.mul_(scale)
            sent, error = cast(piece, wire, measure)
            return cls(sent, {}, (piece, sent), error)
        options: dict[str, Any] = {}
        if algo.folds_scale and not scaled:
            options["scale"] = scale
        elif not scaled:
            piece.mul_(scale)
        if algo.leaves_result and whole:
            options["leave_within"] = within
        return cls(piece, options)

    def apply(self, piece: Piece) -> None:
        """Note on the started ``piece`` what its wire needs once done, and what it measured."""
        piece.unpack, piece.cast_error = self.unpack, self.cast_error
