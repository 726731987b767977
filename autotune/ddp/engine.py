"""Runs the hook's all-reduces off the autograd thread, one message at a time, in bucket order.

`Engine.submit` takes each bucket from the hook and returns a future. Buckets are fused or split
into messages as they are submitted (the same way on every rank, since every rank sees the same
buckets in the same order). An issuing thread starts each message with the plan's choice for its
size class; a completing thread waits for them in the same order, records what it measured
(`autotune.ddp.stats`), emits events (`autotune.ddp.events`) and completes the buckets' futures.
A message the backend runs itself (`native`) is in flight while the next one starts, as DDP's
own all-reduces are.

A bucket the backend all-reduces as one message takes the lane (`autotune.ddp.lane`): launched on
the submitting thread, completed by the backend's own callback. How buckets become messages, and
what a message measured, is `autotune.ddp.messages`. Plan switches stay in step on every rank
because, where the tuner announced one (`Engine.switch_at`), an iteration's first bucket waits
until the completing thread has handled the previous iteration's end (`IterationEnd`, where the
switch happens); elsewhere that thread may lag up to two iterations (`autotune.ddp.progress`).
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Callable

import torch
from torch.distributed import ProcessGroup

from autotune.algorithms import AllReduceAlgorithm, wire_of
from autotune.ddp.events import Event, Failure, IterationDone, IterationEnd, Listener
from autotune.ddp.gpu import Gpu, side
from autotune.ddp.kernel_clock import AUTOTUNE, KernelClock
from autotune.ddp.lane import Lane
from autotune.ddp.messages import (
    CAST_SAMPLE_EVERY,
    Bucket,
    Message,
    Piece,
    Prepared,
    joins,
    leave_within,
    mark_end,
    piece_sizes,
    pieces,
    stage,
    stamp,
)
from autotune.ddp.progress import Progress
from autotune.ddp.stats import IterationRecord
from autotune.ddp.step_clock import DeviceEvent, StepClock
from autotune.plan import Plan

__all__ = ["Engine"]

#: The engines open in this process. The last message runs on the autograd thread only where
#: one is (`Engine._dispatch`): in one backward of several hooked models, the others may not.
_engines: weakref.WeakSet[Engine] = weakref.WeakSet()


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
        #: Where autotune's algorithms talk (`autotune.comm.groups.p2p_group`): ``group``, unless
        #: the owner gives the engine a channel of its own (`AutotuneState` does, before use).
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
        #: The buckets of the first iteration, as DDP first builds them: (bytes, dtype) each, set
        #: at its last bucket (what names the job's plan, `autotune.storage.workload_name`);
        #: ``buckets``: the latest iteration's, once DDP has rebuilt them (`message_sizes`).
        self.layout: list[tuple[int, str]] = []
        self.buckets: list[tuple[int, str]] = []
        self._seen: list[tuple[int, str]] = []
        self.iteration = 0
        self._pending: list[Bucket] = []
        self._starting = 0  # messages queued for, or being started by, the start thread
        self._last_bucket_at = 0.0  # when backward handed over its last bucket
        #: The step's clock: the host's, or the GPU's on CUDA (`autotune.ddp.step_clock`); made at
        #: the first iteration's end, for its device.
        self.step_clock: StepClock | None = None
        self._completed_at = 0.0  # when the latest bucket's future completed (completing thread)
        self._lock = threading.Lock()
        self._progress = Progress()
        self._completing = threading.Lock()  # one of set_result / set_exception per future
        # Started messages whose futures the backend completes, handed to the completing thread
        # together (at the last bucket, or before anything else): it wakes once an iteration.
        self._held: list[Message] = []
        self._run_here: list[Bucket] | None = None  # to run on the submitting thread: `_dispatch`
        self.ran_here_s = 0.0  # seconds the latest `submit` ran a message there
        self._lane = Lane(group, world_size, algorithm_for, self._completing)
        self._casts = 0  # pieces sent on a compressed wire (the start thread's count)
        self._closing = False
        # Buckets to start, or a message the lane started, to pass on in order.
        self._to_start: queue.SimpleQueue[list[Bucket] | Message | None] = queue.SimpleQueue()
        self._to_finish: queue.SimpleQueue[Message | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._threads = [
            threading.Thread(target=self._start_loop, name="autotune-start", daemon=True),
            threading.Thread(target=self._finish_loop, name="autotune-finish", daemon=True),
        ]
        for t in self._threads:
            t.start()
        _engines.add(self)

    def subscribe(self, listener: Listener) -> None:
        """Tell ``listener`` every `autotune.ddp.events.Event`, on the finishing thread, in order:
        it must be quick (it runs between messages) and must not raise."""
        self._listeners.append(listener)

    def _emit(self, event: Event) -> None:
        for listener in self._listeners:
            listener(event)

    def submit(self, buffer: torch.Tensor, is_last: bool) -> torch.futures.Future[torch.Tensor]:
        """Queue ``buffer`` (flat) to be averaged over the group; the future completes with it."""
        self._progress.bucket()
        if self.device is None:
            self.device, self.dtype = buffer.device, buffer.dtype
            if self.gpu is None:
                self.gpu = Gpu.of(buffer.device)
        dtype = str(buffer.dtype).removeprefix("torch.")
        sparse = "" if buffer.layout == torch.strided else f" {buffer.layout}"
        self._seen.append((buffer.numel() * buffer.element_size(), dtype + sparse))
        if is_last:
            self.buckets, self._seen = self._seen, []
            self.layout = self.layout or self.buckets
        future: torch.futures.Future[torch.Tensor] = (
            torch.futures.Future() if self.gpu is None else self.gpu.future()
        )
        bucket = Bucket(buffer, future, is_last, self._progress.submitted)
        with self._lock:
            if self._error is not None:
                self._fail(future, self._error)
                return future
            limit = self.fusion_bytes
            if buffer.layout != torch.strided:
                self._flush()  # the buckets before it go first, as on every rank
                self._hand_over(self._lane.sparse(bucket))
            else:
                if not joins(self._pending, bucket, limit):
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
        try:
            self.ran_here_s = 0.0 if self._run_here is None else self._run_last_here()
        finally:
            if is_last:
                self._progress.submitted_one()
        return future

    def _run_last_here(self) -> float:
        """Run the iteration's last message here (`_dispatch` says when); its seconds. A
        KeyboardInterrupt is the user's: it goes on up through backward, and the message fails
        with a RuntimeError saying so (a future takes no other kind)."""
        buckets, self._run_here, begin = self._run_here, None, time.perf_counter()
        assert buckets is not None
        started = self._started(buckets)
        took = time.perf_counter() - begin
        interrupt = None if isinstance(started.error, Exception) else started.error
        if interrupt is not None:
            name = type(interrupt).__name__
            started.error = RuntimeError(f"autotune: the last message was interrupted ({name})")
            started.error.__cause__ = interrupt
        self._to_finish.put(started)
        if interrupt is not None:
            raise interrupt
        return took

    @property
    def submitted(self) -> int:
        """Iterations whose last bucket was submitted (read it on the submitting thread)."""
        return self._progress.submitted

    def switch_at(self, iteration: int) -> None:
        """The plan may change at the end of ``iteration`` (a listener will switch it there, at
        `IterationEnd`): the next iteration's first bucket waits for that end. Say so by the
        end of the iteration before it (at its `IterationDone`)."""
        self._progress.switch_at(iteration)

    def forget_step(self) -> None:
        """The next iteration's step is not timed: the model ran iterations without the hook
        since the last one ended (`autotune.tuning.plain_check`). Call it between iterations,
        settled."""
        if self.step_clock is not None:
            self.step_clock.forget()

    def settle(self, timeout_s: float | None = None) -> bool:
        """Wait until every submitted iteration has been handled on the completing thread (its
        records and events are out): True, or False at the timeout. A failure settles it too."""
        return self._progress.settle(timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the workers once they have run what is queued (or at the timeout)."""
        with self._lock:
            self._closing = True  # what is flushed here is not on the autograd thread
            _engines.discard(self)
            self._flush()
            self._release()
        self._to_start.put(None)
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    @property
    def _alone(self) -> bool:  # the process's only engine, open, on CPU
        return self.gpu is None and not self._closing and len(_engines) == 1

    @property
    def error(self) -> BaseException | None:
        """The failure that stopped the engine, if any."""
        return self._error

    def _flush(self) -> None:
        if self._pending:
            self._dispatch(self._pending)
            self._pending = []

    def _dispatch(self, buckets: list[Bucket]) -> None:
        """Start ``buckets`` here if that is only a launch and nothing is ahead; else queue them.

        Called with the lock held. An asynchronous algorithm (the backend's own collective) is
        started on the submitting thread, as DDP starts its own all-reduces: a hop to the start
        thread would cost a thread wake-up per message. Anything Python-driven goes to the start
        thread, so that backward goes on computing; but an iteration's last message on CPU with
        nothing ahead of it runs on the autograd thread (`submit`, once the lock is let go):
        backward only waits for it, and the start thread's wake-up takes a millisecond or more
        where the ranks' backward keeps the cores busy (docs/BENCHMARKS.md, "Where it runs").
        """
        # Whether a message takes the lane depends on the plan and the bucket only, the same on
        # every rank: the lane and the rest talk on different groups. (Not at close: no backward.)
        if len(buckets) == 1 and not self._closing:
            direct = self._lane.launch(
                buckets[0], self.plan, self.fusion_bytes, self.gpu, self.clock
            )
            if direct is not None:
                self._hand_over(direct)
                return
        self._mark_ready(buckets)
        nbytes = sum(b.nbytes for b in buckets)
        inline = self._starting == 0 and all(
            self.algorithm_for(self.plan.choice(n).algorithm).asynchronous
            for n in piece_sizes(nbytes, buckets[0].buffer.element_size(), self.fusion_bytes)
        )
        self._release()  # ahead of what this puts, or the start thread will
        if inline:
            self._to_finish.put(self._started(buckets))
        elif buckets[-1].is_last and self._starting == 0 and self._alone:
            self._run_here = buckets
        else:
            self._starting += 1
            self._to_start.put(buckets)

    def _mark_ready(self, buckets: list[Bucket]) -> None:
        """On CUDA, mark each bucket's gradient ready on the stream that made it (the current
        one, on the submitting thread): a message that starts on the side stream waits for it."""
        if self.gpu is not None:
            for b in buckets:
                if b.ready is None:
                    b.ready = self.gpu.mark()

    def _hand_over(self, started: Message) -> None:
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

    def _release(self) -> None:
        """Hand the held messages to the completing thread (with the lock held)."""
        for started in self._held:
            self._to_finish.put(started)
        self._held.clear()

    def _start_loop(self) -> None:
        while (item := self._to_start.get()) is not None:
            started = item if isinstance(item, Message) else self._started(item)
            with self._lock:
                self._to_finish.put(started)
                self._starting -= 1
        self._to_finish.put(None)

    def _started(self, buckets: list[Bucket]) -> Message:
        started = Message(buckets, buckets[0].buffer)
        if self._error is None:
            try:
                self._start(started)
            except BaseException as exc:
                started.error = exc
        return started

    def _start(self, started: Message) -> None:
        buckets = started.buckets
        with side(self.gpu) as stream:
            if stream is not None:
                for b in buckets:
                    if b.ready is not None:  # recorded on the stream that produced it (CUDA)
                        stream.wait_event(b.ready)
            # Where the sum may be left (`leave_within`): decided once, for staging and start.
            within = leave_within(buckets[0], self.layout)
            staged = None
            # Only a fused message's choice is looked up whole (the plan notes each class it
            # is asked for), and a cast copy is not staged.
            first = self.plan.choice(started.nbytes) if len(buckets) > 1 else None
            if first is not None and within is not None and first.wire is None:
                algo = self.algorithm_for(first.algorithm)
                staged = stage(
                    buckets, algo, self.channel, within, self.world_size, self.fusion_bytes
                )
            if staged is not None:
                started.flat = staged
            elif len(buckets) > 1:
                started.flat = torch.cat([b.buffer for b in buckets])
            parts = pieces(started.flat, self.fusion_bytes)
            for piece in parts:
                nbytes = piece.numel() * piece.element_size()
                choice = self.plan.choice(nbytes)
                started.algorithm = choice.algorithm
                algo = self.algorithm_for(choice.algorithm)
                wire = wire_of(choice, piece.dtype)
                if wire is not None:
                    self._casts += 1
                sent = Prepared.of(
                    piece,
                    algo,
                    wire,
                    1.0 / self.world_size,
                    scaled=staged is not None,  # as it was gathered (`stage`)
                    whole=len(parts) == 1,
                    within=within,
                    measure=wire is not None and self._casts % CAST_SAMPLE_EVERY == 1,
                )
                ticket = None
                if stream is not None and self.clock is not None and algo.asynchronous:
                    ticket = self.clock.expect(nbytes, AUTOTUNE)
                marks: list[DeviceEvent] = []
                if stream is not None:
                    stamp(self.gpu, marks, stream)  # the side stream has waited for the gradient
                begin = time.perf_counter()
                pending = algo.start(
                    sent.tensor, self.channel, segment_bytes=choice.segment_bytes, **sent.options
                )
                stopped = mark_end(self.gpu, pending, marks) if stream is not None else None
                if pending.traffic is not None and pending.traffic.result is not None:
                    started.flat = pending.traffic.result  # a whole message: `leave_within`
                # A Python-driven algorithm on CPU has finished here: its time is its own, not
                # the wait behind earlier messages. (On CUDA only the stream knows.)
                done = time.perf_counter() if pending.done and stream is None else None
                piece_of = Piece.started_by(nbytes, choice, pending, begin, done)
                piece_of.ticket, piece_of.marks, piece_of.stopped = ticket, marks, stopped
                sent.apply(piece_of)
                started.pieces.append(piece_of)

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
                # Outside the lock: agreeing on the culprit waits on the store; submit must not.
                assert started.error is not None
                started.error = self._diagnose(started.error, started.algorithm)
            with self._lock:
                if first:
                    self._error = started.error
                error = self._error
                stranded, self._pending = self._pending, []  # submitted after the failure
            assert error is not None
            self._progress.fail()  # a submit or settle waiting on this thread
            if first:
                self._emit(Failure(error))
            for b in [*started.buckets, *stranded]:
                self._fail(b.future, error)

    def _finish(self, started: Message) -> None:
        with side(self.gpu) as stream:
            buckets = started.buckets
            finished = 0.0
            on_gpu: list[tuple[Piece, int]] = []
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
                piece.take_sum()  # from a compressed wire, after its time was taken
                if started.sparse:
                    continue
                if len(piece.marks) == 2:  # on the GPU's clock: read once the futures are done
                    on_gpu.append((piece, self.iteration))
                    continue
                seconds = finished - piece.started
                self._emit(piece.record(seconds, self.iteration, self.world_size))
            started.hand_back()
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
                self._progress.ended_one()
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
                took, kernel = piece.gpu_seconds(self.clock)
                self._emit(piece.record(took, iteration, self.world_size, "cuda", kernel))
            if buckets[-1].is_last:
                self._emit(IterationDone(self.iteration))
                self._progress.done_one()

    def _fail(self, future: torch.futures.Future[torch.Tensor], error: BaseException) -> None:
        # A listener after the last bucket's result (IterationDone) can fail once its futures
        # are complete, and the backend's callback completes some itself; those keep their
        # result, and the failure goes to the buckets after them.
        with self._completing:
            if future.done():
                return
            # torch annotates set_exception as taking the result type; it takes the exception.
            future.set_exception(error)  # type: ignore[arg-type]
