"""Runs the hook's all-reduces off the autograd thread, one message at a time, in bucket order.

Buckets are fused or split into messages as they are submitted (the same way on every rank, since
every rank sees the same buckets in the same order). An issuing thread starts each message with
the plan's choice for its size class; a completing thread waits for them in the same order,
records what it measured, and completes the buckets' futures. A message the backend runs itself
(`native`) is in flight while the next one starts, as DDP's own all-reduces are.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch.distributed import ProcessGroup

from autotune.algorithms import AllReduceAlgorithm, Pending, split
from autotune.events import Event, Failure, IterationDone, IterationEnd, Listener
from autotune.plan import Choice, Plan, size_class
from autotune.stats import IterationRecord, MessageRecord

__all__ = ["Engine"]


@dataclass(slots=True)
class _Bucket:
    buffer: torch.Tensor  # flat; averaged in place
    future: torch.futures.Future[torch.Tensor]
    is_last: bool
    ready: torch.cuda.Event | None  # recorded on the producing stream (CUDA only)

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


@dataclass(slots=True)
class _Piece:
    nbytes: int
    choice: Choice
    pending: Pending
    started: float
    finished: float | None  # set when the algorithm finished while starting (Python-driven)
    first_wait_s: float | None
    sent_bytes: int | None


@dataclass(slots=True)
class _Started:
    buckets: list[_Bucket]
    flat: torch.Tensor  # the buckets' data, fused or not
    pieces: list[_Piece] = field(default_factory=list)
    error: BaseException | None = None
    algorithm: str | None = None  # the one starting or being waited on (for a failure)


class Engine:
    """Averages submitted gradient buckets over the group, in order, on two worker threads.

    ``fusion_bytes`` (0: off) may be changed between iterations: consecutive buckets smaller than
    it are fused into one message up to it, larger ones are cut into pieces of at most it. The last
    bucket of an iteration always flushes. Every message runs the choice ``plan`` makes for its
    size class, on the algorithm ``algorithm_for`` returns. After a failure every pending and later
    bucket fails with the same error, so DDP raises instead of waiting.
    """

    def __init__(
        self,
        *,
        group: ProcessGroup,
        world_size: int,
        plan: Plan,
        algorithm_for: Callable[[str], AllReduceAlgorithm],
        fusion_bytes: int = 0,
        diagnose: Callable[[BaseException, str | None], BaseException] | None = None,
    ) -> None:
        """``diagnose(error, algorithm)``: turns the first failure into the error every bucket
        fails with (the state names the rank that failed first); None keeps it as raised."""
        self.group = group
        self.world_size = world_size
        self.plan = plan
        self.algorithm_for = algorithm_for
        self.fusion_bytes = fusion_bytes
        self._diagnose = diagnose
        self._listeners: list[Listener] = []
        #: The gradients' device and dtype, known from the first bucket on.
        self.device: torch.device | None = None
        self.dtype: torch.dtype | None = None
        self.iteration = 0
        self._pending: list[_Bucket] = []
        self._starting = 0  # messages queued for, or being started by, the start thread
        self._last_bucket_at = 0.0  # when backward handed over its last bucket
        self._last_end: float | None = None  # when the previous iteration ended
        self._lock = threading.Lock()
        self._to_start: queue.SimpleQueue[list[_Bucket] | None] = queue.SimpleQueue()
        self._to_finish: queue.SimpleQueue[_Started | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._threads = [
            threading.Thread(target=self._start_loop, name="autotune-start", daemon=True),
            threading.Thread(target=self._finish_loop, name="autotune-finish", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def subscribe(self, listener: Listener) -> None:
        """Tell ``listener`` every `autotune.events.Event`, on the finishing thread, in order:
        it must be quick (it runs between messages) and must not raise."""
        self._listeners.append(listener)

    def _emit(self, event: Event) -> None:
        for listener in self._listeners:
            listener(event)

    def submit(self, buffer: torch.Tensor, is_last: bool) -> torch.futures.Future[torch.Tensor]:
        """Queue ``buffer`` (flat) to be averaged over the group; the future completes with it."""
        if self.device is None:
            self.device, self.dtype = buffer.device, buffer.dtype
        cuda = buffer.is_cuda
        future: torch.futures.Future[torch.Tensor] = (
            torch.futures.Future(devices=[buffer.device]) if cuda else torch.futures.Future()
        )
        ready = None
        if cuda:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(buffer.device))
        bucket = _Bucket(buffer, future, is_last, ready)
        with self._lock:
            if self._error is not None:
                _fail(future, self._error)
                return future
            limit = self.fusion_bytes
            if self._pending and (
                limit == 0
                or self._pending[0].buffer.dtype != buffer.dtype
                or self._pending[0].buffer.device != buffer.device
                or sum(b.nbytes for b in self._pending) + bucket.nbytes > limit
            ):
                self._flush()
            if limit == 0 or bucket.nbytes >= limit:
                self._dispatch([bucket])
            else:
                self._pending.append(bucket)
            if is_last:
                self._last_bucket_at = time.perf_counter()
                self._flush()
        return future

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the workers once they have run what is queued (or at the timeout)."""
        with self._lock:
            self._flush()
        self._to_start.put(None)
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    @property
    def error(self) -> BaseException | None:
        """The failure that stopped the engine, if any."""
        return self._error

    def _flush(self) -> None:
        if self._pending:
            self._dispatch(self._pending)
            self._pending = []

    def _dispatch(self, buckets: list[_Bucket]) -> None:
        """Start ``buckets`` here if that is only a launch and nothing is ahead; else queue them.

        Called with the lock held. An asynchronous algorithm (the backend's own collective) is
        started on the submitting thread, as DDP starts its own all-reduces: a hop to the start
        thread would cost a thread wake-up per message. Anything Python-driven goes to the start
        thread, so the autograd thread never runs it.
        """
        nbytes = sum(b.nbytes for b in buckets)
        inline = self._starting == 0 and all(
            self.algorithm_for(self.plan.choice(n).algorithm).asynchronous
            for n in self._piece_sizes(nbytes, buckets[0].buffer.element_size())
        )
        if inline:
            self._to_finish.put(self._started(buckets))
        else:
            self._starting += 1
            self._to_start.put(buckets)

    def _start_loop(self) -> None:
        while (buckets := self._to_start.get()) is not None:
            started = self._started(buckets)
            with self._lock:
                self._to_finish.put(started)
                self._starting -= 1
        self._to_finish.put(None)

    def _started(self, buckets: list[_Bucket]) -> _Started:
        started = _Started(buckets, buckets[0].buffer)
        if self._error is None:
            try:
                self._start(started)
            except BaseException as exc:
                started.error = exc
        return started

    def _start(self, started: _Started) -> None:
        buckets = started.buckets
        with self._stream_for(started.flat.device) as stream:
            if stream is not None:
                for b in buckets:
                    assert b.ready is not None
                    stream.wait_event(b.ready)
            if len(buckets) > 1:
                started.flat = torch.cat([b.buffer for b in buckets])
            # Average: scale first, as DDP does without a hook, since the sum of N fp16 gradients
            # can overflow where their mean cannot; and by the reciprocal, as DDP does, so that
            # with `native` the result is bitwise DDP's own (x * (1/3) and x / 3 round apart).
            started.flat.mul_(1.0 / self.world_size)
            for piece in self._pieces(started.flat):
                nbytes = piece.numel() * piece.element_size()
                choice = self.plan.choice(nbytes)
                started.algorithm = choice.algorithm
                algo = self.algorithm_for(choice.algorithm)
                begin = time.perf_counter()
                pending = algo.start(piece, self.group, segment_bytes=choice.segment_bytes)
                traffic = pending.traffic
                first_wait = traffic.first_wait_s if traffic is not None else None
                sent = traffic.bytes_sent if traffic is not None else None
                # A Python-driven algorithm on CPU has finished here: its time is its own, not
                # the wait behind earlier messages. (On CUDA only the stream knows.)
                done = time.perf_counter() if pending.done and stream is None else None
                started.pieces.append(
                    _Piece(nbytes, choice, pending, begin, done, first_wait, sent)
                )

    def _finish_loop(self) -> None:
        while (started := self._to_finish.get()) is not None:
            if self._error is None and started.error is None:
                try:
                    self._finish(started)
                    continue
                except BaseException as exc:
                    started.error = exc
            first = self._error is None
            if first and self._diagnose is not None:
                # Outside the lock: agreeing on the culprit waits on the store, and submit
                # (on the autograd thread) must not wait meanwhile.
                assert started.error is not None
                started.error = self._diagnose(started.error, started.algorithm)
            with self._lock:
                if first:
                    self._error = started.error
                error = self._error
                stranded, self._pending = self._pending, []  # submitted after the failure
            assert error is not None
            if first:
                self._emit(Failure(error))
            for b in [*started.buckets, *stranded]:
                _fail(b.future, error)

    def _finish(self, started: _Started) -> None:
        with self._stream_for(started.flat.device) as stream:
            for piece in started.pieces:
                started.algorithm = piece.choice.algorithm
                piece.pending.wait()
                if stream is not None:
                    stream.synchronize()  # time the transfer, not the launch; surface errors here
                finished = piece.finished or time.perf_counter()
                self._emit(
                    MessageRecord(
                        iteration=self.iteration,
                        size_class=size_class(piece.nbytes),
                        nbytes=piece.nbytes,
                        algorithm=piece.choice.algorithm,
                        segment_bytes=piece.choice.segment_bytes,
                        seconds=finished - piece.started,
                        first_wait_s=piece.first_wait_s,
                        world_size=self.world_size,
                        started=piece.started,
                        sent_bytes=piece.sent_bytes,
                    )
                )
            buckets = started.buckets
            if len(buckets) > 1:
                offset = 0
                for b in buckets:
                    n = b.buffer.numel()
                    b.buffer.copy_(started.flat[offset : offset + n])
                    offset += n
            if buckets[-1].is_last:
                self.iteration += 1
                begin = time.perf_counter()
                exposed = max(0.0, begin - self._last_bucket_at)
                step = None if self._last_end is None else begin - self._last_end
                self._last_end = begin
                self._emit(IterationEnd(self.iteration, exposed, step))
                took = time.perf_counter() - begin
                self._emit(IterationRecord(self.iteration, exposed, took))
            # With the comm stream current, a CUDA future records its completion on that stream.
            for b in buckets:
                b.future.set_result(b.buffer)
            if buckets[-1].is_last:
                self._emit(IterationDone(self.iteration))

    def _pieces(self, flat: torch.Tensor) -> list[torch.Tensor]:
        bounds = self._piece_bounds(flat.numel(), flat.element_size())
        return [flat[a:b] for a, b in bounds]

    def _piece_sizes(self, nbytes: int, element_size: int) -> list[int]:
        bounds = self._piece_bounds(nbytes // element_size, element_size)
        return [(b - a) * element_size for a, b in bounds]

    def _piece_bounds(self, numel: int, element_size: int) -> list[tuple[int, int]]:
        """Element ranges of a message's pieces: near-equal, each at most ``fusion_bytes``."""
        limit = self.fusion_bytes
        nbytes = numel * element_size
        if limit == 0 or nbytes <= limit:
            return [(0, numel)]
        parts = -(-nbytes // limit)
        return [(a, b) for a, b in split(0, numel, parts) if b > a]

    @contextlib.contextmanager
    def _stream_for(self, device: torch.device) -> Iterator[torch.cuda.Stream | None]:
        if device.type != "cuda":
            yield None
            return
        with self._lock:
            stream = self._streams.get(device)
            if stream is None:
                stream = self._streams[device] = torch.cuda.Stream(device)
        with torch.cuda.stream(stream):
            yield stream


def _fail(future: torch.futures.Future[torch.Tensor], error: BaseException) -> None:
    # A listener after the last bucket's result (IterationDone) can fail once its futures
    # are complete; those keep their result, and the failure goes to the buckets after them.
    if future.done():
        return
    # torch annotates set_exception as taking the result type; it takes the exception.
    future.set_exception(error)  # type: ignore[arg-type]
