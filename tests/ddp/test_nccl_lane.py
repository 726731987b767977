"""On NCCL the hook's baseline (and every ``nccl.*`` cell) does what plain DDP does with a bucket:
the all-reduce is launched on the autograd thread with the gradient's stream current, and the
bucket's future completes from NCCL's own future, complete at launch; nothing of autotune's
synchronizes a stream, marks or waits for an event, or hops to another thread before backward
goes on. Played on the CPU (tests/support/played_gpu.py), counting what the engine asks of the
GPU."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from played_gpu import PlayedGpu, PlayedNccl

from autotune.algorithms import AllReduceAlgorithm, Comm, Pending
from autotune.ddp.engine import Engine
from autotune.ddp.events import IterationEnd
from autotune.ddp.stats import Recorder
from autotune.plan import Choice, Plan, size_class


def engine_on(
    gpu: PlayedGpu,
    algos: AllReduceAlgorithm | dict[str, AllReduceAlgorithm],
    world_size: int = 2,
    **options: Any,
) -> Engine:
    """An engine on the played ``gpu`` whose plan runs "a" everywhere: ``algos`` by name, or
    one algorithm for every name."""
    return Engine(
        group=None,  # type: ignore[arg-type]
        world_size=world_size,
        plan=Plan(Choice("a")),
        algorithm_for=algos.__getitem__ if isinstance(algos, dict) else lambda name: algos,
        gpu=gpu,  # type: ignore[arg-type]
        **options,
    )


def test_a_bucket_on_nccl_completes_at_launch_and_nothing_waits_for_the_gpu() -> None:
    gpu = PlayedGpu()
    nccl = PlayedNccl(gpu, took_ms=[3.0, 5.0])
    engine = engine_on(gpu, nccl)
    recorder = Recorder()
    engine.subscribe(recorder.record)
    me = threading.current_thread().name
    for _ in range(2):  # two iterations of two buckets
        for n, last in ((8, False), (4, True)):
            future = engine.submit(torch.ones(n), is_last=last)
            # Complete before NCCL has finished (its work is still held), and never handed to a
            # thread of autotune's: backward goes on at once, as under plain DDP.
            assert future.done() and not nccl.finished.is_set()
            assert future.value().tolist() == [0.5] * n  # averaged: scaled by 1/world
    assert nccl.launched == [me] * 4  # on the autograd thread, in bucket order
    # Nothing marked a gradient ready, waited for an event, or synchronized a stream, and the
    # only events recorded on the autograd thread are each message's start and end marks.
    assert gpu.marks == 0 and gpu.stream.waited_events == 0 and gpu.stream.synchronized == 0
    assert me not in gpu.sides
    assert gpu.recorded.count(me) == 2 * 4
    nccl.finish()  # the GPU gets there
    assert engine.settle(10)
    # Each message timed on the GPU: from its launch to the all-reduce's end.
    got = [(r.nbytes, r.seconds, r.timer) for r in recorder.records()]
    assert got == [(32, 0.003, "cuda"), (16, 0.005, "cuda")] * 2
    assert [r.iteration for r in recorder.iterations()] == [1, 2]
    # The completing thread waited for NCCL off the step; it synchronized no stream for it.
    assert gpu.stream.synchronized == 0
    engine.close()


def test_with_nccls_profiler_a_lane_message_takes_a_ticket_beside_its_events() -> None:
    gpu = PlayedGpu()
    nccl = PlayedNccl(gpu, took_ms=[3.0])
    clock = SimpleNamespace(tickets=[])

    def expect(nbytes: int, route: str) -> Any:
        ticket = SimpleNamespace(nbytes=nbytes, route=route)
        clock.tickets.append(ticket)
        return ticket

    clock.expect = expect
    clock.seconds = lambda ticket, timeout_s=None: 0.007
    engine = engine_on(gpu, nccl, clock=clock)
    recorder = Recorder()
    engine.subscribe(recorder.record)
    assert engine.submit(torch.ones(4), is_last=True).done()
    assert [(t.nbytes, t.route) for t in clock.tickets] == [(16, "lane")]
    # Its start and end marks, on the autograd thread (the callback runs at launch on NCCL).
    assert gpu.recorded.count(threading.current_thread().name) == 2
    nccl.finish()
    assert engine.settle(10)
    assert [(r.seconds, r.timer, r.kernel_s) for r in recorder.records()] == [
        (0.003, "cuda", 0.007)
    ]
    assert gpu.stream.synchronized == 0
    engine.close()


class PythonDriven(AllReduceAlgorithm):
    """An algorithm autotune drives (tree, ring, ...), on the played GPU: it has finished when
    `start` returns, on the side stream."""

    name = "t"

    def connect(self, group, device, *, dedicated=True):  # type: ignore[no-untyped-def]
        return SimpleNamespace(size=2, backend="nccl", traffic=None)

    def _run(self, buf: torch.Tensor, comm: Comm, segment_elems: int) -> None:
        pass

    def _start(self, buf: torch.Tensor, comm: Any, segment_elems: int) -> Pending:
        return Pending()


@pytest.mark.parametrize("what", ["python-driven", "cut"])
def test_off_the_lane_a_cuda_message_orders_streams_and_completes_on_the_finish_thread(
    what: str,
) -> None:
    # What the hook adds where it drives the message (docs/HOOK.md): the gradient marked ready,
    # the side stream waiting for it, the side stream synchronized, the future completed by
    # the completing thread.
    gpu = PlayedGpu()
    nccl = PlayedNccl(gpu, took_ms=[3.0])
    if what == "cut":  # a bucket cut into two messages, each NCCL's
        engine = engine_on(gpu, nccl, fusion_bytes=8)
    else:
        engine = engine_on(gpu, PythonDriven())  # the plan's "a" is this algorithm
    future = engine.submit(torch.ones(4), is_last=True)
    if what == "cut":
        assert not future.done()  # the completing thread waits for NCCL first
        nccl.finish()
    future.wait()
    assert engine.settle(10)
    assert gpu.marks == 1 and gpu.stream.waited_events == 1
    # Timed on the GPU, by events on the side stream: nothing synchronizes it to time them.
    assert gpu.stream.synchronized == 0
    assert "autotune-finish" in gpu.sides
    engine.close()


def test_a_world_of_one_completes_its_bucket_at_once() -> None:
    gpu = PlayedGpu()
    nccl = PlayedNccl(gpu, took_ms=[3.0], size=1)
    engine = engine_on(gpu, nccl, world_size=1)
    future = engine.submit(torch.ones(4), is_last=True)
    assert future.done() and future.value().tolist() == [1.0] * 4
    assert engine.settle(10)
    assert gpu.stream.synchronized == 0 and gpu.marks == 0
    engine.close()


@pytest.mark.parametrize("mixed", ["a class on a Python-driven algorithm", "fusion on"])
def test_on_nccl_the_lane_is_all_or_nothing(mixed: str) -> None:
    # Two NCCL communicators in use at once may hang each other: where any message of the plan
    # runs on autotune's groups, every message does, in bucket order, as before the lane.
    gpu = PlayedGpu()
    nccl = PlayedNccl(gpu, took_ms=[3.0])
    engine = engine_on(gpu, {"a": nccl, "t": PythonDriven()})
    if mixed == "fusion on":
        engine.fusion_bytes = 1 << 20
    else:
        engine.plan.set(size_class(1 << 20), Choice("t"))  # a class no bucket here is in
    future = engine.submit(torch.ones(8), is_last=True)  # 32 bytes: NCCL's all-reduce
    assert not future.done()  # the completing thread completes it, once NCCL has finished
    nccl.finish()
    future.wait()
    assert engine.settle(10)
    assert gpu.marks == 1 and gpu.stream.waited_events == 1 and gpu.stream.synchronized == 0
    # The plan back to the backend's own everywhere (at an iteration end, as the tuner does):
    # the lane again.
    engine.fusion_bytes = 0
    engine.plan.replace({})
    assert engine.submit(torch.ones(8), is_last=True).done()
    assert gpu.marks == 1
    assert engine.settle(10)
    engine.close()


def test_the_steps_clock_reads_where_each_iteration_ended_on_the_gpu() -> None:
    # Iteration i's gradient is ready at 10 i ms on the GPU; its one all-reduce takes 3 or 5 ms
    # in turn. The step between two iteration ends is the GPU's: 10 ms, plus this iteration's
    # all-reduce, less the last one's. The mark used to be recorded on the completing thread
    # after the host had waited for the all-reduce: it read when that thread got there.
    gpu = PlayedGpu()
    nccl = PlayedNccl(gpu, took_ms=[3.0, 5.0])
    nccl.finish()  # the host's waits return: the played GPU has done each all-reduce
    engine = engine_on(gpu, nccl)
    steps: list[tuple[int | None, float]] = []
    engine.subscribe(
        lambda e: (
            steps.append((e.step_of, round(e.step_s * 1000, 6)))
            if isinstance(e, IterationEnd) and e.step_s is not None
            else None
        )
    )
    for i in range(6):
        gpu.stream_at = 10.0 * i
        engine.submit(torch.ones(4), is_last=True)
        gpu.stream_at = 10.0 * i + 9.5  # the GPU goes on with the next forward
        assert engine.settle(10)
    assert steps == [(2, 12.0), (3, 8.0), (4, 12.0)]  # read LAG iterations late
    engine.close()


def test_a_size_class_is_timed_on_one_clock_whatever_runs_it() -> None:
    # The same class on the lane (NCCL's all-reduce) one iteration, on a Python-driven schedule
    # the next: both on the GPU's clock. (The lane was timed by CUDA events, or NCCL's kernel
    # time, and the schedule by the host: the tuner compared the two.)
    gpu = PlayedGpu()
    nccl = PlayedNccl(gpu, took_ms=[3.0])
    nccl.finish()
    engine = engine_on(gpu, {"a": nccl, "t": PythonDriven()})
    recorder = Recorder()
    engine.subscribe(recorder.record)
    engine.submit(torch.ones(4), is_last=True)
    assert engine.settle(10)
    engine.plan.set(size_class(16), Choice("t"))  # between iterations, as the tuner switches
    engine.submit(torch.ones(4), is_last=True)
    assert engine.settle(10)
    got = [(r.algorithm, r.size_class, r.timer) for r in recorder.records()]
    assert got == [("a", size_class(16), "cuda"), ("t", size_class(16), "cuda")]
    engine.close()
