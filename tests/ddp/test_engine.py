"""The engine in one process: fusion and splitting decisions, values, ordering, failure.

A stand-in algorithm records each message and multiplies it by a factor instead of talking to
peers, so every decision the engine makes is visible and checkable.
"""

from __future__ import annotations

import contextlib
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from autotune.algorithms import AllReduceAlgorithm, Comm, PeerError, Pending
from autotune.ddp.engine import Engine
from autotune.ddp.events import Event, IterationDone, IterationEnd
from autotune.ddp.gpu import Gpu, side
from autotune.ddp.messages import message_sizes
from autotune.ddp.stats import Recorder
from autotune.plan import Choice, Plan, size_class


class Recording(AllReduceAlgorithm):
    """Pretends the other ranks hold identical data: the sum is ``world_size`` times the input."""

    name = "recording"

    def __init__(self, world_size: int, fail_at: int | None = None) -> None:
        super().__init__()
        self.world_size = world_size
        self.fail_at = fail_at
        self.messages: list[int] = []  # bytes of each message, in order

    def start(  # type: ignore[no-untyped-def]
        self, tensor, group=None, *, segment_bytes=None, scale=None, leave_within=None
    ) -> Pending:
        if self.fail_at is not None and len(self.messages) == self.fail_at:
            raise PeerError(
                "recording all-reduce: receive from rank 3 did not finish within 0:00:01"
            )
        self.messages.append(tensor.numel() * tensor.element_size())
        tensor.mul_(self.world_size)
        return Pending()

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        raise AssertionError("start is overridden")


def make_engine(fusion_bytes: int, world_size: int = 4, fail_at: int | None = None):  # type: ignore[no-untyped-def]
    algo = Recording(world_size, fail_at)
    recorder = Recorder()
    engine = Engine(
        group=None,  # type: ignore[arg-type]
        world_size=world_size,
        plan=Plan(Choice("recording")),
        algorithm_for=lambda name: algo,
        fusion_bytes=fusion_bytes,
    )
    engine.subscribe(recorder.record)
    return engine, algo, recorder


def on_two_ranks(algo: AllReduceAlgorithm, name: str = "recording", **options: Any) -> Engine:
    """An engine of 2 ranks whose every message runs ``algo`` (named ``name``)."""
    return Engine(
        group=None,  # type: ignore[arg-type]
        world_size=2,
        plan=Plan(Choice(name)),
        algorithm_for=lambda _: algo,
        **options,
    )


