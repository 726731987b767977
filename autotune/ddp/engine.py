"""Runs the hook's all-reduces off the autograd thread, one message at a time, in bucket order.

`Engine.submit` takes each bucket from the hook and returns a future. Buckets are fused or split
into messages as they are submitted (the same way on every rank, since every rank sees the same
buckets in the same order). An issuing thread starts each message with the plan's choice for its
size class; a completing thread waits for them in the same order, records what it measured
(`autotune.ddp.stats`), emits events (`autotune.ddp.events`) and completes the buckets' futures.
A message the backend runs itself (`native`) is in flight while the next one starts, as DDP's
own all-reduces are.

When the backend runs a bucket as one message (the baseline: `native` on DDP's own buckets, or
an ``nccl.*`` cell) on a CPU or on NCCL, the bucket is launched on the submitting thread and its
future completes from the backend's own completion callback, as PyTorch's ``allreduce_hook``
does: backward never waits for the completing thread, and on NCCL the host never waits for the
GPU (`Engine._direct`). Plan switches stay
in step on every rank because, where the tuner announced one (`Engine.switch_at`), an
iteration's first bucket waits until the completing thread has handled the previous iteration's
end (`IterationEnd`, where the switch happens); elsewhere that thread may fall up to two
iterations behind.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from autotune.algorithms import AllReduceAlgorithm, Comm, Pending, check_tensor, split
from autotune.ddp.events import Event, Failure, IterationDone, IterationEnd, Listener
from autotune.ddp.gpu import Gpu
from autotune.ddp.kernel_clock import AUTOTUNE, LANE, KernelClock, Ticket
from autotune.ddp.stats import IterationRecord, MessageRecord
from autotune.ddp.step_clock import DeviceEvent, StepClock
from autotune.plan import BASELINE_CHOICE, Choice, Plan, size_class

__all__ = ["Engine"]


@dataclass(slots=True)
class _Bucket:
    buffer: torch.Tensor  # flat; averaged in place, or see `result`
    future: torch.futures.Future[torch.Tensor]
    is_last: bool
    iteration: int = 0  # how many iterations had been submitted before it
    #: Recorded on the producing stream (CUDA), where a message starts on the side stream.
    ready: DeviceEvent | None = None
    #: Where the averaged gradient is, if not in ``buffer``: its slice of a fused message, or
    #: where the algorithm left the sum (`Engine._leave_within`). DDP copies a hook's result
    #: into the gradients whatever tensor it is, so a copy back into ``buffer`` first would be
    #: one pass over the bucket more.
    result: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


@dataclass(slots=True)
class _Piece:
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


@dataclass(slots=True)
class _Started:
    buckets: list[_Bucket]
    flat: torch.Tensor  # the buckets' data, fused or not
    pieces: list[_Piece] = field(default_factory=list)
    error: BaseException | None = None
    algorithm: str | None = None  # the one starting or being waited on (for a failure)
    #: A sparse gradient (`Engine._sparse`): its result is the collective's output, a new tensor.
    sparse: bool = False


def _at_storage_start(t: torch.Tensor) -> torch.Tensor:
    """``t`` (flat, contiguous) as a tensor whose storage starts at its first element, sharing
    its memory. DDP reads a hook's result with ``as_strided`` at each gradient's offset in the
    bucket, which counts from the storage's start, not the tensor's: a slice of a larger
    tensor would be read from the wrong place."""
    if t.storage_offset() == 0:
        return t
    start = t.storage_offset() * t.element_size()
    storage = t.untyped_storage()[start : start + t.numel() * t.element_size()]
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(storage)


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
        clock: KernelClock | None = None,
        gpu: Gpu | None = None,
    ) -> None:
        """``diagnose(error, algorithm)``: turns the first failure into the error every bucket
        fails with (the state names the rank that failed first); None keeps it as raised.
        ``clock``: NCCL's own clock, where NCCL loaded autotune's profiler; a CUDA message that
        NCCL runs (an `asynchronous` algorithm on it) is then timed by its kernel time, and the
        completing thread never synchronizes a stream for it. ``gpu``: the job's GPU
        (`autotune.ddp.gpu`), made from the first bucket's device where None."""
        self.clock = clock
        self.gpu = gpu
        self.group = group
        #: Where autotune's algorithms talk for this engine (`autotune.comm.groups.p2p_group`):
        #: ``group``, for the dedicated group an algorithm called on it takes, unless the owner
        #: gives the engine a channel of its own (`AutotuneState` does, before the first bucket).
        self.channel = group
        self.world_size = world_size
        self.plan = plan
        self.algorithm_for = algorithm_for
        self.fusion_bytes = fusion_bytes
        self._diagnose = diagnose
        self._listeners: list[Listener] = []
        #: The gradients' device and dtype, known from the first bucket on.
        self.device: torch.device | None = None
        self.dtype: torch.dtype | None = None
        #: The buckets of the first iteration, as DDP first builds them: (bytes, dtype) each,
        #: complete once that iteration's last bucket is submitted (what names the job's plan,
        #: `autotune.storage.workload_name`).
        self.layout: list[tuple[int, str]] = []
        self.iteration = 0
        self._pending: list[_Bucket] = []
        self._starting = 0  # messages queued for, or being started by, the start thread
        self._last_bucket_at = 0.0  # when backward handed over its last bucket
        #: The step's clock: the host's, or the GPU's on CUDA (`autotune.ddp.step_clock`); made at
        #: the first iteration's end, for its device.
        self.step_clock: StepClock | None = None
        self._completed_at = 0.0  # when the latest bucket's future completed (completing thread)
        self._lock = threading.Lock()
        # Iterations: whose last bucket was submitted, whose IterationEnd listeners have run, and
        # whose IterationDone listeners have run (the latter two counted by the completing thread).
        self._submitted = 0
        self._ended = 0
        self._done = 0
        self._open = False  # an iteration's buckets are being submitted
        self._switches: set[int] = set()  # iterations at whose end the plan may change
        self._progress = threading.Condition(threading.Lock())
        self._completing = threading.Lock()  # one of set_result / set_exception per future
        # Messages whose futures the backend completes, started but not yet handed to the
        # completing thread: it gets them together (at the iteration's last bucket, or before
        # anything else), so it wakes once an iteration instead of once a message.
        self._held: list[_Started] = []
        #: Per algorithm name: the algorithm and its kept connection, for `_direct` (None: the
        #: algorithm is driven from Python and takes the general path).
        self._lanes: dict[str, tuple[AllReduceAlgorithm, Comm] | None] = {}
        self._closing = False
        # Buckets to start, or a message the lane started, to pass on in order.
        self._to_start: queue.SimpleQueue[list[_Bucket] | _Started | None] = queue.SimpleQueue()
        self._to_finish: queue.SimpleQueue[_Started | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._threads = [
            threading.Thread(target=self._start_loop, name="autotune-start", daemon=True),
            threading.Thread(target=self._finish_loop, name="autotune-finish", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def subscribe(self, listener: Listener) -> None:
        """Tell ``listener`` every `autotune.ddp.events.Event`, on the finishing thread, in order:
        it must be quick (it runs between messages) and must not raise."""
        self._listeners.append(listener)

    def _emit(self, event: Event) -> None:
        for listener in self._listeners:
            listener(event)

    def submit(self, buffer: torch.Tensor, is_last: bool) -> torch.futures.Future[torch.Tensor]:
        """Queue ``buffer`` (flat) to be averaged over the group; the future completes with it."""
        if not self._open:
            self._open = True
            self._wait_for_plan(self._submitted + 1)
        if self.device is None:
            self.device, self.dtype = buffer.device, buffer.dtype
            if self.gpu is None:
                self.gpu = Gpu.of(buffer.device)
        if self._submitted == 0:
            dtype = str(buffer.dtype).removeprefix("torch.")
            sparse = "" if buffer.layout == torch.strided else f" {buffer.layout}"
            self.layout.append((buffer.numel() * buffer.element_size(), dtype + sparse))
        future: torch.futures.Future[torch.Tensor] = (
            torch.futures.Future() if self.gpu is None else self.gpu.future()
        )
        bucket = _Bucket(buffer, future, is_last, self._submitted)
        with self._lock:
            if self._error is not None:
                self._fail(future, self._error)
                return future
            limit = self.fusion_bytes
            if buffer.layout != torch.strided:
                self._flush()  # the buckets before it go first, as on every rank
                self._hand_over(self._sparse(bucket))
            else:
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
                    self._mark_ready([bucket])
                    self._pending.append(bucket)
            if is_last:
                self._last_bucket_at = time.perf_counter()
                self._flush()
                self._release()
        if is_last:
            self._open = False
            with self._progress:
                self._submitted += 1
        return future

    @property
    def submitted(self) -> int:
        """Iterations whose last bucket was submitted (read it on the submitting thread)."""
        return self._submitted

    def switch_at(self, iteration: int) -> None:
        """The plan may change at the end of ``iteration`` (a listener will switch it there, at
        `IterationEnd`): the next iteration's first bucket waits for that end. Say so by the
        end of the iteration before it (at its `IterationDone`)."""
        with self._progress:
            self._switches.add(iteration)

    def _wait_for_plan(self, iteration: int) -> None:
        """Before ``iteration``'s first bucket: make sure it runs the plan every rank runs.

        The completing thread is always let get two iterations behind (it has handled the
        `IterationDone` that would have announced a switch); it must have handled the previous
        iteration's end only where the plan may switch there. Waiting at every iteration would
        tie each step to that thread's scheduling (milliseconds on an oversubscribed CPU).
        """
        previous = iteration - 1

        def ready() -> bool:
            if self._done < iteration - 2:
                return False
            return previous not in self._switches or self._ended >= previous

        self._wait_for(ready)
        with self._progress:
            self._switches.discard(previous)

    def forget_step(self) -> None:
        """The next iteration's step is not timed: the model ran iterations without the hook
        since the last one ended (`autotune.tuning.plain_check`). Call it between iterations,
        settled."""
        if self.step_clock is not None:
            self.step_clock.forget()

    def settle(self, timeout_s: float | None = None) -> bool:
        """Wait until every submitted iteration has been handled on the completing thread (its
        records and events are out): True, or False at the timeout. A failure settles it too."""
        return self._wait_for(lambda: self._done >= self._submitted, timeout_s)

    def _wait_for(self, progress: Callable[[], bool], timeout_s: float | None = None) -> bool:
        with self._progress:
            return self._progress.wait_for(lambda: progress() or self._error is not None, timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the workers once they have run what is queued (or at the timeout)."""
        with self._lock:
            self._closing = True  # what is flushed here is not on the autograd thread
            self._flush()
            self._release()
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
        if len(buckets) == 1:
            # Whether a message takes the lane depends on the plan and the bucket only, the
            # same on every rank: the lane and the rest talk on different groups.
            direct = self._direct(buckets[0])
            if direct is not None:
                self._hand_over(direct)
                return
        self._mark_ready(buckets)
        nbytes = sum(b.nbytes for b in buckets)
        inline = self._starting == 0 and all(
            self.algorithm_for(self.plan.choice(n).algorithm).asynchronous
            for n in self._piece_sizes(nbytes, buckets[0].buffer.element_size())
        )
        self._release()  # ahead of what this puts, or the start thread will
        if inline:
            self._to_finish.put(self._started(buckets))
        else:
            self._starting += 1
            self._to_start.put(buckets)

    def _mark_ready(self, buckets: list[_Bucket]) -> None:
        """On CUDA, mark each bucket's gradient ready on the stream that made it (the current
        one, on the submitting thread): a message that starts on the side stream waits for it."""
        if self.gpu is not None:
            for b in buckets:
                if b.ready is None:
                    b.ready = self.gpu.mark()

    def _direct(self, bucket: _Bucket) -> _Started | None:
        """The baseline's lane: a bucket sent as one message by an algorithm the backend runs
        (`native`, every ``nccl.*`` cell), started here on a kept connection and completed by
        the backend's own callback, for what PyTorch's ``allreduce_hook`` costs. None where it
        does not apply.

        Only the submitting (autograd) thread launches here, so the lane may share the job's
        group with DDP's own collectives; the start thread never does. On CUDA the all-reduce is
        launched with the current stream current, as DDP launches its own: the backend orders
        it after the gradient (NCCL's stream waits for the current one), no side stream or event
        of autotune's does. On NCCL the host waits for nothing: NCCL's future is complete at
        launch, and its callback, run at once, completes the bucket's future on a stream that
        waits for the all-reduce. The message is timed on the GPU: by NCCL's clock where its
        profiler is loaded, else between an event at launch and one the callback records."""
        nbytes = bucket.nbytes
        if 0 < self.fusion_bytes < nbytes or self._closing:
            return None  # cut into pieces, or not from backward
        choice = self.plan.choice(nbytes)
        started = _Started([bucket], bucket.buffer, algorithm=choice.algorithm)
        try:
            lane = self._lane(choice.algorithm, bucket.buffer.device)
            if lane is None:
                return None
            algo, comm = lane
            gpu = self.gpu
            if comm.backend == "nccl" and not self._all_the_backends():
                return None  # one communicator, one order: see `_all_the_backends`
            check_tensor(bucket.buffer)
            bucket.buffer.mul_(1.0 / self.world_size)  # as `_start` explains
            piece = _Piece(nbytes, choice, Pending(), 0.0, None, None, None)
            if gpu is not None:
                if self.clock is not None:
                    piece.ticket = self.clock.expect(nbytes, LANE)
                self._stamp(piece.marks)  # on the current stream, where the gradient was made
            piece.started = time.perf_counter()
            piece.pending = algo.launch(bucket.buffer, comm)
        except BaseException as exc:
            started.error = exc
            return started
        started.pieces.append(piece)
        self._complete_early(bucket, piece)
        return started

    def _all_the_backends(self) -> bool:
        """Whether every message the plan sends is one of DDP's buckets on an asynchronous
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
        if self.fusion_bytes:
            return False
        choices = self.plan.choices()
        return choices is not None and all(
            self.algorithm_for(c.algorithm).asynchronous for c in choices
        )

    def _lane(self, name: str, device: torch.device) -> tuple[AllReduceAlgorithm, Comm] | None:
        """Algorithm ``name`` and its kept connection on the job's own group, where the backend
        runs it (`asynchronous`); None where it is driven from Python."""
        lane = self._lanes.get(name)
        if lane is None:
            algo = self.algorithm_for(name)
            if algo.asynchronous:
                # On the job's own group, as DDP and allreduce_hook do: launched on the autograd
                # thread, in bucket order on every rank. (A dedicated group measured ~5% slower
                # steps on 2 shared cores.)
                lane = (algo, algo.connect(self.group, device, dedicated=False))
            self._lanes[name] = lane
        return lane

    def _hand_over(self, started: _Started) -> None:
        """Pass a message launched on the submitting thread on, in order (with the lock held):
        behind those the start thread has yet to start (it never uses the job's group), else
        held for the completing thread where the backend's callback completes it, else to it."""
        if self._starting:
            self._release()
            self._starting += 1
            self._to_start.put(started)
        elif started.pieces and started.pieces[0].early:
            self._held.append(started)
        else:
            self._release()
            self._to_finish.put(started)

    def _sparse(self, bucket: _Bucket) -> _Started:
        """A sparse gradient (``nn.Embedding(sparse=True)``): the backend's own all-reduce, on the
        job's group, as DDP runs it without a hook and PyTorch's ``allreduce_hook`` with one.
        No algorithm of autotune's takes sparse tensors, and its size says nothing of a dense
        message's: it is neither tuned nor timed. Called with the lock held, after a flush."""
        started = _Started([bucket], bucket.buffer, algorithm="native", sparse=True)
        try:
            lane = self._lane(BASELINE_CHOICE.algorithm, bucket.buffer.device)
            assert lane is not None  # the backend's own all-reduce is asynchronous
            comm = lane[1]
            # Divided, not multiplied by the reciprocal: DDP's reducer divides a sparse gradient
            # (mark_variable_ready_sparse), and a dense one by the reciprocal (`_start`).
            bucket.buffer.div_(self.world_size)
            begin = time.perf_counter()
            work = dist.all_reduce(bucket.buffer, group=comm.group, async_op=True)
            assert work is not None
            what = f"{comm.backend} all_reduce of a sparse gradient {tuple(bucket.buffer.shape)}"
            pending = Pending(lambda: comm.wait(work, what), future=work.get_future())
            started.pieces.append(_Piece(0, BASELINE_CHOICE, pending, begin, None, None, None))
        except BaseException as exc:
            started.error = exc
        return started

    def _release(self) -> None:
        """Hand the held messages to the completing thread (with the lock held)."""
        for started in self._held:
            self._to_finish.put(started)
        self._held.clear()

    def _start_loop(self) -> None:
        while (item := self._to_start.get()) is not None:
            started = item if isinstance(item, _Started) else self._started(item)
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
        with self._side() as stream:
            if stream is not None:
                for b in buckets:
                    if b.ready is not None:  # recorded on the stream that produced it (CUDA)
                        stream.wait_event(b.ready)
            # Where the sum may be left (`_leave_within`): decided once, for staging and start.
            within = self._leave_within(buckets[0])
            staged = len(buckets) > 1 and within is not None and self._stage(started, within)
            if len(buckets) > 1 and not staged:
                started.flat = torch.cat([b.buffer for b in buckets])
            # Average: scale first, as DDP does without a hook, since the sum of N fp16 gradients
            # can overflow where their mean cannot; and by the reciprocal, as DDP does, so that
            # with `native` the result is bitwise DDP's own (x * (1/3) and x / 3 round apart).
            # An algorithm that copies its input anyway scales it in that copy (`folds_scale`:
            # `shm`), a pass over the bucket fewer; the others' pieces are scaled here.
            scale = 1.0 / self.world_size
            pieces = self._pieces(started.flat)
            for piece in pieces:
                nbytes = piece.numel() * piece.element_size()
                choice = self.plan.choice(nbytes)
                started.algorithm = choice.algorithm
                algo = self.algorithm_for(choice.algorithm)
                # A third party's `start`, written before ``scale``, is called without it.
                options: dict[str, Any] = {}
                if algo.folds_scale and not staged:
                    options["scale"] = scale
                elif not staged:  # a staged message was scaled as it was gathered (`_stage`)
                    piece.mul_(scale)
                if algo.leaves_result and len(pieces) == 1:
                    options["leave_within"] = within
                ticket = None
                if stream is not None and self.clock is not None and algo.asynchronous:
                    ticket = self.clock.expect(nbytes, AUTOTUNE)
                marks: list[DeviceEvent] = []
                if stream is not None:
                    self._stamp(marks, stream)  # the side stream has waited for the gradient
                begin = time.perf_counter()
                pending = algo.start(
                    piece, self.channel, segment_bytes=choice.segment_bytes, **options
                )
                stopped = self._mark_end(pending, marks) if stream is not None else None
                traffic = pending.traffic
                first_wait = traffic.first_wait_s if traffic is not None else None
                sent = traffic.bytes_sent if traffic is not None else None
                waited = traffic.wait_s if traffic is not None else None
                if traffic is not None and traffic.result is not None:
                    started.flat = traffic.result  # a whole message: `_leave_within`
                # A Python-driven algorithm on CPU has finished here: its time is its own, not
                # the wait behind earlier messages. (On CUDA only the stream knows.)
                done = time.perf_counter() if pending.done and stream is None else None
                started.pieces.append(
                    _Piece(
                        nbytes,
                        choice,
                        pending,
                        begin,
                        done,
                        first_wait,
                        sent,
                        wait_s=waited,
                        ticket=ticket,
                        marks=marks,
                        stopped=stopped,
                    )
                )

    def _stage(self, started: _Started, within: int) -> bool:
        """Gather a fused message's buckets, scaled, straight into the memory its algorithm
        would copy it into (`AllReduceAlgorithm.stage`: `shm`'s slot), where it leaves the sum
        for the buckets to take within ``within`` bytes (`_leave_within`): one pass over the
        buckets where a concatenation and the algorithm's copy of it were two. True where it
        did."""
        buckets = started.buckets
        element_size = buckets[0].buffer.element_size()
        nbytes = sum(b.nbytes for b in buckets)
        if len(self._piece_sizes(nbytes, element_size)) > 1:
            return False
        algo = self.algorithm_for(self.plan.choice(nbytes).algorithm)
        if not algo.leaves_result:
            return False
        flat = algo.stage(self.channel, nbytes, buckets[0].buffer.dtype, within)
        if flat is None:
            return False
        offset, scale = 0, 1.0 / self.world_size
        for b in buckets:
            n = b.buffer.numel()
            torch.mul(b.buffer, scale, out=flat[offset : offset + n])
            offset += n
        started.flat = flat
        return True

    def _leave_within(self, first: _Bucket) -> int | None:
        """How many bytes of messages may follow one that starts at bucket ``first`` before
        its sum must have been taken, where an algorithm leaves it in memory of its own
        (`AllReduceAlgorithm.leaves_result`): an iteration's, since DDP copies every bucket's
        result into the gradients at the end of backward, before any rank's next iteration
        sends anything. None in the first iteration, whose buckets are not all known yet: the
        same on every rank, as the algorithm's choice of where to sum must be."""
        if first.iteration == 0:
            return None
        return sum(nbytes for nbytes, _ in self.layout)

    def _mark_end(
        self, pending: Pending, marks: list[DeviceEvent]
    ) -> torch.futures.Future[Any] | None:
        """Record the end event of a message started on the side stream (current here), where
        its work ends on the GPU and before anything waits for it: in its future's callback,
        which runs with streams current that wait for the backend's work (NCCL's: at once); else
        now, the side stream having waited for the schedule's work. The future returned, if
        any, completes once the event is recorded."""
        if pending.future is not None and not pending.done:
            return pending.future.then(lambda _: self._stamp(marks))
        self._stamp(marks)
        return None

    def _stamp(self, marks: list[DeviceEvent], stream: Any = None) -> None:
        """Append to ``marks`` a timing event recorded now on ``stream`` (None: the current)."""
        assert self.gpu is not None
        event = self.gpu.event()
        event.record(stream)
        marks.append(event)

    def _complete_early(self, bucket: _Bucket, piece: _Piece) -> None:
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
        gpu = self.gpu

        def done(fut: torch.futures.Future[list[torch.Tensor]]) -> None:
            # On CUDA the callback runs with streams current that wait for the all-reduce
            # (torch.futures.Future.add_done_callback): what it records or completes here
            # follows the all-reduce on the GPU, while the host goes on.
            piece.finished = time.perf_counter()
            if piece.marks and gpu is not None:
                self._stamp(piece.marks)
            try:
                fut.value()
            except Exception:
                return
            with self._completing:
                if not bucket.future.done():
                    bucket.future.set_result(bucket.buffer)

        future.add_done_callback(done)

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
            with self._progress:
                self._progress.notify_all()  # a submit or settle waiting on this thread
            if first:
                self._emit(Failure(error))
            for b in [*started.buckets, *stranded]:
                self._fail(b.future, error)

    def _finish(self, started: _Started) -> None:
        with self._side() as stream:
            buckets = started.buckets
            finished = 0.0
            on_gpu: list[tuple[_Piece, int]] = []
            for piece in started.pieces:
                started.algorithm = piece.choice.algorithm
                # On CUDA the side stream waits for NCCL's; with a timeout (autotune's) the
                # host waits too, here, off the step (the lane's futures are complete).
                piece.pending.wait()
                if piece.stopped is not None:
                    piece.stopped.wait()  # the callback that records its end event has run
                if piece.early:
                    buckets[0].future.wait()  # the callback has run: it timed the message
                finished = piece.finished or time.perf_counter()
                if started.sparse:
                    continue
                if len(piece.marks) == 2:  # on the GPU's clock: read once the futures are done
                    on_gpu.append((piece, self.iteration))
                    continue
                self._emit(self._record(piece, finished - piece.started, self.iteration))
            if started.flat is not buckets[0].buffer:  # fused, or the sum left elsewhere
                offset = 0
                for b in buckets:
                    n = b.buffer.numel()
                    b.result = _at_storage_start(started.flat[offset : offset + n])
                    offset += n
            early = started.pieces[-1].early if started.pieces else False
            if buckets[-1].is_last:
                self.iteration += 1
                begin = time.perf_counter()
                # Where backward was released: at this bucket's completion (the backend's
                # callback, or here), or later at an earlier bucket's, whose message the lane's
                # overtook: that wait belongs to this iteration's step, not the next one's.
                end = max(finished if early else begin, self._completed_at)
                exposed = max(0.0, end - self._last_bucket_at)
                if self.step_clock is None:
                    self.step_clock = StepClock(None if self.gpu is None else self.gpu.event)
                # On the GPU: where the iteration's last message ended there, recorded before
                # any wait (a mark recorded here would say when this thread got here).
                last = started.pieces[-1].marks if started.pieces else []
                mark = last[-1] if len(last) == 2 else None
                timed = self.step_clock.end(self.iteration, end, stream, mark)
                step_of, step = (None, None) if timed is None else timed
                self._emit(IterationEnd(self.iteration, exposed, step, step_of))
                took = time.perf_counter() - begin
                self._emit(IterationRecord(self.iteration, exposed, took))
                with self._progress:
                    self._ended += 1
                    self._progress.notify_all()
            if started.sparse:
                future = started.pieces[0].pending.future
                assert future is not None
                buckets[0].future.set_result(future.value()[0])
                self._completed_at = time.perf_counter()
            elif not early:
                # With the comm stream current, a CUDA future records its completion there.
                for b in buckets:
                    b.future.set_result(b.buffer if b.result is None else b.result)
                self._completed_at = time.perf_counter()
            else:
                self._completed_at = max(self._completed_at, finished)
            for piece, iteration in on_gpu:
                start, stop = piece.marks
                stop.synchronize()  # the GPU is there, or nearly: the work was waited for
                took = start.elapsed_time(stop) / 1000.0
                kernel = None
                if piece.ticket is not None and self.clock is not None:
                    kernel = self.clock.seconds(piece.ticket)  # None: no record in time
                self._emit(self._record(piece, took, iteration, "cuda", kernel))
            if buckets[-1].is_last:
                self._emit(IterationDone(self.iteration))
                with self._progress:
                    self._done += 1
                    self._progress.notify_all()

    def _record(
        self,
        piece: _Piece,
        seconds: float,
        iteration: int,
        timer: str = "host",
        kernel_s: float | None = None,
    ) -> MessageRecord:
        return MessageRecord(
            iteration=iteration,
            size_class=size_class(piece.nbytes),
            nbytes=piece.nbytes,
            algorithm=piece.choice.algorithm,
            segment_bytes=piece.choice.segment_bytes,
            seconds=seconds,
            first_wait_s=piece.first_wait_s,
            wait_s=piece.wait_s,
            world_size=self.world_size,
            started=piece.started,
            sent_bytes=piece.sent_bytes,
            timer=timer,
            kernel_s=kernel_s,
        )

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

    def _fail(self, future: torch.futures.Future[torch.Tensor], error: BaseException) -> None:
        # A listener after the last bucket's result (IterationDone) can fail once its futures
        # are complete, and the backend's callback completes some itself; those keep their
        # result, and the failure goes to the buckets after them.
        with self._completing:
            if future.done():
                return
            # torch annotates set_exception as taking the result type; it takes the exception.
            future.set_exception(error)  # type: ignore[arg-type]

    @contextlib.contextmanager
    def _side(self) -> Iterator[Any]:
        """On CUDA, the GPU's side stream made current (yielded); None elsewhere."""
        if self.gpu is None:
            yield None
            return
        with self.gpu.side() as stream:
            yield stream