def submit_iteration(engine: Engine, sizes: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Submit float32 buckets of ``sizes`` elements, then wait, as DDP does (a fused bucket's
    future completes only once a later bucket or the last one flushes it); return (input, result).
    """
    originals = [torch.randn(n) for n in sizes]
    futures = [
        engine.submit(x.clone(), is_last=i == len(sizes) - 1) for i, x in enumerate(originals)
    ]
    return [(x, f.wait()) for x, f in zip(originals, futures, strict=True)]


@pytest.mark.parametrize(
    ("fusion_bytes", "sizes", "messages"),
    [
        # Sizes are float32 elements; messages are bytes. 0: DDP's buckets, untouched.
        (0, [100, 300, 50], [400, 1200, 200]),
        # Small buckets fuse up to 1 KiB (800 + 400 would not fit); the last always flushes.
        (1024, [100, 100, 100, 20], [800, 480]),
        (1024, [50, 60, 20], [520]),
        # A bucket of at least fusion_bytes goes alone, cut into near-equal pieces <= 1 KiB.
        (1024, [1000], [1000, 1000, 1000, 1000]),
        (1024, [10, 1000, 10], [40, 1000, 1000, 1000, 1000, 40]),
        (1024, [300], [600, 600]),
        # A bucket of exactly fusion_bytes is one message.
        (1024, [256], [1024]),
    ],
)
def test_fusion_and_splitting(fusion_bytes: int, sizes: list[int], messages: list[int]) -> None:
    engine, algo, _ = make_engine(fusion_bytes)
    results = submit_iteration(engine, sizes)
    engine.close()
    assert algo.messages == messages
    # What the tuner predicts of a fusion size from the buckets alone is what the engine ran.
    assert message_sizes(engine.buckets, fusion_bytes) == messages
    # Averaged: scaled by 1/4, then "summed" (x4 here): the input comes back, to rounding.
    for original, value in results:
        assert value.shape == original.shape
        torch.testing.assert_close(value, original)
        # DDP reads a result with as_strided from its storage's start: a fused bucket's
        # slice of the message must start its own storage.
        assert value.storage_offset() == 0
        torch.testing.assert_close(value.as_strided(value.shape, (1,), 0), original)


def test_every_message_is_recorded() -> None:
    engine, _, recorder = make_engine(1024)
    submit_iteration(engine, [100, 1000, 10])
    engine.close()
    records = recorder.records()
    assert [r.nbytes for r in records] == [400, 1000, 1000, 1000, 1000, 40]
    assert [r.size_class for r in records] == [512, 1024, 1024, 1024, 1024, 64]
    assert {r.algorithm for r in records} == {"recording"}
    assert all(r.seconds >= 0 and r.world_size == 4 for r in records)
    assert all(r.iteration == 0 for r in records)
    assert engine.iteration == 1


def test_the_layout_is_the_first_iterations_buckets_before_fusion() -> None:
    # What names the job's plan (`autotune.storage.workload_name`): DDP's buckets as it first
    # builds them, whatever the engine fuses them into, and not the later iterations' (DDP
    # rebuilds its buckets after the first).
    engine, algo, _ = make_engine(1024)
    submit_iteration(engine, [100, 100, 100, 20])
    submit_iteration(engine, [320])
    engine.close()
    assert algo.messages == [800, 480, 640, 640]
    assert engine.layout == [(400, "float32"), (400, "float32"), (400, "float32"), (80, "float32")]
    assert engine.buckets == [(1280, "float32")]  # the latest iteration's


def test_iteration_end_runs_before_the_last_futures_complete_and_after_after() -> None:
    engine, _, recorder = make_engine(0)
    seen: list[tuple[str, int, bool]] = []
    # The listener runs on the finishing thread: the lock makes them see each submitted future
    # in its iteration's list, and the lists are never cleared under them.
    lock = threading.Lock()
    batches: list[list[torch.futures.Future[torch.Tensor]]] = []

    def note(kind: str, it: int) -> None:
        with lock:
            seen.append((kind, it, batches[it - 1][-1].done()))

    def listen(event: Event) -> None:
        if isinstance(event, IterationEnd):
            note("end", event.iteration)
        elif isinstance(event, IterationDone):
            note("after", event.iteration)

    engine.subscribe(listen)
    for _ in range(3):
        futures: list[torch.futures.Future[torch.Tensor]] = []
        batches.append(futures)
        for i in range(2):
            with lock:
                futures.append(engine.submit(torch.ones(8), is_last=i == 1))
        futures[-1].wait()
    engine.close()
    assert seen == [(kind, it, kind == "after") for it in (1, 2, 3) for kind in ("end", "after")]
    iterations = recorder.iterations()
    assert [r.iteration for r in iterations] == [1, 2, 3]
    assert all(r.exposed_s >= 0 and r.tuner_s >= 0 for r in iterations)


def test_a_failing_iteration_done_listener_fails_later_buckets_not_finished_ones() -> None:
    engine, _, _ = make_engine(0)

    def broken(event: Event) -> None:
        if isinstance(event, IterationDone):
            raise ValueError(f"listener broke after iteration {event.iteration}")

    engine.subscribe(broken)
    finished = engine.submit(torch.ones(8), is_last=True)
    assert finished.wait().eq(1).all()  # completed before the listener ran; keeps its result
    later = engine.submit(torch.ones(8), is_last=True)
    with pytest.raises(ValueError, match="after iteration 1"):
        later.wait()
    assert finished.wait().eq(1).all()
    assert isinstance(engine.error, ValueError)
    engine.close()


def test_a_failure_fails_every_pending_and_later_bucket() -> None:
    engine, _, _ = make_engine(0, fail_at=1)
    futures = [engine.submit(torch.ones(8), is_last=i == 3) for i in range(4)]
    assert futures[0].wait().eq(1).all()
    for f in futures[1:]:
        with pytest.raises(RuntimeError, match="rank 3 did not finish"):
            f.wait()
    later = engine.submit(torch.ones(8), is_last=True)
    with pytest.raises(RuntimeError, match="rank 3"):
        later.wait()
    assert isinstance(engine.error, PeerError)
    engine.close()


def test_submit_returns_before_the_message_runs() -> None:
    gate = threading.Event()

    class Slow(Recording):
        def start(  # type: ignore[no-untyped-def]
            self, tensor, group=None, *, segment_bytes=None, scale=None, leave_within=None
        ) -> Pending:
            gate.wait(10)
            return super().start(tensor)

    engine = on_two_ranks(Slow(2))
    fut = engine.submit(torch.ones(4), is_last=False)
    assert not fut.done()  # the caller (autograd) is free while the message waits
    gate.set()
    assert fut.wait().eq(1).all()
    engine.close()


class Held(Recording):
    """Starts each message once ``gate`` is open, noting on which thread, and takes
    ``seconds`` (the last message's start raises ``interrupt`` where one is given)."""

    def __init__(self, gate: threading.Event, seconds: float = 0.0) -> None:
        super().__init__(world_size=2)
        self.gate, self.seconds = gate, seconds
        self.threads: list[str] = []
        self.interrupt: BaseException | None = None

    def start(  # type: ignore[no-untyped-def]
        self, tensor, group=None, *, segment_bytes=None, scale=None, leave_within=None
    ) -> Pending:
        assert self.gate.wait(10)
        self.threads.append(threading.current_thread().name)
        time.sleep(self.seconds)
        if self.interrupt is not None:
            raise self.interrupt
        return super().start(tensor)


def test_the_last_message_runs_on_the_submitting_thread_where_nothing_is_ahead() -> None:
    gate = threading.Event()
    gate.set()
    algo = Held(gate, seconds=0.05)
    engine = on_two_ranks(algo)
    here = threading.current_thread().name
    first = engine.submit(torch.ones(4), is_last=False)
    assert first.wait().eq(1).all()  # the start thread has nothing left
    assert engine.ran_here_s == 0.0
    last = engine.submit(torch.ones(6), is_last=True)
    # Backward has nothing left but to wait for it: it ran here, and the submit took its time.
    assert algo.threads == ["autotune-start", here]
    assert engine.ran_here_s >= 0.05
    assert last.wait().eq(1).all()
    assert engine.settle(10)
    engine.close()


def test_the_last_message_waits_its_turn_behind_one_still_starting() -> None:
    gate = threading.Event()
    algo = Held(gate)
    engine = on_two_ranks(algo)
    futures = [engine.submit(torch.ones(n), is_last=n == 6) for n in (4, 6)]
    assert engine.ran_here_s == 0.0 and not futures[1].done()  # behind the first, in order
    gate.set()
    assert [f.wait().numel() for f in futures] == [4, 6]
    engine.close()
    assert algo.threads == ["autotune-start", "autotune-start"]
    assert algo.messages == [16, 24]


def test_an_interrupt_in_the_last_message_goes_up_through_backward() -> None:
    gate = threading.Event()
    gate.set()
    algo = Held(gate)
    algo.interrupt = KeyboardInterrupt()
    engine = on_two_ranks(algo)
    with pytest.raises(KeyboardInterrupt):
        engine.submit(torch.ones(4), is_last=True)
    assert engine.settle(10)
    # The engine stops there, saying why (a future fails with an Exception only).
    assert isinstance(engine.error, RuntimeError)
    assert "the last message was interrupted (KeyboardInterrupt)" in str(engine.error)
    assert isinstance(engine.error.__cause__, KeyboardInterrupt)
    later = engine.submit(torch.ones(4), is_last=False)
    with pytest.raises(RuntimeError, match="interrupted"):
        later.wait()
    engine.close()


class Threaded(Recording):
    """Records the thread each message starts on, and its order across instances."""

    def __init__(
        self, name: str, asynchronous: bool, order: list[str], gate: threading.Event
    ) -> None:
        super().__init__(world_size=1)
        self.name = name  # type: ignore[misc]
        self.asynchronous = asynchronous  # type: ignore[misc]
        self.order = order
        self.gate = gate
        self.threads: list[str] = []

    def start(  # type: ignore[no-untyped-def]
        self, tensor, group=None, *, segment_bytes=None, scale=None, leave_within=None
    ) -> Pending:
        assert self.gate.wait(10)
        self.threads.append(threading.current_thread().name)
        self.order.append(f"{self.name}:{tensor.numel()}")
        return super().start(tensor)

    def connect(self, group, device, *, dedicated=True):  # type: ignore[no-untyped-def]
        return SimpleNamespace(backend="gloo")  # no peers here; `launch` takes what it gave

    def launch(self, buf, comm) -> Pending:  # type: ignore[no-untyped-def]
        return self.start(buf)


def test_the_lane_launches_at_once_and_finishes_in_order() -> None:
    order: list[str] = []
    opened, held = threading.Event(), threading.Event()
    opened.set()
    fast = Threaded("async", True, order, opened)
    slow = Threaded("sync", False, order, held)  # runs only once everything is submitted
    algos = {"async": fast, "sync": slow}
    # Messages up to 1 KiB run the asynchronous algorithm, larger ones the Python-driven one.
    plan = Plan(lambda cls: Choice("async" if cls <= 1024 else "sync"))
    engine = Engine(
        group=None,  # type: ignore[arg-type]
        world_size=1,
        plan=plan,
        algorithm_for=algos.__getitem__,
    )
    recorder = Recorder()
    engine.subscribe(recorder.record)
    engine.submit(torch.ones(10), is_last=True).wait()
    # Behind a Python-driven message the lane still launches right here, on the submitting
    # thread (whether a message takes the lane must not depend on timing: ranks would disagree
    # on its group). The completing thread still takes the messages in submission order.
    futures = [
        engine.submit(torch.ones(1000), is_last=False),
        engine.submit(torch.ones(20), is_last=False),
        engine.submit(torch.ones(30), is_last=True),
    ]
    held.set()
    for f in futures:
        f.wait()
    assert engine.settle(10)
    engine.close()
    assert order == ["async:10", "async:20", "async:30", "sync:1000"]
    assert fast.threads == [threading.current_thread().name] * 3
    assert slow.threads == ["autotune-start"]
    assert [r.nbytes for r in recorder.records()] == [40, 4000, 80, 120]
    assert [r.iteration for r in recorder.iterations()] == [1, 2]


class Backend(AllReduceAlgorithm):
    """An algorithm the backend runs: each message's future is completed by the test."""

    asynchronous = True

    def __init__(self, name: str, launched: list[str]) -> None:
        super().__init__()
        self.name = name  # type: ignore[misc]
        self.launched = launched
        self.futures: list[torch.futures.Future[list[torch.Tensor]]] = []

    def connect(self, group, device, *, dedicated=True):  # type: ignore[no-untyped-def]
        return SimpleNamespace(backend="gloo")

    def launch(self, buf, comm) -> Pending:  # type: ignore[no-untyped-def]
        future: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
        self.futures.append(future)
        self.launched.append(f"{self.name}:{buf.numel()}")

        def wait() -> None:
            future.wait()  # raises the backend's error, as a real wait does

        return Pending(wait, future=future)

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        raise AssertionError("launch is overridden")


def on_backend(algo: Backend, **options: Any) -> Engine:
    """An engine of 2 ranks whose every message runs ``algo`` (named "a")."""
    return on_two_ranks(algo, "a", **options)


def test_the_backends_callback_completes_a_lone_bucket_and_plans_switch_in_step() -> None:
    launched: list[str] = []
    algos = {"a": Backend("a", launched), "b": Backend("b", launched)}
    engine = Engine(
        group=None,  # type: ignore[arg-type]
        world_size=2,
        plan=Plan(Choice("a")),
        algorithm_for=algos.__getitem__,
    )
    entered, release = threading.Event(), threading.Event()

    def switch_at_end(event: Event) -> None:
        if isinstance(event, IterationEnd) and event.iteration == 1:
            entered.set()
            assert release.wait(10)
            engine.plan.replace({size_class(24): Choice("b")})  # as the tuner does here
            launched.append("end:1")

    engine.subscribe(switch_at_end)
    engine.switch_at(1)  # announced, as the tuner does when its exchange will land there
    first = engine.submit(torch.full((6,), 4.0), is_last=True)
    algos["a"].futures[0].set_result([])
    # Backward is released by the backend's completion, while the engine's thread is still busy
    # in the iteration's end.
    assert first.wait().eq(2.0).all()  # averaged: scaled by 1/2 (the fake adds nothing)
    assert entered.wait(10)
    # The next iteration's first bucket waits for that end: it runs on the switched plan.
    timer = threading.Timer(0.2, release.set)
    timer.start()
    second = engine.submit(torch.full((6,), 4.0), is_last=True)
    timer.join()
    algos["b"].futures[0].set_result([])
    assert second.wait().eq(2.0).all()
    assert engine.settle(10)
    engine.close()
    assert launched == ["a:6", "end:1", "b:6"]


def test_an_iteration_ends_when_its_last_message_is_done_not_its_last_bucket() -> None:
    # The last bucket takes the lane and the backend completes it first; a Python-driven message
    # before it is still running. Backward goes on only once both are done, so that is where the
    # iteration ends: stamped at the lane's completion, a challenger's slow first bucket would
    # count in the next iteration's step, which a paired test gives to the other plan.
    launched: list[str] = []
    held = threading.Event()
    lane = Backend("a", launched)
    algos = {"a": lane, "sync": Threaded("sync", False, launched, held)}
    engine = Engine(
        group=None,  # type: ignore[arg-type]
        world_size=1,
        plan=Plan(lambda cls: Choice("a" if cls <= 1024 else "sync")),
        algorithm_for=algos.__getitem__,
    )
    ends: list[IterationEnd] = []
    engine.subscribe(lambda e: ends.append(e) if isinstance(e, IterationEnd) else None)
    futures = [engine.submit(torch.ones(1000), is_last=False)]
    futures.append(engine.submit(torch.ones(30), is_last=True))
    submitted = time.perf_counter()  # after submit stamped the last bucket's hand-over
    lane.futures[0].set_result([])
    futures[1].wait()  # the backend's callback completed the lane's bucket
    time.sleep(0.05)  # not timed: only so that an iteration ended too early shows by far
    released = time.perf_counter()
    held.set()
    futures[0].wait()
    assert engine.settle(10)
    engine.close()
    assert launched == ["a:30", "sync:1000"]
    (end,) = ends
    # Causal, not timed: the iteration cannot have ended before its first message was let run.
    assert end.exposed_s >= released - submitted, (end, released - submitted)


def test_without_a_switch_announced_the_next_iteration_does_not_wait_for_the_end() -> None:
    launched: list[str] = []
    algo = Backend("a", launched)
    engine = on_backend(algo)
    entered, release = threading.Event(), threading.Event()

    def slow_end(event: Event) -> None:
        if isinstance(event, IterationEnd) and event.iteration == 1:
            entered.set()
            assert release.wait(10)
            launched.append("end:1")

    engine.subscribe(slow_end)
    first = engine.submit(torch.ones(4), is_last=True)
    algo.futures[0].set_result([])
    first.wait()
    assert entered.wait(10)
    timer = threading.Timer(5.0, release.set)  # only so that a broken engine cannot hang here
    timer.start()
    second = engine.submit(torch.ones(4), is_last=True)  # launched while the end still runs
    launched.append("submitted:2")
    release.set()
    timer.cancel()
    algo.futures[1].set_result([])
    second.wait()
    assert engine.settle(10)
    engine.close()
    assert launched == ["a:4", "a:4", "submitted:2", "end:1"]


def test_a_failed_backend_message_fails_its_bucket_with_the_diagnosed_error() -> None:
    launched: list[str] = []
    algo = Backend("a", launched)
    engine = on_backend(
        algo, diagnose=lambda error, name: PeerError(f"{name} failed: rank 1 died ({error})")
    )
    future = engine.submit(torch.ones(4), is_last=True)
    # torch annotates set_exception as taking the result type; it takes the exception.
    algo.futures[0].set_exception(RuntimeError("Connection closed by peer"))  # type: ignore[arg-type]
    with pytest.raises(PeerError, match=r"a failed: rank 1 died .*Connection closed by peer"):
        future.wait()
    assert engine.settle(10)  # a failure settles it
    later = engine.submit(torch.ones(4), is_last=True)  # does not wait for a dead engine
    with pytest.raises(PeerError, match="rank 1 died"):
        later.wait()
    engine.close()


def test_settle_waits_until_every_submitted_iteration_is_recorded() -> None:
    launched: list[str] = []
    algo = Backend("a", launched)
    engine = on_backend(algo)
    recorder = Recorder()
    engine.subscribe(recorder.record)
    for _ in range(3):
        futures = [engine.submit(torch.ones(n), is_last=n == 3) for n in (1, 2, 3)]
        for backend in algo.futures[-3:]:
            backend.set_result([])
        for f in futures:
            f.wait()
    assert engine.settle(10)
    assert [r.nbytes for r in recorder.records()] == [4, 8, 12] * 3
    assert [r.iteration for r in recorder.iterations()] == [1, 2, 3]
    engine.close()


def test_a_cuda_message_starts_inline_with_the_lock_held(monkeypatch: pytest.MonkeyPatch) -> None:
    # The submitting thread starts an asynchronous algorithm's message itself, with the engine's
    # lock held; on CUDA that start picks the device's side stream. That pick once took the same
    # (non-reentrant) lock: the first DDP step on a GPU hung (seen on an H200, never on CPU).
    made: list[torch.device] = []

    class Stream:
        def __init__(self, device: torch.device) -> None:
            made.append(device)

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    engine = on_backend(Backend("a", []), gpu=Gpu(torch.device("cuda", 0)))
    got: list[object] = []

    def pick() -> None:
        with engine._lock:  # as `_dispatch` holds it
            for _ in range(2):
                with side(engine.gpu) as stream:
                    got.append(stream)

    t = threading.Thread(target=pick, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "picking the stream waited for the lock its caller holds"
    assert made == [torch.device("cuda", 0)]  # one stream per device, kept
    assert got[0] is got[1] and isinstance(got[0], Stream)
    engine.close()
